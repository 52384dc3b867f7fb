"""The on-disk format shared by the converter (writer) and the data set (reader).

Each record is a tf.train.Example with two features, as in the original tutorial:
  image: bytes, the 3072 raw uint8 values of one image in CIFAR's channel-major
         order (1024 red, then 1024 green, then 1024 blue, each row-major 32x32);
  label: int64, the class index 0..9.
Beside the TFRecords, a small JSON file records how many examples each file holds.
"""

import json
import os

from cifar10_estimator.errors import Cifar10EstimatorError

HEIGHT = 32
WIDTH = 32
DEPTH = 3
IMAGE_NUM_BYTES = HEIGHT * WIDTH * DEPTH
NUM_CLASSES = 10
CLASS_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)

IMAGE_KEY = "image"
LABEL_KEY = "label"

SUBSETS = ("train", "validation", "eval")
# Counts of the official split (data_batch_1-4 / data_batch_5 / test_batch), used
# only when the metadata file is absent (records written by the original tutorial).
DEFAULT_NUM_EXAMPLES = {"train": 40000, "validation": 10000, "eval": 10000}

METADATA_FILENAME = "cifar10_metadata.json"
METADATA_FORMAT = "cifar10_estimator.tfrecords/1"


def check_subset(subset):
    """Raises ValueError unless subset is 'train', 'validation' or 'eval'."""
    if subset not in SUBSETS:
        raise ValueError("subset must be one of %s, got %r" % (", ".join(SUBSETS), subset))


def generate_command(data_dir):
    """The command that writes the TFRecords into data_dir, for error messages."""
    return "python -m cifar10_estimator.generate_tfrecords --data-dir %s" % data_dir


def tfrecord_path(data_dir, subset):
    """Path of the TFRecord file of `subset` ('train', 'validation' or 'eval') in data_dir."""
    check_subset(subset)
    return os.path.join(data_dir, subset + ".tfrecords")


def metadata_path(data_dir):
    return os.path.join(data_dir, METADATA_FILENAME)


def write_metadata(data_dir, num_examples):
    """Atomically write the per-subset example counts next to the TFRecords.

    Args:
      data_dir: directory holding the TFRecords.
      num_examples: dict subset name -> number of examples written.
    """
    path = metadata_path(data_dir)
    temporary = path + ".tmp"
    with open(temporary, "w") as stream:
        json.dump({"format": METADATA_FORMAT, "num_examples": dict(num_examples)},
                  stream, indent=2, sort_keys=True)
        stream.write("\n")
    os.replace(temporary, path)


def read_num_examples(data_dir):
    """Per-subset example counts from the metadata file, or None if there is none.

    Returns:
      dict subset name -> count, or None when data_dir has no metadata file.

    Raises:
      Cifar10EstimatorError: the metadata file exists but cannot be read as ours.
    """
    path = metadata_path(data_dir)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as stream:
            counts = json.load(stream)["num_examples"]
        return {str(subset): int(count) for subset, count in counts.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise Cifar10EstimatorError(
            "cannot read %s (%s); regenerate the data with: %s"
            % (path, error, generate_command(data_dir)))


def num_examples(subset="train", data_dir=None):
    """Number of examples in `subset`, from the metadata file of data_dir.

    Args:
      subset: 'train', 'validation' or 'eval'.
      data_dir: directory written by generate_tfrecords; without it, or when it has no
        metadata file (records written by the original tutorial), the counts of the
        official split are returned: 40000 / 10000 / 10000.

    Raises:
      ValueError: unknown subset.
      Cifar10EstimatorError: the metadata file is unreadable or lacks the subset.
    """
    check_subset(subset)
    counts = None if data_dir is None else read_num_examples(data_dir)
    if counts is None:
        return DEFAULT_NUM_EXAMPLES[subset]
    if subset not in counts:
        raise Cifar10EstimatorError(
            "%s has no count for subset %r; regenerate the data with: %s" % (
                metadata_path(data_dir), subset, generate_command(data_dir)))
    return counts[subset]
