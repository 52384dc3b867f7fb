"""Write a CIFAR-10 archive of random images in the official format, for offline use.

The official `cifar-10-python.tar.gz` holds `cifar-10-batches-py/` with six Python 2
pickles (protocol 2) of dicts whose keys and strings are Python 2 `str` (bytes when
Python 3 reads them with encoding='bytes'); `data` is a uint8 numpy array [N, 3072]
in channel-major order and `labels` a list of ints. This module writes the same
layout and the same pickle opcodes, so the whole pipeline (extract, safe unpickle,
convert, train) can run where the real archive cannot be downloaded:

    python -m cifar10_estimator.data.synthetic_archive --output DATA/cifar-10-python.tar.gz
    python -m cifar10_estimator.generate_tfrecords --data-dir DATA
"""

import dataclasses
import io
import os
import pickle
import struct
import sys
import tarfile

import numpy as np

from cifar10_estimator import files
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import option, options_parser, parse, positive_int
from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError

DEFAULT_IMAGES_PER_BATCH = 200


class Python2Pickler(pickle._Pickler):
    """A protocol-2 pickler that writes bytes and ASCII text as Python 2 `str` does.

    Python 3 pickles bytes at protocol 2 through `_codecs.encode`; Python 2 wrote
    SHORT_BINSTRING / BINSTRING opcodes, which Python 3 reads back as bytes with
    encoding='bytes'. The CIFAR-10 batches were written by Python 2.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, stream):
        super().__init__(stream, protocol=2)

    def save_py2_str(self, data):
        if isinstance(data, str):
            data = data.encode("ascii")
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(data)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def python2_pickle(obj):
    """obj pickled as Python 2 would have pickled it (protocol 2, str as bytes)."""
    stream = io.BytesIO()
    Python2Pickler(stream).dump(obj)
    return stream.getvalue()


def random_batch(num_images, seed, batch_label):
    """A batch dict as in the official files, with random pixels and labels."""
    rng = np.random.RandomState(seed)
    data = rng.randint(0, 256, size=(num_images, tfrecord_format.IMAGE_NUM_BYTES)).astype(np.uint8)
    labels = [int(x) for x in rng.randint(0, cifar10_facts.NUM_CLASSES, size=num_images)]
    return {
        b"batch_label": batch_label.encode("ascii"),
        b"labels": labels,
        b"data": data,
        b"filenames": [("image_%s_%05d.png" % (seed, i)).encode("ascii")
                       for i in range(num_images)],
    }


def make_batches(images_per_batch=DEFAULT_IMAGES_PER_BATCH, seed=0):
    """Dict batch name -> batch dict for the six official batches."""
    return {
        name: random_batch(images_per_batch, seed * 100 + index, "batch %d of 6" % (index + 1))
        for index, name in enumerate(cifar10_archive.BATCH_NAMES)
    }


def write_archive(path, batches, extra_members=()):
    """Write a gzip tar in the official layout.

    Args:
      path: archive file to write.
      batches: dict batch name -> batch dict (or raw bytes to store as they are).
      extra_members: (tarfile.TarInfo, bytes or None) pairs appended after the batches.
    """
    members = {"batches.meta": python2_pickle({
        b"label_names": [name.encode("ascii") for name in cifar10_facts.CLASS_NAMES],
        b"num_cases_per_batch": 10000, b"num_vis": tfrecord_format.IMAGE_NUM_BYTES})}
    for name, batch in batches.items():
        members[name] = batch if isinstance(batch, bytes) else python2_pickle(batch)
    members["readme.html"] = b"<html>synthetic CIFAR-10: random images</html>\n"
    # Random pixels do not compress: the fastest level gives the same size, much sooner.
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        directory = tarfile.TarInfo(cifar10_archive.BATCHES_DIRNAME)
        directory.type = tarfile.DIRTYPE
        directory.mode = 0o755
        archive.addfile(directory)
        for name, payload in members.items():
            info = tarfile.TarInfo("%s/%s" % (cifar10_archive.BATCHES_DIRNAME, name))
            info.size = len(payload)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(payload))
        for info, payload in extra_members:
            archive.addfile(info, io.BytesIO(payload) if payload is not None else None)


@dataclasses.dataclass(frozen=True)
class SyntheticArchiveOptions:
    """The command line: where to write the archive, how many images, which."""

    output: str = option(
        None, "archive to write, e.g. DATA/%s" % cifar10_archive.ARCHIVE_FILENAME,
        required=True, metavar="PATH")
    images_per_batch: int = option(
        DEFAULT_IMAGES_PER_BATCH, "images in each of the six batches (official: 10000; "
                                  "default: %(default)s)",
        type=positive_int, metavar="N")
    seed: int = option(0, "random seed (default: 0)", type=int)


def build_parser():
    return options_parser(
        SyntheticArchiveOptions,
        description="Write %s of random images in the official CIFAR-10 format (six "
                    "Python 2 pickles), to run the pipeline offline. generate_tfrecords "
                    "converts it with a warning that its MD5 is not the official one."
                    % cifar10_archive.ARCHIVE_FILENAME)


def main(argv):
    args = parse(build_parser(), SyntheticArchiveOptions, argv)
    if os.path.isdir(args.output):
        raise UsageError("--output %s is a directory; name the archive file, e.g. %s"
                         % (args.output, os.path.join(args.output,
                                                      cifar10_archive.ARCHIVE_FILENAME)))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with files.written_whole(args.output) as temporary:
            write_archive(temporary, make_batches(args.images_per_batch, args.seed))
    except OSError as error:
        raise Cifar10EstimatorError("cannot write %s: %s" % (args.output, error.strerror or error))
    print("wrote %s: 6 batches of %d random images" % (args.output, args.images_per_batch))


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
