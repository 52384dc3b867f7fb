"""cifar10_archive: safe extraction of the official archive and safe, validated batch loading."""

import os
import pickle
import tarfile

import numpy as np
import pytest

from cifar_archives import BATCH_NAMES, python2_pickle, random_batch, write_archive
from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.errors import Cifar10EstimatorError


def read(path):
    with open(path, "rb") as stream:
        return stream.read()


def write(path, payload):
    with open(path, "wb") as stream:
        stream.write(payload)


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    return path


# --- extraction ---------------------------------------------------------------------------

def test_extracts_only_the_six_batches(cifar_archive, cifar_batches, data_dir):
    archive, _ = cifar_archive
    batches_dir = cifar10_archive.extract_batches(str(archive), str(data_dir))

    assert os.listdir(str(data_dir)) == ["cifar-10-batches-py"]
    assert sorted(os.listdir(batches_dir)) == sorted(BATCH_NAMES)
    for name in BATCH_NAMES:
        assert read(os.path.join(batches_dir, name)) == python2_pickle(cifar_batches[name])
    assert cifar10_archive.has_extracted_batches(str(data_dir))


def test_extraction_replaces_batches_left_by_an_earlier_run(cifar_archive, cifar_batches, data_dir):
    archive, _ = cifar_archive
    (data_dir / "cifar-10-batches-py").mkdir()
    write(str(data_dir / "cifar-10-batches-py" / "test_batch"), b"corrupt")

    batches_dir = cifar10_archive.extract_batches(str(archive), str(data_dir))

    assert (read(os.path.join(batches_dir, "test_batch"))
            == python2_pickle(cifar_batches["test_batch"]))


def _member(name, member_type=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = member_type
    info.linkname = linkname
    payload = b"evil" if member_type == tarfile.REGTYPE else None
    info.size = len(payload) if payload else 0
    return info, payload


@pytest.mark.parametrize("make_member, problem", [
    (lambda tmp: _member("../evil"), "outside the data directory"),
    (lambda tmp: _member("cifar-10-batches-py/../../evil"), "outside the data directory"),
    (lambda tmp: _member(str(tmp / "evil")), "outside the data directory"),
    (lambda tmp: _member("cifar-10-batches-py/link", tarfile.SYMTYPE, "../../evil"),
     "symbolic link"),
    (lambda tmp: _member("cifar-10-batches-py/data_batch_1", tarfile.SYMTYPE, str(tmp / "evil")),
     "symbolic link"),
    (lambda tmp: _member("cifar-10-batches-py/hard", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
    (lambda tmp: _member("cifar-10-batches-py/null", tarfile.CHRTYPE), "device or special file"),
    (lambda tmp: _member("cifar-10-batches-py/pipe", tarfile.FIFOTYPE), "device or special file"),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink", "symlink-as-batch", "hardlink",
        "device", "fifo"])
def test_refuses_members_that_could_escape(tmp_path, cifar_batches, data_dir, make_member, problem):
    info, payload = make_member(tmp_path)
    archive = str(tmp_path / "hostile.tar.gz")
    write_archive(archive, cifar_batches, extra_members=[(info, payload)])

    with pytest.raises(Cifar10EstimatorError, match=problem) as error:
        cifar10_archive.extract_batches(archive, str(data_dir))

    assert repr(info.name) in str(error.value) and archive in str(error.value)
    assert not (tmp_path / "evil").exists()
    assert os.listdir(str(data_dir)) == []  # not even a partial batches directory


@pytest.mark.parametrize("keep_fraction", [0.5, 0.01])
def test_truncated_archive_is_an_error_naming_it(cifar_archive, data_dir, keep_fraction):
    archive, _ = cifar_archive
    payload = read(str(archive))
    write(str(archive), payload[:int(len(payload) * keep_fraction)])

    with pytest.raises(Cifar10EstimatorError, match="cannot read archive %s" % archive):
        cifar10_archive.extract_batches(str(archive), str(data_dir))
    assert os.listdir(str(data_dir)) == []


def test_archive_that_is_not_a_tar_gz_is_a_one_line_error(tmp_path, data_dir):
    archive = tmp_path / "cifar-10-python.tar.gz"
    write(str(archive), b"<html>404 Not Found</html>")
    with pytest.raises(Cifar10EstimatorError, match="cannot read archive .*not a tar file") \
            as error:
        cifar10_archive.extract_batches(str(archive), str(data_dir))
    assert "\n" not in str(error.value)


def test_archive_missing_a_batch_is_an_error_naming_it(tmp_path, cifar_batches, data_dir):
    del cifar_batches["test_batch"]
    archive = str(tmp_path / "partial.tar.gz")
    write_archive(archive, cifar_batches)
    with pytest.raises(Cifar10EstimatorError, match="lacks cifar-10-batches-py/test_batch"):
        cifar10_archive.extract_batches(archive, str(data_dir))
    assert os.listdir(str(data_dir)) == []


# --- loading batches ----------------------------------------------------------------------

@pytest.fixture
def batch():
    return random_batch(12, seed=7, batch_label="training batch 1 of 5")


def test_loads_a_python2_batch(tmp_path, batch):
    path = tmp_path / "data_batch_1"
    write(str(path), python2_pickle(batch))

    images, labels = cifar10_archive.load_batch(str(path))

    assert images.dtype == np.uint8 and images.shape == (12, 3072)
    np.testing.assert_array_equal(images, batch[b"data"])
    assert labels.dtype == np.int64
    assert labels.tolist() == batch[b"labels"]


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_loads_batches_pickled_by_python3(tmp_path, batch, protocol):
    path = tmp_path / "data_batch_1"
    write(str(path), pickle.dumps(batch, protocol=protocol))

    images, labels = cifar10_archive.load_batch(str(path))

    np.testing.assert_array_equal(images, batch[b"data"])
    assert labels.tolist() == batch[b"labels"]


class RunsShellCommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class RunsPython:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return exec, (self.code,)


@pytest.mark.parametrize("make_payload, refused_global", [
    (lambda marker: RunsShellCommand("touch '%s'" % marker), os.system.__module__ + ".system"),
    (lambda marker: RunsPython("open(%r, 'w').close()" % str(marker)), "__builtin__.exec"),
], ids=["os.system", "exec"])
def test_malicious_pickle_is_refused_without_running(tmp_path, batch, make_payload, refused_global):
    # The payload is live: an ordinary unpickler runs it.
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(make_payload(proof), protocol=2))
    assert proof.exists()

    marker = tmp_path / "marker"
    batch[b"labels"] = make_payload(marker)
    path = tmp_path / "data_batch_1"
    write(str(path), pickle.dumps(batch, protocol=2))

    with pytest.raises(Cifar10EstimatorError) as error:
        cifar10_archive.load_batch(str(path))

    assert not marker.exists()
    assert str(path) in str(error.value)
    assert "refused to unpickle global %s" % refused_global in str(error.value)


def _set(key, value):
    def mutate(batch):
        batch[key] = value(batch) if callable(value) else value
        return batch
    return mutate


def _drop(key):
    def mutate(batch):
        del batch[key]
        return batch
    return mutate


@pytest.mark.parametrize("mutate, problem", [
    (lambda batch: [batch[b"data"]], "expected a dict, found list"),
    (_drop(b"labels"), "no b'labels' entry"),
    (_drop(b"data"), "no b'data' entry"),
    (_set(b"data", lambda batch: batch[b"data"][:, :3071]),
     r"shape \[N, 3072\], found uint8 array of shape \[12, 3071\]"),
    (_set(b"data", lambda batch: batch[b"data"].astype(np.int64)), "found int64 array"),
    (_set(b"data", lambda batch: batch[b"data"].reshape(12, 3, 32, 32)),
     r"found uint8 array of shape \[12, 3, 32, 32\]"),
    (_set(b"data", b"raw bytes"), "found bytes"),
    (lambda batch: {b"data": batch[b"data"][:0], b"labels": []}, "it holds no images"),
    (_set(b"labels", lambda batch: batch[b"labels"][:-1]), "must be 12 class indices"),
    (_set(b"labels", [3] * 11 + [10]), "label 10 of image 11 is not a class index 0..9"),
    (_set(b"labels", [-1] + [3] * 11), "label -1 of image 0 is not a class index 0..9"),
    (_set(b"labels", [b"cat"] * 12), "must be integers"),
    (_set(b"labels", [0.5] * 12), "must be integers"),
], ids=["not-dict", "no-labels", "no-data", "short-rows", "wrong-dtype", "4d", "not-array",
        "no-images",
        "too-few-labels", "label-10", "label-negative", "label-bytes", "label-float"])
def test_invalid_batch_is_an_error_naming_the_file(tmp_path, batch, mutate, problem):
    path = tmp_path / "data_batch_3"
    write(str(path), python2_pickle(mutate(batch)))

    with pytest.raises(Cifar10EstimatorError, match=problem) as error:
        cifar10_archive.load_batch(str(path))
    assert str(error.value).startswith("%s is not a CIFAR-10 batch: " % path)


@pytest.mark.parametrize("payload", [b"", b"not a pickle at all", python2_pickle({b"a": 1})[:-5]],
                         ids=["empty", "garbage", "truncated"])
def test_unreadable_batch_is_an_error_naming_the_file(tmp_path, payload):
    path = tmp_path / "test_batch"
    write(str(path), payload)
    with pytest.raises(Cifar10EstimatorError, match="%s is not a readable CIFAR-10 batch" % path):
        cifar10_archive.load_batch(str(path))


def test_missing_batch_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(Cifar10EstimatorError, match="cannot read %s" % (tmp_path / "test_batch")):
        cifar10_archive.load_batch(str(tmp_path / "test_batch"))
