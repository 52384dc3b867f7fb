"""generate_tfrecords: archive -> TFRecords, through the Python API and the real command line."""

import glob
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar_archives import (ARCHIVE_NAME, ArchiveServer, breaks_first_request_after,
                            expected_subsets, python2_pickle, read_tfrecords, write_archive)
from cli_helpers import REPO_ROOT, assert_one_line_error, cli_env, run_module
from cifar10_estimator import cifar10, files, generate_tfrecords
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.data import download
from cifar10_estimator.data import image_folders
from cifar10_estimator.data import tfrecord_format

MODULE = "cifar10_estimator.generate_tfrecords"
TINY_COUNTS = {"train": 96, "validation": 24, "eval": 24}  # 24 images per batch


def tf_train_example(image, label):
    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }))


def assert_outputs_hold(data_dir, batches):
    """data_dir holds the three TFRecords with exactly the batches' pixels, labels and order."""
    for subset, (images, labels) in expected_subsets(batches).items():
        path = tfrecord_format.tfrecord_path(str(data_dir), subset)
        read_images, read_labels = read_tfrecords(path)
        np.testing.assert_array_equal(read_images, images)
        np.testing.assert_array_equal(read_labels, labels)
    assert tfrecord_format.read_num_examples(str(data_dir)) == TINY_COUNTS


def output_files(data_dir):
    """Names in data_dir that a reader could take for outputs (TFRecords, metadata, temporaries)."""
    return sorted(name for name in os.listdir(str(data_dir))
                  if "tfrecords" in name or name == tfrecord_format.METADATA_FILENAME)


def tfrecords_contents(data_dir):
    return {path: open(path, "rb").read() for path in glob.glob(str(data_dir / "*.tfrecords"))}


@pytest.fixture
def data_dir(tmp_path, cifar_archive):
    """A data dir holding the official-format archive of cifar_batches, and nothing else."""
    archive, _ = cifar_archive
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(str(archive), str(data_dir / ARCHIVE_NAME))
    return data_dir


def run_main(argv):
    """The command's exit status when run in this process (stdout/stderr go to capsys)."""
    return run_command(generate_tfrecords.main, [str(arg) for arg in argv],
                       prog="generate_tfrecords")


def error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("generate_tfrecords: error:")]


def closed_port_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d/%s" % (probe.getsockname()[1], ARCHIVE_NAME)


@pytest.fixture
def no_retry_delay(monkeypatch):
    monkeypatch.setattr(download.time, "sleep", lambda secs: None)


# --- serialization ------------------------------------------------------------------------

def test_serialized_examples_are_those_tf_train_example_writes():
    rng = np.random.RandomState(5)
    images = rng.randint(0, 256, size=(20, 3072)).astype(np.uint8)
    labels = np.array([0, 9, 127] + list(rng.randint(0, 10, size=17)))

    records = tfrecord_format.serialize_examples(images, labels)

    features = {"image": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.int64)}
    for record, image, label in zip(records, images, labels):
        reference = tf_train_example(image, label)
        assert record.tobytes() == reference.SerializeToString(deterministic=True)
        ours = tf.io.parse_single_example(record.tobytes(), features)
        theirs = tf.io.parse_single_example(reference.SerializeToString(), features)
        assert ours["image"].numpy() == theirs["image"].numpy() == image.tobytes()
        assert ours["label"].numpy() == theirs["label"].numpy() == label


@pytest.mark.parametrize("images, labels, problem", [
    (np.zeros((2, 3072), np.uint8), [0, 128], "labels must be in 0..127"),
    (np.zeros((2, 3072), np.uint8), [-1, 0], "labels must be in 0..127"),
    (np.zeros((2, 3072), np.uint8), [0], "labels must be 2 integers"),
    (np.zeros((2, 3072), np.uint8), [0.0, 1.0], "labels must be 2 integers"),
    (np.zeros((2, 3071), np.uint8), [0, 1], r"images must be uint8 \[N, 3072\]"),
    (np.zeros((2, 3072), np.int32), [0, 1], r"images must be uint8 \[N, 3072\]"),
])
def test_serialize_rejects_what_it_cannot_encode(images, labels, problem):
    with pytest.raises(ValueError, match=problem):
        tfrecord_format.serialize_examples(images, labels)


def test_write_tfrecords_from_arrays(tmp_path):
    rng = np.random.RandomState(6)
    images = rng.randint(0, 256, size=(5000, 3072)).astype(np.uint8)  # more than one chunk
    labels = rng.randint(0, 10, size=5000)
    path = str(tmp_path / "arrays.tfrecords")

    assert tfrecord_format.write_tfrecords(path, images, labels) == 5000

    read_images, read_labels = read_tfrecords(path)
    np.testing.assert_array_equal(read_images, images)
    np.testing.assert_array_equal(read_labels, labels)
    assert os.listdir(str(tmp_path)) == ["arrays.tfrecords"]


# --- conversion through the API -----------------------------------------------------------

def test_convert_round_trips_every_pixel_label_and_order(data_dir, cifar_batches):

    counts = generate_tfrecords.convert(str(data_dir), url=closed_port_url(), md5=None)

    assert counts == TINY_COUNTS
    assert_outputs_hold(data_dir, cifar_batches)
    assert output_files(data_dir) == [tfrecord_format.METADATA_FILENAME, "eval.tfrecords",
                                      "train.tfrecords", "validation.tfrecords"]


# --- the command line ---------------------------------------------------------------------

def test_cli_downloads_verifies_extracts_and_converts(
        tmp_path, http_root, cifar_archive, cifar_batches):
    archive, md5 = cifar_archive
    served, base_url = http_root
    shutil.copy(str(archive), str(served / ARCHIVE_NAME))
    data_dir = tmp_path / "new" / "data"

    result = run_module(MODULE, ["--data-dir", data_dir, "--url", base_url + "/" + ARCHIVE_NAME,
                                 "--md5", md5.upper()], timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "downloading %s/%s" % (base_url, ARCHIVE_NAME) in result.stderr
    assert "100%" in result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        [subset, str(count), "examples", tfrecord_format.tfrecord_path(str(data_dir), subset)]
        for subset, count in TINY_COUNTS.items()
    ] + [["counts", "in", tfrecord_format.metadata_path(str(data_dir))]]
    with open(tfrecord_format.metadata_path(str(data_dir))) as stream:
        assert json.load(stream)["num_examples"] == TINY_COUNTS
    assert download.file_md5(str(data_dir / ARCHIVE_NAME)) == md5
    assert_outputs_hold(data_dir, cifar_batches)


def test_cli_without_data_dir_is_a_usage_error():
    result = run_module(MODULE, [], timeout=120)
    assert_one_line_error(result, 2, "generate_tfrecords: error:", "--data-dir")


def test_cli_help_describes_the_sources_and_overrides(capsys):
    with pytest.raises(SystemExit) as exit_info:
        generate_tfrecords.main(["--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for fragment in ["--data-dir DIR", "--url", "$CIFAR10_DOWNLOAD_URL",
                     cifar10_archive.OFFICIAL_URL, "--md5 HEX|none", cifar10_archive.OFFICIAL_MD5,
                     "'none' skips the check",
                     "--download-attempts", "place the archive there yourself",
                     "cifar-10-batches-py/", "train.tfrecords", "validation.tfrecords",
                     "eval.tfrecords", tfrecord_format.METADATA_FILENAME,
                     "--image-dir IMAGES", "IMAGES/train/<class>/ and IMAGES/test/<class>/",
                     "test becomes eval.tfrecords", ", ".join(cifar10.CLASS_NAMES),
                     ".png/.jpg/.jpeg", "'.' (.DS_Store, ...) are skipped",
                     "grayscale is expanded to RGB", "alpha channel dropped",
                     "seed %d" % image_folders.TRAIN_ORDER_SEED,
                     "--validation-examples N", "the last N training images validate",
                     "N=0 trains on all of them and writes no validation.tfrecords"]:
        assert fragment in help_text, fragment


@pytest.mark.parametrize("argv, fragment", [
    (["--md5", "abc"], "expected 32 hex digits or 'none'"),
    (["--download-attempts", "0"], "expected a positive integer"),
])
def test_cli_rejects_bad_flag_values(tmp_path, capsys, argv, fragment):
    assert run_main(["--data-dir", tmp_path] + argv) == 2
    [line] = error_lines(capsys)
    assert fragment in line


def test_download_failing_its_checksum_is_removed(tmp_path, cifar_archive, capsys):
    archive, md5 = cifar_archive
    data_dir = tmp_path / "data"
    with ArchiveServer(archive.read_bytes()) as server:
        status = run_main(["--data-dir", data_dir, "--url", server.url])

    assert status == 1
    [line] = error_lines(capsys)
    assert "has MD5 %s, expected %s; removed it" % (md5, cifar10_archive.OFFICIAL_MD5) in line
    assert "--md5 none" in line
    assert os.listdir(str(data_dir)) == []


def test_user_placed_archive_of_other_data_is_converted_with_a_warning(
        tmp_path, cifar_archive, cifar_batches, capsys):
    archive, md5 = cifar_archive
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(str(archive), str(data_dir / ARCHIVE_NAME))
    with ArchiveServer(b"must not be fetched") as server:
        status = run_main(["--data-dir", data_dir, "--url", server.url])

    assert status == 0
    assert server.range_headers == []
    warning = "warning: %s has MD5 %s, not %s" % (data_dir / ARCHIVE_NAME, md5,
                                                   cifar10_archive.OFFICIAL_MD5)
    assert warning in capsys.readouterr().err
    assert_outputs_hold(data_dir, cifar_batches)


def test_extracted_batches_are_used_without_downloading(tmp_path, cifar_archive, cifar_batches):
    archive, _ = cifar_archive
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    cifar10_archive.extract_batches(str(archive), str(data_dir))
    with ArchiveServer(b"must not be fetched") as server:
        assert run_main(["--data-dir", data_dir, "--url", server.url]) == 0

    assert server.range_headers == []
    assert not (data_dir / ARCHIVE_NAME).exists()
    assert_outputs_hold(data_dir, cifar_batches)


def test_environment_variable_overrides_the_download_url(tmp_path, cifar_archive, monkeypatch):
    archive, md5 = cifar_archive
    data_dir = tmp_path / "data"
    with ArchiveServer(archive.read_bytes()) as server:
        monkeypatch.setenv("CIFAR10_DOWNLOAD_URL", server.url)
        assert run_main(["--data-dir", data_dir, "--md5", md5]) == 0

    assert server.range_headers == [None]
    assert tfrecord_format.read_num_examples(str(data_dir)) == TINY_COUNTS


def test_broken_download_is_resumed(tmp_path, cifar_archive, cifar_batches, no_retry_delay):
    archive, _ = cifar_archive
    data_dir = tmp_path / "data"
    payload = archive.read_bytes()
    with ArchiveServer(payload, bytes_before_break=breaks_first_request_after(100000)) as server:
        assert run_main(["--data-dir", data_dir, "--url", server.url, "--md5", "none"]) == 0

    assert server.range_headers == [None, "bytes=100000-"]
    assert_outputs_hold(data_dir, cifar_batches)


def test_download_that_always_breaks_fails_cleanly_and_a_rerun_resumes(
        tmp_path, cifar_archive, cifar_batches, capsys, no_retry_delay):
    archive, md5 = cifar_archive
    data_dir = tmp_path / "data"
    with ArchiveServer(archive.read_bytes(), bytes_before_break=lambda index: 1000) as server:
        status = run_main(["--data-dir", data_dir, "--url", server.url, "--md5", md5,
                           "--download-attempts", "2"])

    assert status == 1
    [line] = error_lines(capsys)
    assert "cannot download %s: connection closed after" % server.url in line
    assert ("(gave up after 2 attempts); place %s in %s or pass --url"
            % (ARCHIVE_NAME, data_dir)) in line
    assert sorted(os.listdir(str(data_dir))) == [ARCHIVE_NAME + ".part"]

    with ArchiveServer(archive.read_bytes()) as server:
        assert run_main(["--data-dir", data_dir, "--url", server.url, "--md5", md5]) == 0
    assert server.range_headers == ["bytes=2000-"]
    assert_outputs_hold(data_dir, cifar_batches)


def test_unreachable_server_names_the_url_and_the_offline_fix(tmp_path, capsys):
    url = closed_port_url()
    assert run_main(["--data-dir", tmp_path, "--url", url, "--download-attempts", "1"]) == 1
    [line] = error_lines(capsys)
    assert line.startswith("generate_tfrecords: error: cannot download %s: " % url)
    assert line.endswith("place %s in %s or pass --url" % (ARCHIVE_NAME, tmp_path))


def test_truncated_user_archive_is_an_error(tmp_path, cifar_archive, capsys):
    archive, _ = cifar_archive
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / ARCHIVE_NAME).write_bytes(archive.read_bytes()[:50000])

    assert run_main(["--data-dir", data_dir, "--md5", "none"]) == 1
    [line] = error_lines(capsys)
    assert "cannot read archive %s" % (data_dir / ARCHIVE_NAME) in line
    assert output_files(data_dir) == []


def test_failure_while_writing_leaves_nothing_finished_and_a_rerun_works(
        tmp_path, cifar_batches, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    bad_batches = dict(cifar_batches)
    bad_batches["test_batch"] = dict(cifar_batches["test_batch"])
    bad_batches["test_batch"][b"labels"] = cifar_batches["test_batch"][b"labels"][:-1] + [10]

    write_archive(str(data_dir / ARCHIVE_NAME), bad_batches)
    assert run_main(["--data-dir", data_dir, "--md5", "none"]) == 1
    [line] = error_lines(capsys)
    assert "%s is not a CIFAR-10 batch: label 10 of image 23" % (
        data_dir / "cifar-10-batches-py" / "test_batch") in line
    assert output_files(data_dir) == []

    write_archive(str(data_dir / ARCHIVE_NAME), cifar_batches)
    assert run_main(["--data-dir", data_dir, "--md5", "none"]) == 0
    assert_outputs_hold(data_dir, cifar_batches)
    finished = tfrecords_contents(data_dir)

    # A failed run over a finished set leaves that set as it was.
    write_archive(str(data_dir / ARCHIVE_NAME), bad_batches)
    assert run_main(["--data-dir", data_dir, "--md5", "none"]) == 1
    assert tfrecords_contents(data_dir) == finished
    assert tfrecord_format.read_num_examples(str(data_dir)) == TINY_COUNTS
    assert len(output_files(data_dir)) == 4


def test_malicious_batch_in_the_archive_is_refused(tmp_path, cifar_batches, capsys):
    class WritesMarker:
        def __reduce__(self):
            return os.system, ("touch '%s'" % marker,)

    marker = tmp_path / "marker"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    cifar_batches["data_batch_2"] = python2_pickle({b"data": WritesMarker(), b"labels": []})
    write_archive(str(data_dir / ARCHIVE_NAME), cifar_batches)

    assert run_main(["--data-dir", data_dir, "--md5", "none"]) == 1
    [line] = error_lines(capsys)
    assert str(data_dir / "cifar-10-batches-py" / "data_batch_2") in line
    assert "refused to unpickle global %s.system" % os.system.__module__ in line
    assert not marker.exists()
    assert output_files(data_dir) == []


def test_leftovers_of_a_killed_run_are_removed_by_the_next(data_dir, cifar_batches):
    # What runs killed with SIGKILL leave: partial outputs under their temporary names,
    # and staged batches.
    leftovers = [pathlib.Path(files.temporary_path(str(data_dir / name))) for name in (
        "train.tfrecords", "eval.tfrecords", tfrecord_format.METADATA_FILENAME)]
    for path in leftovers:
        path.write_bytes(b"partial")
    staged = data_dir / ".cifar-10-batches-py.q1w2e3"
    staged.mkdir()
    (staged / "data_batch_1").write_bytes(b"partial")
    unrelated = data_dir / ".my-notes.tmp"
    unrelated.write_bytes(b"mine")

    generate_tfrecords.convert(str(data_dir), md5=None)

    assert_outputs_hold(data_dir, cifar_batches)
    assert not any(path.exists() for path in leftovers + [staged])
    assert unrelated.read_bytes() == b"mine"


# A conversion in a child process, killed (SIGKILL) the moment it would rename the
# temporary file of argv[1] into place: after the file is written whole, before it counts.
KILLED_AT_A_RENAME = """
import os, runpy, signal, sys
import tensorflow as tf

killed_at = sys.argv.pop(1)

def killed_at_rename(rename):
    def renamed(source, target, *args, **kwargs):
        if os.path.basename(str(target)) == killed_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(source, target, *args, **kwargs)
    return renamed

os.replace = killed_at_rename(os.replace)
tf.io.gfile.rename = killed_at_rename(tf.io.gfile.rename)
runpy.run_module("cifar10_estimator.generate_tfrecords", run_name="__main__")
"""


@pytest.mark.parametrize("killed_at", ["train.tfrecords", tfrecord_format.METADATA_FILENAME])
def test_a_conversion_killed_while_writing_leaves_nothing_finished_looking_and_the_next_cleans_up(
        data_dir, cifar_batches, killed_at):
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_A_RENAME, killed_at, "--data-dir", str(data_dir),
         "--md5", "none"], cwd=REPO_ROOT, env=cli_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # Without its metadata file no data dir is finished: the trainer refuses it.
    assert not (data_dir / tfrecord_format.METADATA_FILENAME).exists()

    generate_tfrecords.convert(str(data_dir), md5=None)

    assert_outputs_hold(data_dir, cifar_batches)
    assert sorted(os.listdir(str(data_dir))) == sorted(
        [ARCHIVE_NAME, cifar10_archive.BATCHES_DIRNAME, tfrecord_format.METADATA_FILENAME,
         "train.tfrecords", "validation.tfrecords", "eval.tfrecords"])


# --- the validation split -----------------------------------------------------------------

def training_pool(batches):
    """data_batch_1..5 concatenated: the training examples validation is split off from."""
    subsets = expected_subsets(batches)
    return tuple(np.concatenate([subsets["train"][i], subsets["validation"][i]]) for i in (0, 1))


def test_validation_examples_are_the_last_of_data_batch_1_to_5(
        data_dir, cifar_batches, capsys):

    assert run_main(["--data-dir", data_dir, "--md5", "none", "--validation-examples", 30]) == 0

    images, labels = training_pool(cifar_batches)  # 5 x 24: validation starts inside batch 4
    for subset, part in (("train", slice(None, 90)), ("validation", slice(90, None))):
        read_images, read_labels = read_tfrecords(tfrecord_format.tfrecord_path(str(data_dir),
                                                                               subset))
        np.testing.assert_array_equal(read_images, images[part])
        np.testing.assert_array_equal(read_labels, labels[part])
    assert tfrecord_format.read_num_examples(str(data_dir)) == {
        "train": 90, "validation": 30, "eval": 24}
    assert "validation     30 examples" in capsys.readouterr().out


def test_cli_no_validation_examples_trains_on_all_and_removes_the_old_validation_set(
        data_dir, cifar_batches):
    assert run_main(["--data-dir", data_dir, "--md5", "none"]) == 0
    assert tfrecord_format.has_subset(str(data_dir), "validation")

    result = run_module(MODULE, ["--data-dir", data_dir, "--md5", "none",
                                 "--validation-examples", "0"], timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["train", "120"], ["eval", "24"], ["counts", "in"]]
    assert output_files(data_dir) == [tfrecord_format.METADATA_FILENAME, "eval.tfrecords",
                                      "train.tfrecords"]
    assert tfrecord_format.read_num_examples(str(data_dir)) == {"train": 120, "eval": 24}
    assert not tfrecord_format.has_subset(str(data_dir), "validation")
    images, labels = read_tfrecords(tfrecord_format.tfrecord_path(str(data_dir), "train"))
    np.testing.assert_array_equal(images, training_pool(cifar_batches)[0])
    np.testing.assert_array_equal(labels, training_pool(cifar_batches)[1])


@pytest.mark.parametrize("value, fragment", [
    (120, "--validation-examples 120 is out of range"),
    (-3, "expected 0 or a positive integer, got '-3'"),
])
def test_validation_examples_leaving_no_training_is_a_usage_error(
        data_dir, capsys, value, fragment):

    assert run_main(["--data-dir", data_dir, "--md5", "none", "--validation-examples", value]) == 2

    [line] = error_lines(capsys)
    assert fragment in line
    assert output_files(data_dir) == []


def test_has_subset_follows_the_metadata_or_else_the_files(tmp_path, tiny_data_dir):
    assert all(tfrecord_format.has_subset(str(tiny_data_dir), subset)
               for subset in cifar10.SUBSETS)
    # Written by the original tutorial: no metadata, only the files say what is there.
    tfrecord_format.write_tfrecords(tfrecord_format.tfrecord_path(str(tmp_path), "train"),
                                    np.zeros((1, 3072), np.uint8), [0])
    assert tfrecord_format.has_subset(str(tmp_path), "train")
    assert not tfrecord_format.has_subset(str(tmp_path), "validation")
    with pytest.raises(ValueError):
        tfrecord_format.has_subset(str(tmp_path), "test")
