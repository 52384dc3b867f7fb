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


def tfrecord_path(data_dir, subset):
    """Path of the TFRecord file of `subset` ('train', 'validation' or 'eval') in data_dir."""
    if subset not in SUBSETS:
        raise ValueError("subset must be one of %s, got %r" % (", ".join(SUBSETS), subset))
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
            "cannot read %s (%s); rerun generate_tfrecords" % (path, error))
