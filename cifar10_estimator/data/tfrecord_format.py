"""The on-disk format shared by the converter (writer) and the data set (reader).

Each record is a tf.train.Example with two features, as in the original tutorial:
  image: bytes, the 3072 raw uint8 values of one image in CIFAR's channel-major
         order (1024 red, then 1024 green, then 1024 blue, each row-major 32x32);
  label: int64, the class index 0..9.
Beside the TFRecords, a small JSON file records how many examples each file holds; a
data dir converted without a validation set has neither its file nor its count.
`check_tfrecords_exist` tells that the files are there, `check_tfrecords` reads a file
once to tell that it is still what was written.

Records are serialized straight from numpy arrays: a tf.train.Example with one
3072-byte `image` and one small `label` has a fixed wire layout, so every record
is a copy of one template with the image bytes and the label byte filled in. The
result is byte-for-byte what `tf.train.Example.SerializeToString(deterministic=True)`
writes, and parses exactly like the original tutorial's records.
"""

import contextlib
import json
import os

import numpy as np

from cifar10_estimator import files
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.errors import Cifar10EstimatorError

# One image's bytes in a record: CIFAR-10's HEIGHT x WIDTH x DEPTH, channel-major.
IMAGE_NUM_BYTES = cifar10_facts.HEIGHT * cifar10_facts.WIDTH * cifar10_facts.DEPTH

IMAGE_KEY = "image"
LABEL_KEY = "label"

METADATA_FILENAME = "cifar10_metadata.json"
METADATA_FORMAT = "cifar10_estimator.tfrecords/1"

# Records serialized per numpy pass: bounds the extra memory to a few MB.
_RECORDS_PER_CHUNK = 4096
# TFRecord framing around each record: its length (8 bytes) and two 4-byte checksums.
_FRAMING_NUM_BYTES = 16


def generate_command(data_dir):
    """The command that writes the TFRecords into data_dir, for error messages."""
    return "python -m cifar10_estimator.generate_tfrecords --data-dir %s" % data_dir


def tfrecord_path(data_dir, subset):
    """Path of the TFRecord file of `subset` ('train', 'validation' or 'eval') in data_dir."""
    cifar10_facts.check_subset(subset)
    return os.path.join(data_dir, subset + ".tfrecords")


def check_tfrecords_exist(data_dir, subsets):
    """Raises Cifar10EstimatorError, with the command that writes them, unless data_dir
    holds the TFRecord file of every subset in `subsets`."""
    file_system = files.for_path(data_dir)
    hint = "create the TFRecords with: " + generate_command(data_dir)
    if not file_system.isdir(data_dir):
        raise Cifar10EstimatorError("data directory %s does not exist; %s" % (data_dir, hint))
    for subset in subsets:
        filename = tfrecord_path(data_dir, subset)
        if not file_system.exists(filename):
            raise Cifar10EstimatorError("%s does not exist; %s" % (filename, hint))


def metadata_path(data_dir):
    return os.path.join(data_dir, METADATA_FILENAME)


def write_metadata(data_dir, num_examples):
    """Atomically write the per-subset example counts next to the TFRecords.

    Args:
      data_dir: directory holding the TFRecords.
      num_examples: dict subset name -> number of examples written.
    """
    files.write_json(metadata_path(data_dir), {
        "format": METADATA_FORMAT, "num_examples": dict(num_examples)})


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


def has_subset(data_dir, subset):
    """Whether data_dir holds `subset` ('train', 'validation' or 'eval').

    The converter writes no validation set when told to keep no validation examples;
    its metadata file then lists no 'validation'. Without a metadata file (records
    written by the original tutorial), a subset is there when its TFRecord file is.

    Raises:
      ValueError: unknown subset.
      Cifar10EstimatorError: the metadata file exists but cannot be read as ours.
    """
    cifar10_facts.check_subset(subset)
    counts = read_num_examples(data_dir)
    if counts is None:
        return os.path.isfile(tfrecord_path(data_dir, subset))
    return subset in counts


def num_examples(subset="train", data_dir=None):
    """Number of examples in `subset`, from the metadata file of data_dir.

    Args:
      subset: 'train', 'validation' or 'eval'.
      data_dir: directory written by generate_tfrecords; without it, or when it has no
        metadata file (records written by the original tutorial), the counts of the
        official split are returned: 40000 / 10000 / 10000.

    Raises:
      ValueError: unknown subset.
      Cifar10EstimatorError: the metadata file is unreadable or lacks the subset (see
        `has_subset`: a data dir converted with --validation-examples 0 has no
        validation set).
    """
    cifar10_facts.check_subset(subset)
    counts = None if data_dir is None else read_num_examples(data_dir)
    if counts is None:
        return cifar10_facts.OFFICIAL_NUM_EXAMPLES[subset]
    if subset not in counts:
        raise Cifar10EstimatorError(
            "%s has no %s examples (%s lists none); regenerate the data with: %s" % (
                data_dir, subset, metadata_path(data_dir), generate_command(data_dir)))
    return counts[subset]


def _varint(value):
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def _field(field_number, payload):
    """A length-delimited protobuf field (wire type 2): tag, length, payload."""
    return _varint(field_number << 3 | 2) + _varint(len(payload)) + payload


def _example_template():
    """A serialized Example with a zero image and label 0, and where its image bytes start.

    Field numbers from tensorflow/core/example/{example,feature}.proto. Map entries are
    in key order (image, label), as deterministic serialization writes them.
    """
    image_feature = _field(1, _field(1, bytes(IMAGE_NUM_BYTES)))  # bytes_list.value
    label_feature = _field(3, _field(1, _varint(0)))  # int64_list.value, packed
    # Map entries: key = 1, value = 2.
    image_entry = _field(1, IMAGE_KEY.encode()) + _field(2, image_feature)
    label_entry = _field(1, LABEL_KEY.encode()) + _field(2, label_feature)
    features = _field(1, image_entry) + _field(1, label_entry)  # Features.feature map
    template = _field(1, features)  # Example.features
    # The image bytes end the image entry; the label's one-byte varint ends the record.
    image_end = len(template) - len(_field(1, label_entry))
    return np.frombuffer(template, np.uint8), image_end - IMAGE_NUM_BYTES


_TEMPLATE, _IMAGE_START = _example_template()
_IMAGE_END = _IMAGE_START + IMAGE_NUM_BYTES
RECORD_NUM_BYTES = len(_TEMPLATE)
_MAX_ONE_BYTE_LABEL = 0x7F
# What every record of that layout holds before its image and between image and label.
_RECORD_PREFIX = _TEMPLATE[:_IMAGE_START].tobytes()
_RECORD_SUFFIX = _TEMPLATE[_IMAGE_END:-1].tobytes()


def serialize_examples(images, labels):
    """Serialize one tf.train.Example (`image` bytes, `label` int64) per image.

    Args:
      images: uint8 array [N, 3072], each row an image in CIFAR's channel-major order.
      labels: integer array [N], each 0..127 (CIFAR-10 uses 0..9).

    Returns:
      uint8 array [N, RECORD_NUM_BYTES]; row i is Example i's serialized bytes.

    Raises:
      ValueError: wrong shapes or types, or a label outside 0..127.
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if (images.dtype != np.uint8 or images.ndim != 2
            or images.shape[1] != IMAGE_NUM_BYTES):
        raise ValueError("images must be uint8 [N, %d], got %s %s"
                         % (IMAGE_NUM_BYTES, images.dtype, images.shape))
    if labels.shape != (len(images),) or (len(labels) and labels.dtype.kind not in "iu"):
        raise ValueError("labels must be %d integers, got %s %s"
                         % (len(images), labels.dtype, labels.shape))
    if len(labels) and (labels.min() < 0 or labels.max() > _MAX_ONE_BYTE_LABEL):
        raise ValueError("labels must be in 0..%d, got %d..%d"
                         % (_MAX_ONE_BYTE_LABEL, labels.min(), labels.max()))
    records = np.empty((len(images), RECORD_NUM_BYTES), np.uint8)
    records[:, :_IMAGE_START] = _TEMPLATE[:_IMAGE_START]
    records[:, _IMAGE_START:_IMAGE_END] = images
    records[:, _IMAGE_END:] = _TEMPLATE[_IMAGE_END:]
    records[:, -1] = labels
    return records


def _write_examples(writer, images, labels):
    for start in range(0, len(images), _RECORDS_PER_CHUNK):
        stop = start + _RECORDS_PER_CHUNK
        records = serialize_examples(images[start:stop], labels[start:stop]).tobytes()
        for offset in range(0, len(records), RECORD_NUM_BYTES):
            writer.write(records[offset:offset + RECORD_NUM_BYTES])


@contextlib.contextmanager
def tfrecords_written_whole(path, batches):
    """Write (images, labels) batches as Examples to a temporary of the TFRecord file `path`
    (files.written_whole), which replaces `path` when the block ends.

    Yields:
      the number of examples written.

    Raises:
      Cifar10EstimatorError: the file cannot be written (e.g. the disk is full).
    """
    # Imported here: TensorFlow takes seconds to load, flag and download errors need not wait.
    import tensorflow as tf

    with files.written_whole(path) as temporary:
        num_examples = 0
        try:
            with tf.io.TFRecordWriter(temporary) as writer:
                for images, labels in batches:
                    _write_examples(writer, images, labels)
                    num_examples += len(labels)
        except tf.errors.OpError as error:
            raise Cifar10EstimatorError("cannot write %s: %s" % (path, error.message))
        yield num_examples


def write_tfrecords(path, images, labels):
    """Write one TFRecord file of Examples from in-memory arrays, whole or not at all.

    Args:
      path: the file to write; it appears only once complete.
      images, labels: as for `serialize_examples`.

    Returns:
      the number of examples written.
    """
    with tfrecords_written_whole(path, [(images, labels)]) as num_examples:
        return num_examples


def check_tfrecords(data_dir, subset):
    """Read the TFRecord file of `subset` once; raise unless it is whole and as converted.

    Each record must pass its checksums and be a CIFAR-10 example (one image of
    IMAGE_NUM_BYTES bytes, one label 0..9); the records must fill the file; and their
    number must be the one the metadata file records, where there is one. TensorFlow's
    reader would otherwise fail inside training with a trace that names no file, or
    stop without a word where the file was cut (the count tells a cut at a record's
    boundary). Reading the file costs a fraction of decoding it (see
    docs/troubleshooting.md).

    Raises:
      Cifar10EstimatorError: "<file>: <what is wrong>; regenerate the data with: <command>".
    """
    path = tfrecord_path(data_dir, subset)
    num_records, fault = _read_records(path)
    expected = (read_num_examples(data_dir) or {}).get(subset)
    if fault is None and expected is not None and num_records != expected:
        fault = "holds %d records, the metadata says %d (%s)" % (
            num_records, expected, metadata_path(data_dir))
    if fault:
        raise Cifar10EstimatorError("%s: %s; regenerate the data with: %s"
                                    % (path, fault, generate_command(data_dir)))


def _read_records(path):
    """(number of records, None) of a sound TFRecord file of CIFAR-10 examples, else
    (records before the first fault, what the fault is)."""
    import tensorflow as tf  # lazy: keeps the commands' flag errors fast
    num_records = offset = 0
    try:
        for record in tf.compat.v1.io.tf_record_iterator(path):
            if not _is_cifar10_record(record):
                return num_records, (
                    "record %d (at byte %d) is not a CIFAR-10 example of a %d-byte image and a "
                    "label 0..%d" % (num_records, offset, IMAGE_NUM_BYTES,
                                     cifar10_facts.NUM_CLASSES - 1))
            num_records += 1
            offset += len(record) + _FRAMING_NUM_BYTES
    except tf.errors.DataLossError as error:
        # TensorFlow's words: "truncated record" where the file ends inside a record's
        # data, "corrupted record" where a checksum fails.
        if error.message.startswith("truncated"):
            return num_records, "truncated record at byte %d (the file ends inside it)" % offset
        return num_records, "corrupted record at byte %d (a checksum fails)" % offset
    except tf.errors.OpError as error:
        return num_records, "cannot read it (%s)" % error.message
    if offset != tf.io.gfile.stat(path).length:
        # Where the file ends inside a record's header, the reader stops without a word.
        return num_records, "truncated record at byte %d (the file ends inside it)" % offset
    return num_records, None


def _is_cifar10_record(record):
    """Whether a serialized record is an Example of one CIFAR-10 image and label."""
    if (len(record) == RECORD_NUM_BYTES and record.startswith(_RECORD_PREFIX)
            and record[_IMAGE_END:-1] == _RECORD_SUFFIX):
        # The layout this module writes (see serialize_examples): the label byte is all
        # that varies, besides the image. Parsing every record would double the check.
        return record[-1] < cifar10_facts.NUM_CLASSES
    import tensorflow as tf  # lazy: keeps the commands' flag errors fast
    from google.protobuf.message import DecodeError
    try:
        features = tf.train.Example.FromString(record).features.feature
    except DecodeError:
        return False
    images = features[IMAGE_KEY].bytes_list.value
    labels = features[LABEL_KEY].int64_list.value
    return (len(images) == 1 and len(images[0]) == IMAGE_NUM_BYTES
            and len(labels) == 1 and 0 <= labels[0] < cifar10_facts.NUM_CLASSES)
