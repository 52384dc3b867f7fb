"""The CIFAR-10 python archive: what it is, how to extract it safely, how to read a batch.

The archive comes from the internet, so nothing in it is trusted: extraction refuses
members that could land outside the data directory, and the batches (Python 2
pickles) are read by an unpickler that can only rebuild numpy arrays.
"""

import codecs
import gzip
import os
import pickle
import posixpath
import shutil
import tarfile
import tempfile
import zlib

import numpy as np
from numpy.core.multiarray import _reconstruct

from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError

ARCHIVE_FILENAME = "cifar-10-python.tar.gz"
OFFICIAL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
OFFICIAL_MD5 = "c58f30108f718f92721af3b95e74349a"
BATCHES_DIRNAME = "cifar-10-batches-py"

# Which batches make up each subset, in record order.
SUBSET_BATCHES = {
    "train": ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4"),
    "validation": ("data_batch_5",),
    "eval": ("test_batch",),
}
BATCH_NAMES = tuple(name for subset in cifar10_facts.SUBSETS
                    for name in SUBSET_BATCHES[subset])

# Everything a CIFAR-10 batch needs to unpickle: numpy arrays, and (for batches
# re-pickled by Python 3 at protocol 2) the codec call that rebuilds bytes.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,  # as NumPy 2 writes it
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


def batches_dir(data_dir):
    """Directory the batches are extracted to inside data_dir."""
    return os.path.join(data_dir, BATCHES_DIRNAME)


def has_extracted_batches(data_dir):
    """Whether data_dir holds an extracted batches directory with all six batches."""
    return all(os.path.isfile(os.path.join(batches_dir(data_dir), name)) for name in BATCH_NAMES)


def extract_batches(archive_path, data_dir):
    """Extract the six batches from the archive into data_dir/cifar-10-batches-py.

    Every member is checked before anything is kept: absolute paths, `..`, links
    and device files are refused. The batches are written to a temporary directory
    and moved into place only once all six were extracted, so a failed extraction
    never leaves a batches directory that looks complete.

    Returns:
      the batches directory.

    Raises:
      Cifar10EstimatorError: the archive is unreadable, lacks a batch, or holds a
        member that is not a plain file or directory inside the archive.
    """
    wanted = {BATCHES_DIRNAME + "/" + name: name for name in BATCH_NAMES}
    staging = tempfile.mkdtemp(dir=data_dir, prefix="." + BATCHES_DIRNAME + ".")
    try:
        found = _extract_members(archive_path, wanted, staging)
        missing = sorted(set(wanted) - found)
        if missing:
            raise Cifar10EstimatorError(
                "archive %s lacks %s; it is not a CIFAR-10 python archive"
                % (archive_path, ", ".join(missing)))
        target = batches_dir(data_dir)
        os.makedirs(target, exist_ok=True)
        for name in BATCH_NAMES:
            os.replace(os.path.join(staging, name), os.path.join(target, name))
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract_members(archive_path, wanted, staging):
    """Copy the wanted members (archive name -> file name) into staging; returns those found."""
    found = set()
    try:
        with tarfile.open(archive_path, "r:*") as archive:
            for member in archive:
                name = _checked_member_name(archive_path, member)
                if name in wanted and member.isreg():
                    with archive.extractfile(member) as source, \
                            open(os.path.join(staging, wanted[name]), "wb") as destination:
                        shutil.copyfileobj(source, destination, 1 << 20)
                    found.add(name)
    except tarfile.ReadError:
        # Its message lists, one line each, every compression tarfile tried.
        raise Cifar10EstimatorError(
            "cannot read archive %s: not a tar file (plain, gzip, bzip2 or xz); delete it "
            "to download it again" % archive_path)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise Cifar10EstimatorError(
            "cannot read archive %s (%s); delete it to download it again"
            % (archive_path, str(error) or type(error).__name__))
    return found


def _checked_member_name(archive_path, member):
    """The member's normalized name; raises if it is a link, device, or escapes the archive."""
    if not (member.isreg() or member.isdir()):
        kind = ("symbolic link" if member.issym() else "hard link" if member.islnk()
                else "device or special file")
        raise Cifar10EstimatorError(
            "refusing archive %s: member %r is a %s; only plain files are extracted"
            % (archive_path, member.name, kind))
    name = posixpath.normpath(member.name)
    if (name.startswith("/") or "\\" in member.name or name == ".."
            or name.startswith("../")):
        raise Cifar10EstimatorError(
            "refusing archive %s: member %r would be written outside the data directory"
            % (archive_path, member.name))
    return name


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals a CIFAR-10 batch needs."""

    def __init__(self, stream, path):
        super().__init__(stream, encoding="bytes")
        self._path = path

    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise Cifar10EstimatorError(
                "%s: refused to unpickle global %s.%s; a CIFAR-10 batch holds only numpy "
                "arrays, so this file is not one (it could run code)" % (self._path, module, name))


def load_batch(path):
    """Read one CIFAR-10 batch file safely.

    Returns:
      (images, labels): uint8 array [N, 3072] in the file's channel-major order,
      int64 array [N] of class indices.

    Raises:
      Cifar10EstimatorError naming the file: unreadable, not a pickle, refers to
        anything but numpy arrays, or holds data that is not a CIFAR-10 batch.
    """
    try:
        with open(path, "rb") as stream:
            batch = _BatchUnpickler(stream, path).load()
    except Cifar10EstimatorError:
        raise
    except OSError as error:
        raise Cifar10EstimatorError("cannot read %s: %s" % (path, error.strerror or error))
    except Exception as error:  # The bytes are untrusted: any failure to decode them is theirs.
        raise Cifar10EstimatorError(
            "%s is not a readable CIFAR-10 batch (%s: %s)" % (path, type(error).__name__, error))
    return _validated_batch(path, batch)


def _validated_batch(path, batch):
    """(images, labels) of an unpickled batch, or an error naming the file and the problem."""
    def invalid(problem):
        return Cifar10EstimatorError("%s is not a CIFAR-10 batch: %s" % (path, problem))

    if not isinstance(batch, dict):
        raise invalid("expected a dict, found %s" % type(batch).__name__)
    for key in (b"data", b"labels"):
        if key not in batch:
            raise invalid("no %r entry" % key)
    images = batch[b"data"]
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 2
            and images.shape[1] == tfrecord_format.IMAGE_NUM_BYTES):
        raise invalid("b'data' must be a uint8 array of shape [N, %d], found %s"
                      % (tfrecord_format.IMAGE_NUM_BYTES, _describe(images)))
    if not len(images):
        raise invalid("it holds no images")
    try:
        labels = np.asarray(batch[b"labels"])
    except (ValueError, TypeError) as error:
        raise invalid("b'labels' is not a list of integers (%s)" % error)
    if labels.ndim != 1 or len(labels) != len(images):
        raise invalid("b'labels' must be %d class indices (one per image), found %s"
                      % (len(images), _describe(labels)))
    if len(labels) and labels.dtype.kind not in "iu":
        raise invalid("b'labels' must be integers, found %s" % labels.dtype)
    out_of_range = (labels < 0) | (labels >= cifar10_facts.NUM_CLASSES)
    if out_of_range.any():
        index = int(np.argmax(out_of_range))
        raise invalid("label %d of image %d is not a class index 0..%d"
                      % (labels[index], index, cifar10_facts.NUM_CLASSES - 1))
    return np.ascontiguousarray(images), labels.astype(np.int64)


def _describe(value):
    if isinstance(value, np.ndarray):
        return "%s array of shape %s" % (value.dtype, list(value.shape))
    return type(value).__name__
