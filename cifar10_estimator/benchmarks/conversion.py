"""Converting the CIFAR-10 archive: generate_tfrecords.convert against the original tutorial's way.

Both start from the same official-format archive (cifar-10-python.tar.gz holding Python 2
pickles of uint8 [10000, 3072] images) and write train/validation/eval TFRecords:
  - package: generate_tfrecords.convert, as the CLI runs it (MD5 check of the archive,
    safe extraction, restricted unpickling, records serialized from numpy arrays);
  - original: tarfile extractall, pickle.load, then one tf.train.Example per image built
    and serialized in a Python loop, as generate_cifar10_tfrecords.py did.
The archive comes from synthetic_archive (random images: as large as the real one, and
incompressible), so the benchmark runs from an installed package, without the tests.
"""

import dataclasses
import hashlib
import io
import itertools
import os
import pickle
import shutil
import tarfile
import time

# Imported up front so that neither way's timing includes loading TensorFlow.
import tensorflow as tf

from cifar10_estimator.data import cifar10_archive
from cifar10_estimator import generate_tfrecords
from cifar10_estimator.data import synthetic_archive
from cifar10_estimator import cifar10
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.machine import alternating_rounds

IMAGES_PER_OFFICIAL_BATCH = 10000


def write_official_format_archive(path, images_per_batch=IMAGES_PER_OFFICIAL_BATCH, seed=0):
    """Write a cifar-10-python.tar.gz of random images in the official layout and encoding."""
    synthetic_archive.write_archive(path, synthetic_archive.make_batches(images_per_batch, seed))


def convert_the_original_way(archive_path, data_dir):
    """The original tutorial's conversion: extractall, pickle.load, one Example per image.

    Only for archives this module wrote: like the original, it trusts the archive.
    """
    with tarfile.open(archive_path, "r:gz") as archive:
        archive.extractall(data_dir)
    batches_dir = cifar10_archive.batches_dir(data_dir)
    for subset in cifar10.SUBSETS:
        with tf.io.TFRecordWriter(tfrecord_format.tfrecord_path(data_dir, subset)) as writer:
            for name in cifar10_archive.SUBSET_BATCHES[subset]:
                with tf.io.gfile.GFile(os.path.join(batches_dir, name), "rb") as stream:
                    batch = pickle.load(stream, encoding="bytes")
                data, labels = batch[b"data"], batch[b"labels"]
                for index in range(len(labels)):
                    example = tf.train.Example(features=tf.train.Features(feature={
                        "image": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[data[index].tobytes()])),
                        "label": tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[labels[index]])),
                    }))
                    writer.write(example.SerializeToString())


def convert_with_the_package(archive_path, data_dir):
    """generate_tfrecords.convert on data_dir holding the archive, as the CLI runs it."""
    generate_tfrecords.convert(data_dir, messages=io.StringIO())


@dataclasses.dataclass
class ConversionMeasurement:
    seconds: float
    cpu_seconds: float

    def images_per_sec(self, num_images):
        return num_images / self.seconds


def _measure_conversion(convert, archive_path, output_dir):
    """Time convert(archive, output_dir) on an output_dir holding only (a link to) the archive."""
    os.makedirs(output_dir)
    local_archive = os.path.join(output_dir, cifar10_archive.ARCHIVE_FILENAME)
    try:
        os.link(archive_path, local_archive)
    except OSError:
        shutil.copyfile(archive_path, local_archive)
    start, start_cpu = time.perf_counter(), time.process_time()
    convert(local_archive, output_dir)
    return ConversionMeasurement(time.perf_counter() - start, time.process_time() - start_cpu)


def _examples_digest(data_dir):
    """SHA-256 of every (image, label) of the three TFRecord files, in record order.

    Compares the examples rather than the bytes: the original's non-deterministic
    serialization may write the two features in either order.
    """
    digest = hashlib.sha256()
    features = {tfrecord_format.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
                tfrecord_format.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)}
    for subset in cifar10.SUBSETS:
        records = tf.data.TFRecordDataset(tfrecord_format.tfrecord_path(data_dir, subset))
        for batch in records.batch(IMAGES_PER_OFFICIAL_BATCH).map(
                lambda serialized: tf.io.parse_example(serialized, features)):
            digest.update(b"".join(batch[tfrecord_format.IMAGE_KEY].numpy()))
            digest.update(batch[tfrecord_format.LABEL_KEY].numpy().astype("<i8").tobytes())
    return digest.hexdigest()


def compare_conversions(archive_path, work_dir, num_rounds, keep_package_output=None,
                        report=None):
    """Convert the archive both ways, alternating which goes first (alternating_rounds).

    Args:
      archive_path: an official-format archive.
      work_dir: scratch directory; each conversion writes to a fresh directory in it,
        removed after it was timed.
      num_rounds: conversions per way.
      keep_package_output: directory to move the first package conversion's output to
        (the benchmark trains on it), or None.
      report: optional function(round_index, way, ConversionMeasurement).

    Returns:
      (dict way -> list of ConversionMeasurement, whether both ways wrote the same
      examples in the same order to train/validation/eval).
    """
    ways = {"original": convert_the_original_way, "package": convert_with_the_package}
    digests = {}

    def contender(way):
        round_indexes = itertools.count()

        def measure():
            output_dir = os.path.join(work_dir, "%s_%d" % (way, next(round_indexes)))
            measurement = _measure_conversion(ways[way], archive_path, output_dir)
            if way not in digests:
                digests[way] = _examples_digest(output_dir)
            if way == "package" and keep_package_output and not os.path.exists(
                    keep_package_output):
                os.replace(output_dir, keep_package_output)
            else:
                shutil.rmtree(output_dir)
            return measurement
        return measure

    results = alternating_rounds.measure(
        {way: contender(way) for way in ways}, num_rounds, report=report)
    measurements = {way: results[way].measurements for way in ("package", "original")}
    return measurements, digests["package"] == digests["original"]
