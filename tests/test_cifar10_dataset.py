"""Cifar10DataSet: batches, order, shuffling, augmentation, counts and errors."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import cifar_archives
from cifar10_estimator import cifar10
from cifar10_estimator.errors import Cifar10EstimatorError

SUBSETS = ("train", "validation", "eval")


def as_hwc(images_chw_flat):
    """Images as written (uint8 [N, 3072], channel-major) in the pipeline's [N, 32, 32, 3]."""
    return images_chw_flat.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def run_batches(data_dir, subset, batch_size, num_batches, use_distortion=True, seed=1,
                **augmentation):
    """(images, labels) of num_batches batches, concatenated, read as an input_fn would;
    `augmentation` are AugmentationConfig fields."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(seed)
        images, labels = cifar10.Cifar10DataSet(
            str(data_dir), subset, use_distortion, cifar10.AugmentationConfig(**augmentation)
        ).make_batch(batch_size)
        with tf.compat.v1.Session() as session:
            batches = [session.run([images, labels]) for _ in range(num_batches)]
    return (np.concatenate([b[0] for b in batches]),
            np.concatenate([b[1] for b in batches]))


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    """(data_dir, subsets): tiny TFRecords (64/16/32) and the arrays written to them."""
    data_dir = tmp_path_factory.mktemp("tiny_records")
    return data_dir, cifar_archives.make_tiny_tfrecords(str(data_dir))


NUM_PATTERNED_IMAGES = 32


def patterned_image(image_id):
    """A 32x32x3 image whose every pixel tells where it came from: (row+1, column+1, id+1).

    No value is 0, so zero padding is told apart from image content.
    """
    rows, columns = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    return np.stack([rows + 1, columns + 1, np.full_like(rows, image_id + 1)],
                    axis=-1).astype(np.uint8)


@pytest.fixture(scope="module")
def patterned_data_dir(tmp_path_factory):
    """A train file of NUM_PATTERNED_IMAGES patterned images (label = id % 10)."""
    data_dir = tmp_path_factory.mktemp("patterned")
    images = np.stack([patterned_image(i) for i in range(NUM_PATTERNED_IMAGES)])
    images_chw_flat = images.transpose(0, 3, 1, 2).reshape(NUM_PATTERNED_IMAGES, -1)
    labels = np.arange(NUM_PATTERNED_IMAGES) % 10
    cifar_archives.write_tfrecords_the_original_way(
        str(data_dir), {"train": (images_chw_flat, labels)})
    return data_dir


def recover_crop(output):
    """(image id, row offset, column offset, flipped) of one output of the patterned file.

    The centre pixel is inside the source image for every offset 0..8; the caller
    checks the whole output against the crop these values describe.
    """
    centre = output[16, 16].astype(int)
    flipped = output[16, 17, 1] < output[16, 16, 1]
    row_offset = centre[0] - 13
    column_offset = centre[1] - (12 if flipped else 13)
    return centre[2] - 1, row_offset, column_offset, bool(flipped)


def expected_crop(image_id, row_offset, column_offset, flipped):
    padded = np.pad(patterned_image(image_id), ((4, 4), (4, 4), (0, 0)))
    crop = padded[row_offset:row_offset + 32, column_offset:column_offset + 32]
    return crop[:, ::-1] if flipped else crop


@pytest.mark.parametrize("subset", SUBSETS)
def test_batches_are_float_images_and_int_labels_with_static_shapes(tiny_records, subset):
    data_dir, _ = tiny_records
    with tf.Graph().as_default():
        images, labels = cifar10.Cifar10DataSet(str(data_dir), subset).make_batch(8)
        assert images.shape.as_list() == [8, 32, 32, 3]
        assert labels.shape.as_list() == [8]
        assert (images.dtype, labels.dtype) == (tf.float32, tf.int32)
        with tf.compat.v1.Session() as session:
            image_values, label_values = session.run([images, labels])
    assert image_values.min() >= 0 and image_values.max() <= 255
    assert np.array_equal(image_values, np.round(image_values))
    assert image_values.max() > 200
    assert set(label_values) <= set(range(10))


@pytest.mark.parametrize("subset", ["validation", "eval"])
def test_validation_and_eval_come_unchanged_in_file_order_and_repeat(tiny_records, subset):
    data_dir, subsets = tiny_records
    written_images, written_labels = subsets[subset]
    num_examples = len(written_labels)
    # 12 divides neither count, so batches straddle epoch boundaries as in the original.
    images, labels = run_batches(data_dir, subset, batch_size=12, num_batches=7,
                                 use_distortion=True)
    order = np.arange(len(labels)) % num_examples
    np.testing.assert_array_equal(images, as_hwc(written_images)[order].astype(np.float32))
    np.testing.assert_array_equal(labels, written_labels[order])


def test_train_without_distortion_serves_every_example_once_per_epoch_shuffled(tiny_records):
    data_dir, subsets = tiny_records
    written_images, written_labels = subsets["train"]
    index_of_image = {image.tobytes(): i for i, image in enumerate(as_hwc(written_images))}
    assert len(index_of_image) == 64
    images, labels = run_batches(data_dir, "train", batch_size=16, num_batches=8,
                                 use_distortion=False)

    indices = np.array([index_of_image[image.astype(np.uint8).tobytes()] for image in images])
    np.testing.assert_array_equal(labels, written_labels[indices])
    first_epoch, second_epoch = indices[:64], indices[64:]
    assert sorted(first_epoch) == list(range(64))
    assert sorted(second_epoch) == list(range(64))
    assert list(first_epoch) != list(range(64))
    assert list(second_epoch) != list(first_epoch)


def test_distortion_is_the_tutorials_pad_crop_and_flip_independently_per_image(
        patterned_data_dir):
    batch_size, num_batches = 96, 32
    images, labels = run_batches(patterned_data_dir, "train", batch_size, num_batches)
    crops = [recover_crop(image) for image in images]

    for image, crop in zip(images, crops):
        np.testing.assert_array_equal(image, expected_crop(*crop).astype(np.float32))
    image_ids = np.array([crop[0] for crop in crops])
    np.testing.assert_array_equal(labels, image_ids % 10)
    for batch_ids in image_ids.reshape(num_batches, batch_size):
        # A batch is three shuffled epochs of the 32 images.
        assert sorted(collections.Counter(batch_ids).values()) == [3] * NUM_PATTERNED_IMAGES

    cells = collections.Counter((row, column, flipped) for _, row, column, flipped in crops)
    assert {(row, column) for row, column, _ in cells} == {
        (row, column) for row in range(9) for column in range(9)}
    num_samples = len(crops)
    num_cells = 9 * 9 * 2
    expected_per_cell = num_samples / num_cells
    chi_square = sum((cells.get((r, c, f), 0) - expected_per_cell) ** 2 / expected_per_cell
                     for r in range(9) for c in range(9) for f in (False, True))
    degrees_of_freedom = num_cells - 1
    assert chi_square < degrees_of_freedom + 4 * np.sqrt(2 * degrees_of_freedom)

    flips = np.array([crop[3] for crop in crops]).reshape(num_batches, batch_size)
    assert abs(flips.mean() - 0.5) < 4 * np.sqrt(0.25 / num_samples)
    assert all(0 < batch_flips.sum() < batch_size for batch_flips in flips)


@pytest.mark.parametrize("max_shift", [0, 2])
def test_a_smaller_max_shift_keeps_crops_within_it_of_the_centre(patterned_data_dir, max_shift):
    images, _ = run_batches(patterned_data_dir, "train", 96, 8, train_max_shift=max_shift)
    crops = [recover_crop(image) for image in images]
    for image, crop in zip(images, crops):
        np.testing.assert_array_equal(image, expected_crop(*crop).astype(np.float32))
    offsets = {(row, column) for _, row, column, _ in crops}
    allowed = range(4 - max_shift, 4 + max_shift + 1)
    assert offsets == {(row, column) for row in allowed for column in allowed}
    flips = [crop[3] for crop in crops]
    assert 0 < sum(flips) < len(flips)


def test_alternating_flips_mirror_each_image_in_every_other_epoch(patterned_data_dir):
    # 32 images, batches of 16: epoch e is batches 2e and 2e + 1.
    num_epochs = 6
    images, _ = run_batches(patterned_data_dir, "train", 16, 2 * num_epochs,
                            alternating_flips=True)
    flipped = np.zeros([num_epochs, NUM_PATTERNED_IMAGES], bool)
    for position, image in enumerate(images):
        image_id, row, column, is_flipped = recover_crop(image)
        np.testing.assert_array_equal(
            image, expected_crop(image_id, row, column, is_flipped).astype(np.float32))
        flipped[position // NUM_PATTERNED_IMAGES, image_id] = is_flipped
    assert 0 < flipped[0].sum() < NUM_PATTERNED_IMAGES  # the first epoch's are drawn
    for epoch in range(1, num_epochs):
        np.testing.assert_array_equal(flipped[epoch], ~flipped[epoch - 1])


def test_a_max_shift_beyond_the_padding_is_refused():
    with pytest.raises(ValueError, match="train_max_shift must be 0..4"):
        cifar10.AugmentationConfig(train_max_shift=5)


def test_a_graph_seed_makes_shuffling_and_augmentation_reproducible(tiny_records):
    data_dir, _ = tiny_records
    first = run_batches(data_dir, "train", batch_size=16, num_batches=6, seed=7)
    again = run_batches(data_dir, "train", batch_size=16, num_batches=6, seed=7)
    other = run_batches(data_dir, "train", batch_size=16, num_batches=6, seed=8)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])


def test_make_dataset_also_runs_eagerly(tiny_records):
    data_dir, _ = tiny_records
    images, labels = next(iter(cifar10.Cifar10DataSet(str(data_dir), "train").make_dataset(8)))
    assert images.shape == (8, 32, 32, 3) and labels.shape == (8,)


@pytest.mark.parametrize("subset", SUBSETS)
def test_read_all_examples_gives_each_example_once_as_written(tiny_records, subset):
    data_dir, subsets = tiny_records
    written_images, written_labels = subsets[subset]
    images, labels = cifar10.Cifar10DataSet(str(data_dir), subset).read_all_examples()
    assert (images.dtype, labels.dtype) == (np.uint8, np.int64)
    np.testing.assert_array_equal(images, as_hwc(written_images))
    np.testing.assert_array_equal(labels, written_labels)


def test_read_all_examples_can_stop_after_the_first_few(tiny_records):
    data_dir, subsets = tiny_records
    written_images, written_labels = subsets["train"]
    images, labels = cifar10.Cifar10DataSet(str(data_dir), "train").read_all_examples(5)
    np.testing.assert_array_equal(images, as_hwc(written_images)[:5])
    np.testing.assert_array_equal(labels, written_labels[:5])


def test_read_all_examples_of_an_empty_file_is_empty(tmp_path):
    cifar_archives.write_tfrecords_the_original_way(
        str(tmp_path), {"eval": (np.zeros([0, 3072], np.uint8), np.zeros([0], np.int64))})
    images, labels = cifar10.Cifar10DataSet(str(tmp_path), "eval").read_all_examples()
    assert images.shape == (0, 32, 32, 3) and labels.shape == (0,)


def test_make_batch_feeds_an_estimator_for_several_epochs(tiny_data_dir, tmp_path):
    batch_size = 48  # 6 training steps read the 64 training images 4.5 times

    def input_fn(subset):
        def make_batch():
            with tf.device("/cpu:0"):
                return cifar10.Cifar10DataSet(str(tiny_data_dir), subset).make_batch(batch_size)
        return make_batch

    def model_fn(features, labels, mode):
        weights = tf.compat.v1.get_variable("weights", [32 * 32 * 3, 10],
                                            initializer=tf.compat.v1.zeros_initializer())
        logits = tf.matmul(tf.reshape(features / 255.0, [batch_size, -1]), weights)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(input_fn("train"), steps=6)
    metrics = estimator.evaluate(input_fn("eval"), steps=2)
    assert metrics["global_step"] == 6 and np.isfinite(metrics["loss"])


def test_num_examples_per_epoch_reads_the_metadata_file(tiny_data_dir):
    counts = {subset: cifar10.Cifar10DataSet.num_examples_per_epoch(subset, str(tiny_data_dir))
              for subset in SUBSETS}
    assert counts == {"train": 64, "validation": 16, "eval": 32}
    assert cifar10.Cifar10DataSet(str(tiny_data_dir), "eval").num_examples_per_epoch() == 32


def test_num_examples_per_epoch_on_an_instance_counts_its_own_data(tiny_data_dir):
    dataset = cifar10.Cifar10DataSet(str(tiny_data_dir), "eval")
    assert dataset.num_examples_per_epoch() == 32
    assert dataset.num_examples_per_epoch("train") == 64  # the original's call, with metadata


def test_num_examples_per_epoch_falls_back_to_the_official_split(tmp_path, tiny_records):
    _, subsets = tiny_records
    cifar_archives.write_tfrecords_the_original_way(
        str(tmp_path), {"train": subsets["train"]}, write_metadata=False)
    assert [cifar10.Cifar10DataSet.num_examples_per_epoch(s) for s in SUBSETS] == [
        40000, 10000, 10000]
    assert cifar10.Cifar10DataSet.num_examples_per_epoch("train", str(tmp_path)) == 40000
    assert cifar10.Cifar10DataSet(str(tmp_path), "train").num_examples_per_epoch() == 40000


def test_unknown_subset_names_the_valid_ones(tiny_data_dir):
    with pytest.raises(ValueError, match="train, validation, eval.*'test'"):
        cifar10.Cifar10DataSet(str(tiny_data_dir), "test")
    with pytest.raises(ValueError, match="train, validation, eval"):
        cifar10.Cifar10DataSet.num_examples_per_epoch("training")


def test_missing_data_directory_names_it_and_the_converter(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(Cifar10EstimatorError) as raised:
        cifar10.Cifar10DataSet(str(missing), "train")
    assert str(missing) in str(raised.value)
    assert "python -m cifar10_estimator.generate_tfrecords --data-dir" in str(raised.value)


def test_missing_subset_file_names_it_and_the_converter(tmp_path, tiny_records):
    _, subsets = tiny_records
    cifar_archives.write_tfrecords_the_original_way(str(tmp_path), {"train": subsets["train"]})
    with pytest.raises(Cifar10EstimatorError) as raised:
        cifar10.Cifar10DataSet(str(tmp_path), "eval")
    assert str(tmp_path / "eval.tfrecords") in str(raised.value)
    assert "generate_tfrecords --data-dir %s" % tmp_path in str(raised.value)
