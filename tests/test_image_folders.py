"""generate_tfrecords --image-dir: folders of PNG/JPEG images -> TFRecords, through the real CLI."""

import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from cifar_archives import SPECIAL_FOLDER_IMAGES, read_tfrecords
from cli_helpers import assert_one_line_error, run_module
from cifar10_estimator.data import image_folders
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError

MODULE = "cifar10_estimator.generate_tfrecords"
# cifar_archives.write_image_folders: 5 training and 2 test images per class.
NUM_TRAIN_IMAGES = 50
NUM_TEST_IMAGES = 20


def pillow_pixels(path):
    """The image as Pillow decodes it, as RGB, in CIFAR's channel-major layout [3072]."""
    with Image.open(str(path)) as image:
        rgb = np.asarray(image.convert("RGB"))
    return rgb.transpose(2, 0, 1).reshape(-1)


def convert(image_dir, data_dir, *flags):
    return run_module(MODULE, ["--image-dir", image_dir, "--data-dir", data_dir] + list(flags),
                      timeout=300)


def read_subset(data_dir, subset):
    return read_tfrecords(tfrecord_format.tfrecord_path(str(data_dir), subset))


def fixed_training_order(image_dir):
    """Relative paths of the training images in the order the converter writes them."""
    paths, _ = image_folders.list_images(str(image_dir))["train"]
    return [os.path.relpath(os.fsdecode(path), str(image_dir)).replace(os.sep, "/")
            for path in paths]


def output_files(data_dir):
    if not os.path.isdir(str(data_dir)):
        return []
    return sorted(name for name in os.listdir(str(data_dir))
                  if "tfrecords" in name or tfrecord_format.METADATA_FILENAME in name)


def assert_converted(result, data_dir, counts):
    """The run succeeded, printed `counts` and wrote exactly those subsets and metadata."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        [subset, str(count), "examples", tfrecord_format.tfrecord_path(str(data_dir), subset)]
        for subset, count in counts.items()
    ] + [["counts", "in", tfrecord_format.metadata_path(str(data_dir))]]
    assert tfrecord_format.read_num_examples(str(data_dir)) == counts
    assert output_files(data_dir) == sorted(
        [tfrecord_format.METADATA_FILENAME] + ["%s.tfrecords" % subset for subset in counts])


# --- the happy path -----------------------------------------------------------------------

def test_pixels_labels_and_order_are_pillows_decoding_in_the_fixed_order(
        tmp_path, cifar_image_folders):
    image_dir, written = cifar_image_folders
    data_dir = tmp_path / "data"

    result = convert(image_dir, data_dir)

    assert_converted(result, data_dir, {"train": 40, "validation": 10, "eval": 20})
    train_images, train_labels = read_subset(data_dir, "train")
    validation_images, validation_labels = read_subset(data_dir, "validation")
    labels_by_path = {path: label for path, label, _ in written["train"]}
    order = fixed_training_order(image_dir)
    assert sorted(order) == sorted(labels_by_path)
    np.testing.assert_array_equal(
        np.concatenate([train_images, validation_images]),
        [pillow_pixels(image_dir / path) for path in order])
    np.testing.assert_array_equal(
        np.concatenate([train_labels, validation_labels]),
        [labels_by_path[path] for path in order])
    assert sorted(validation_labels) == list(range(10))  # the fixed order spreads the classes
    # Test images: class (CIFAR's label order), then file name.
    eval_images, eval_labels = read_subset(data_dir, "eval")
    np.testing.assert_array_equal(
        eval_images, [pillow_pixels(image_dir / path) for path, _, _ in written["test"]])
    np.testing.assert_array_equal(eval_labels, [label for _, label, _ in written["test"]])
    assert list(eval_labels) == sorted(eval_labels)


def test_grayscale_is_expanded_to_rgb_and_alpha_is_dropped(tmp_path, cifar_image_folders):
    image_dir, _ = cifar_image_folders
    data_dir = tmp_path / "data"
    assert_converted(convert(image_dir, data_dir, "--validation-examples", "0"), data_dir,
                     {"train": NUM_TRAIN_IMAGES, "eval": NUM_TEST_IMAGES})
    images, _ = read_subset(data_dir, "train")
    by_path = dict(zip(fixed_training_order(image_dir), images))

    for (split, class_name, index), (mode, extension) in SPECIAL_FOLDER_IMAGES.items():
        path = "%s/%s/%04d%s" % (split, class_name, index, extension)
        if mode not in ("L", "RGBA"):
            continue
        red, green, blue = by_path[path].reshape(3, 32, 32)
        with Image.open(str(image_dir / path)) as image:
            if mode == "L":
                gray = np.asarray(image)
                for channel in (red, green, blue):
                    np.testing.assert_array_equal(channel, gray)
            else:
                rgba = np.asarray(image)
                assert rgba[..., 3].min() < 255  # there was transparency to drop
                np.testing.assert_array_equal(np.stack([red, green, blue], axis=-1),
                                              rgba[..., :3])


def test_jpeg_pixels_need_the_accurate_idct(cifar_image_folders):
    """Why the converter asks for INTEGER_ACCURATE: TensorFlow's default differs from Pillow."""
    import tensorflow as tf

    image_dir, written = cifar_image_folders
    jpegs = [path for path, _, _ in written["train"] if path.lower().endswith((".jpg", ".jpeg"))]
    default_differs = False
    for path in jpegs:
        contents = tf.io.read_file(str(image_dir / path))
        pillow = pillow_pixels(image_dir / path).reshape(3, 32, 32).transpose(1, 2, 0)
        accurate = tf.io.decode_jpeg(contents, channels=3, dct_method="INTEGER_ACCURATE")
        np.testing.assert_array_equal(accurate.numpy(), pillow)
        default_differs |= not np.array_equal(tf.io.decode_jpeg(contents, channels=3).numpy(),
                                              pillow)
    assert default_differs


def test_long_runs_report_progress(cifar_image_folders, monkeypatch):
    image_dir, _ = cifar_image_folders
    monkeypatch.setattr(image_folders, "PROGRESS_EVERY_IMAGES", 20)
    monkeypatch.setattr(image_folders, "_DECODE_BATCH_SIZE", 10)
    paths, labels = image_folders.list_images(str(image_dir))["train"]
    messages = io.StringIO()

    batches = list(image_folders.decoded_batches(paths, labels, "train", messages))

    assert [len(batch_labels) for _, batch_labels in batches] == [10] * 5
    assert messages.getvalue().splitlines() == ["decoded 20/50 train images",
                                                "decoded 40/50 train images"]


def test_an_undecodable_file_deep_in_the_run_is_the_one_named(cifar_image_folders, monkeypatch):
    image_dir, _ = cifar_image_folders
    monkeypatch.setattr(image_folders, "_DECODE_BATCH_SIZE", 10)
    paths, labels = image_folders.list_images(str(image_dir))["train"]
    with open(paths[27], "wb") as stream:  # in the third batch
        stream.write(b"not an image")

    with pytest.raises(Cifar10EstimatorError) as raised:
        list(image_folders.decoded_batches(paths, labels, "train", io.StringIO()))

    assert str(raised.value) == ("cannot decode %s: not a complete, valid PNG or JPEG image"
                                 % os.fsdecode(paths[27]))


# --- the fixed order ----------------------------------------------------------------------

def test_training_order_is_fixed_by_the_seed():
    labels = np.repeat(np.arange(3), 3)
    assert image_folders.training_order(labels).tolist() == [8, 3, 0, 5, 6, 1, 7, 2, 4]
    assert (image_folders.training_order(labels, seed=image_folders.TRAIN_ORDER_SEED).tolist()
            == image_folders.training_order(labels).tolist())
    assert (image_folders.training_order(labels, seed=image_folders.TRAIN_ORDER_SEED + 1)
            .tolist() != image_folders.training_order(labels).tolist())


def test_any_tail_of_the_training_order_is_balanced_across_classes():
    labels = np.repeat(np.arange(10), 50)

    ordered = labels[image_folders.training_order(labels)]

    assert sorted(ordered.tolist()) == labels.tolist()
    for tail in (10, 30, 100, 250):
        assert np.bincount(ordered[-tail:], minlength=10).tolist() == [tail // 10] * 10
    assert ordered[:20].tolist() != sorted(ordered[:20].tolist())  # shuffled within blocks


# --- the validation split -----------------------------------------------------------------

def test_validation_examples_takes_the_last_n_of_the_fixed_order(tmp_path, cifar_image_folders):
    image_dir, _ = cifar_image_folders
    data_dir = tmp_path / "data"

    result = convert(image_dir, data_dir, "--validation-examples", "3")

    assert_converted(result, data_dir, {"train": 47, "validation": 3, "eval": 20})
    order = fixed_training_order(image_dir)
    validation_images, _ = read_subset(data_dir, "validation")
    np.testing.assert_array_equal(validation_images,
                                  [pillow_pixels(image_dir / path) for path in order[-3:]])


def test_no_validation_set_removes_the_one_of_an_earlier_run(tmp_path, cifar_image_folders):
    image_dir, _ = cifar_image_folders
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    tfrecord_format.write_tfrecords(tfrecord_format.tfrecord_path(str(data_dir), "validation"),
                                    np.zeros((1, 3072), np.uint8), [0])

    result = convert(image_dir, data_dir, "--validation-examples", "0")

    assert_converted(result, data_dir, {"train": NUM_TRAIN_IMAGES, "eval": NUM_TEST_IMAGES})
    assert not tfrecord_format.has_subset(str(data_dir), "validation")
    assert tfrecord_format.has_subset(str(data_dir), "train")
    with pytest.raises(Cifar10EstimatorError, match="no validation examples"):
        tfrecord_format.num_examples("validation", str(data_dir))


@pytest.mark.parametrize("value, status, fragments", [
    ("50", 2, ["--validation-examples 50 is out of range", "has 50 training images",
               "pick 0..49"]),
    ("-1", 2, ["--validation-examples", "expected 0 or a positive integer"]),
])
def test_validation_examples_out_of_range_is_a_usage_error(
        tmp_path, cifar_image_folders, value, status, fragments):
    image_dir, _ = cifar_image_folders
    data_dir = tmp_path / "data"

    result = convert(image_dir, data_dir, "--validation-examples", value)

    assert_one_line_error(result, status, *fragments)
    assert output_files(data_dir) == []


def test_archive_flags_with_image_dir_are_a_usage_error(tmp_path, cifar_image_folders):
    image_dir, _ = cifar_image_folders
    result = convert(image_dir, tmp_path / "data", "--md5", "none")
    assert_one_line_error(result, 2, "--md5 is for the archive source")


# --- input that does not fit --------------------------------------------------------------

def _write(path, payload):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as stream:
        stream.write(payload)


def _empty_folder(path):
    shutil.rmtree(path)
    os.makedirs(path)


def _resave_at_size(path, size):
    Image.new("RGB", size, (10, 20, 30)).save(path)


def _truncate(path):
    with open(path, "rb") as stream:
        payload = stream.read()
    _write(path, payload[:len(payload) // 2])


# (how to break the image folders, the path the error names relative to them, fragment)
BAD_INPUTS = {
    "unknown class folder": (lambda root: os.makedirs(os.path.join(root, "train", "unicorn")),
                             "train/unicorn", "is not a CIFAR-10 class folder"),
    "file among class folders": (lambda root: _write(os.path.join(root, "test", "notes.txt"), b"x"),
                                 "test/notes.txt", "is not a CIFAR-10 class folder"),
    "missing class folder": (lambda root: shutil.rmtree(os.path.join(root, "test", "ship")),
                             "test/ship", "does not exist"),
    "missing split folder": (lambda root: shutil.rmtree(os.path.join(root, "test")),
                             "test", "does not exist; --image-dir needs train/ and test/"),
    "empty split folder": (lambda root: _empty_folder(os.path.join(root, "train")),
                           "train", "is empty"),
    "empty class folder": (lambda root: _empty_folder(os.path.join(root, "train", "dog")),
                           "train/dog", "holds no images"),
    "other extension": (lambda root: _write(os.path.join(root, "train", "cat", "0009.gif"), b"G"),
                        "train/cat/0009.gif", "is not a .png/.jpg/.jpeg image file"),
    "folder among images": (lambda root: os.makedirs(os.path.join(root, "train", "cat", "more")),
                            "train/cat/more", "is not a .png/.jpg/.jpeg image file"),
    "text named .png": (lambda root: _write(os.path.join(root, "train", "frog", "0003.png"),
                                            b"not an image"),
                        "train/frog/0003.png", "cannot decode"),
    "truncated jpeg": (lambda root: _truncate(os.path.join(root, "test", "horse", "0001.jpg")),
                       "test/horse/0001.jpg", "cannot decode"),
    "not 32x32": (lambda root: _resave_at_size(os.path.join(root, "train", "deer", "0002.png"),
                                               (33, 32)),
                  "train/deer/0002.png",
                  "is 33x32 pixels (width x height); CIFAR-10 images are 32x32"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_error_line_naming_it_and_writes_nothing(
        tmp_path, cifar_image_folders, case):
    image_dir, _ = cifar_image_folders
    break_folders, named, fragment = BAD_INPUTS[case]
    break_folders(str(image_dir))
    data_dir = tmp_path / "data"

    result = convert(image_dir, data_dir)

    assert_one_line_error(result, 1, os.path.join(str(image_dir), *named.split("/")), fragment)
    assert output_files(data_dir) == []
