"""The offline path: a synthetic archive in the official format goes through the real converter."""

import pickle
import pickletools
import tarfile

from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.data import synthetic_archive
from cifar10_estimator.data import tfrecord_format
from cli_helpers import assert_one_line_error, run_module


def test_batches_are_pickled_as_python_2_wrote_them():
    batch = synthetic_archive.random_batch(3, seed=5, batch_label="training batch 1 of 5")
    payload = synthetic_archive.python2_pickle(batch)
    opcodes = [op.name for op, _, _ in pickletools.genops(payload)]
    assert opcodes[0] == "PROTO" and payload[1] == 2
    globals_used = [arg for op, arg, _ in pickletools.genops(payload) if op.name == "GLOBAL"]
    assert "_codecs encode" not in globals_used  # how Python 3 writes bytes, not Python 2
    assert "numpy.core.multiarray _reconstruct" in globals_used
    loaded = pickle.loads(payload, encoding="bytes")
    assert set(loaded) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert loaded[b"data"].dtype.name == "uint8" and loaded[b"data"].shape == (3, 3072)
    assert (loaded[b"data"] == batch[b"data"]).all() and loaded[b"labels"] == batch[b"labels"]


def test_cli_archive_converts_with_a_warning_and_the_right_counts(tmp_path):
    archive = tmp_path / "data" / cifar10_archive.ARCHIVE_FILENAME
    made = run_module("cifar10_estimator.data.synthetic_archive",
                      ["--output", archive, "--images-per-batch", "7"], timeout=120)
    assert made.returncode == 0, made.stderr
    with tarfile.open(str(archive)) as opened:
        names = set(opened.getnames())
    assert {"%s/%s" % (cifar10_archive.BATCHES_DIRNAME, name)
            for name in cifar10_archive.BATCH_NAMES} <= names

    converted = run_module("cifar10_estimator.generate_tfrecords",
                           ["--data-dir", archive.parent], timeout=300)
    assert converted.returncode == 0, converted.stderr
    assert "warning" in converted.stderr and cifar10_archive.OFFICIAL_MD5 in converted.stderr
    assert tfrecord_format.read_num_examples(str(archive.parent)) == {
        "train": 28, "validation": 7, "eval": 7}


def test_non_positive_size_is_a_usage_error(tmp_path):
    result = run_module("cifar10_estimator.data.synthetic_archive",
                        ["--output", tmp_path / "a.tar.gz", "--images-per-batch", "0"])
    assert_one_line_error(result, 2, "--images-per-batch")


def test_output_that_cannot_be_written_is_a_one_line_error_leaving_nothing(tmp_path):
    is_a_directory = run_module("cifar10_estimator.data.synthetic_archive", ["--output", tmp_path])
    assert_one_line_error(is_a_directory, 2, "is a directory")

    (tmp_path / "file").write_bytes(b"")
    under_a_file = run_module("cifar10_estimator.data.synthetic_archive",
                              ["--output", tmp_path / "file" / "a.tar.gz"])
    assert_one_line_error(under_a_file, 1, "cannot write")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]
