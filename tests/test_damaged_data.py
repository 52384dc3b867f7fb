"""TFRecords damaged after conversion: each command that reads them ends with one line.

The trainer, a cluster's evaluator task and serving.evaluate read each file once before
they build a graph; a file that fails its checksums, was cut short, holds another count
than the metadata, or holds records that are not CIFAR-10 examples ends the command with
one line naming the file, the fault and the command that regenerates it, and nothing is
written to the job dir.
"""

import json
import os
import shutil

import numpy as np
import pytest

import cifar_archives
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.run import job_dir_lock
from cli_helpers import assert_one_line_error, run_module

pytest_plugins = ["trained_job"]

TRAINER = "cifar10_estimator.main"
EVALUATE = "cifar10_estimator.serving.evaluate"
# A tiny record: an Example of a 3072-byte image and a one-byte label, with its framing.
FRAMED_RECORD_NUM_BYTES = tfrecord_format.RECORD_NUM_BYTES + 16


def trainer_args(data_dir, job_dir):
    return ["--data-dir", data_dir, "--job-dir", job_dir, "--num-gpus", "0",
            "--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8",
            "--train-steps", "5"]


def overwrite_16_bytes_in_the_middle(path):
    """Overwrite 16 bytes inside the image of the middle record; returns where it starts."""
    size = os.path.getsize(path)
    with open(path, "r+b") as stream:
        stream.seek(size // 2 + 100)
        stream.write(b"\xff" * 16)
    return size // 2 + 100 - (size // 2 + 100) % FRAMED_RECORD_NUM_BYTES


def cut(path, size):
    with open(path, "r+b") as stream:
        stream.truncate(size)


def damage(data_dir, subset, fault):
    """Damage `subset`'s file in data_dir; returns the words the error line must hold."""
    path = tfrecord_format.tfrecord_path(str(data_dir), subset)
    size = os.path.getsize(path)
    num_records = size // FRAMED_RECORD_NUM_BYTES
    if fault == "corrupted":
        return "%s: corrupted record at byte %d" % (path, overwrite_16_bytes_in_the_middle(path))
    if fault == "cut to half":  # at a record's boundary: only the count tells
        cut(path, size // 2)
        return "%s: holds %d records, the metadata says %d" % (path, num_records // 2, num_records)
    if fault == "cut inside a record":
        cut(path, size // 2 + 100)
        return "%s: truncated record at byte %d" % (path, size // 2)
    if fault == "count":
        metadata_path = tfrecord_format.metadata_path(str(data_dir))
        with open(metadata_path) as stream:
            metadata = json.load(stream)
        metadata["num_examples"][subset] = num_records + 8
        with open(metadata_path, "w") as stream:
            json.dump(metadata, stream)
        return "%s: holds %d records, the metadata says %d" % (path, num_records, num_records + 8)
    if fault == "not an example":  # images of 3000 bytes, the rest as it should be
        cifar_archives.write_tfrecords_the_original_way(str(data_dir), {subset: (
            np.zeros((num_records, 3000), np.uint8), np.zeros(num_records, np.int64))})
        return "%s: record 0 (at byte 0) is not a CIFAR-10 example" % path
    raise ValueError(fault)


@pytest.fixture
def data_copy(tiny_data_dir, tmp_path):
    """A copy of the tiny data set, for a test to damage."""
    data_dir = tmp_path / "data"
    shutil.copytree(str(tiny_data_dir), str(data_dir))
    return data_dir


def regenerate_hint(data_dir):
    return "regenerate the data with: python -m cifar10_estimator.generate_tfrecords " \
           "--data-dir %s" % data_dir


# Every fault in every subset, told by the check the commands run before they build a graph.
FAULTS_BY_SUBSET = [
    ("train", "corrupted"), ("validation", "corrupted"), ("eval", "corrupted"),
    ("train", "cut to half"), ("validation", "cut to half"), ("eval", "cut to half"),
    ("validation", "cut inside a record"), ("train", "count"), ("eval", "not an example"),
]


@pytest.mark.parametrize("subset, fault", FAULTS_BY_SUBSET)
def test_the_check_names_the_file_the_fault_and_the_command_that_regenerates_it(
        data_copy, subset, fault):
    words = damage(data_copy, subset, fault)
    with pytest.raises(Cifar10EstimatorError) as raised:
        tfrecord_format.check_tfrecords(str(data_copy), subset)
    message = str(raised.value)
    assert words in message and regenerate_hint(data_copy) in message, message


# The trainer checks each subset's file before it writes anything: one fault per subset
# (each fault in every subset is the check's, above), each from another branch of it.
@pytest.mark.parametrize("subset, fault", [
    ("train", "corrupted"), ("validation", "cut inside a record"), ("eval", "not an example"),
])
def test_the_trainer_names_a_damaged_file_and_writes_nothing(data_copy, tmp_path, subset,
                                                             fault):
    words = damage(data_copy, subset, fault)
    job_dir = tmp_path / "job"
    result = run_module(TRAINER, trainer_args(data_copy, job_dir), timeout=120)
    assert_one_line_error(result, 1, "cifar10_estimator.main: error: " + words,
                          regenerate_hint(data_copy))
    # No checkpoint, summary, export or hparams.json: the job dir holds just its lock.
    assert os.listdir(str(job_dir)) == [job_dir_lock.LOCK_FILENAME]


def test_the_evaluator_task_checks_the_files_it_evaluates(data_copy, tmp_path):
    words = damage(data_copy, "validation", "cut to half")
    tf_config = json.dumps({"cluster": {"chief": ["127.0.0.1:1"]},
                            "task": {"type": "evaluator", "index": 0}})
    result = run_module(TRAINER, trainer_args(data_copy, tmp_path / "job"),
                        env={"TF_CONFIG": tf_config}, timeout=120)
    assert_one_line_error(result, 1, words, regenerate_hint(data_copy))


@pytest.mark.slow
@pytest.mark.parametrize("subset, fault", [("eval", "corrupted"), ("validation", "cut to half")])
def test_evaluate_names_a_damaged_file_instead_of_a_wrong_accuracy(trained_job, data_copy,
                                                                    subset, fault):
    words = damage(data_copy, subset, fault)
    result = run_module(EVALUATE, ["--job-dir", trained_job.job_dir, "--data-dir", data_copy,
                                   "--subset", subset])
    assert_one_line_error(result, 1, "cifar10_estimator.serving.evaluate: error: " + words,
                          regenerate_hint(data_copy))
    assert result.stdout == ""


# The check itself, in-process.

def test_files_written_either_way_pass(tiny_data_dir, tmp_path):
    # The tiny data set is written one tf.train.Example at a time, as the original did.
    for subset in ("train", "validation", "eval"):
        tfrecord_format.check_tfrecords(str(tiny_data_dir), subset)
    images = np.random.RandomState(0).randint(0, 256, (5, 3072)).astype(np.uint8)
    tfrecord_format.write_tfrecords(tfrecord_format.tfrecord_path(str(tmp_path), "eval"),
                                    images, np.arange(5))
    tfrecord_format.check_tfrecords(str(tmp_path), "eval")


@pytest.mark.parametrize("write", ["as converted", "the original way"])
def test_a_label_beyond_the_ten_classes_is_not_an_example(tmp_path, write):
    images = np.zeros((3, 3072), np.uint8)
    labels = np.array([0, 9, 10])
    if write == "as converted":
        tfrecord_format.write_tfrecords(
            tfrecord_format.tfrecord_path(str(tmp_path), "eval"), images, labels)
    else:
        cifar_archives.write_tfrecords_the_original_way(
            str(tmp_path), {"eval": (images, labels)}, write_metadata=False)
    with pytest.raises(Cifar10EstimatorError, match=r"record 2 \(at byte %d\) is not a "
                       "CIFAR-10 example" % (2 * FRAMED_RECORD_NUM_BYTES)):
        tfrecord_format.check_tfrecords(str(tmp_path), "eval")


def test_without_metadata_a_cut_inside_a_record_is_still_told(tmp_path):
    images = np.zeros((4, 3072), np.uint8)
    cifar_archives.write_tfrecords_the_original_way(
        str(tmp_path), {"eval": (images, np.zeros(4, np.int64))}, write_metadata=False)
    path = tfrecord_format.tfrecord_path(str(tmp_path), "eval")
    tfrecord_format.check_tfrecords(str(tmp_path), "eval")
    cut(path, 3 * FRAMED_RECORD_NUM_BYTES + 10)
    with pytest.raises(Cifar10EstimatorError,
                       match="truncated record at byte %d" % (3 * FRAMED_RECORD_NUM_BYTES)):
        tfrecord_format.check_tfrecords(str(tmp_path), "eval")
