"""--patch-pca-init: the first convolution's starting filters from the images' patches."""

import numpy as np
import pytest
import tensorflow as tf

import cifar_archives
from cifar10_estimator import flags, input_fn, model_fn
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import main as trainer
from cifar10_estimator.training import patch_pca


def brute_force_patch_covariance(images, kernel_size):
    standardised = images.astype(np.float64) / 128 - 1
    patches = []
    for image in standardised:
        rows, columns, _ = image.shape
        for row in range(rows - kernel_size + 1):
            for column in range(columns - kernel_size + 1):
                patches.append(image[row:row + kernel_size, column:column + kernel_size].ravel())
    return np.cov(np.array(patches), rowvar=False, bias=True)


def test_patch_covariance_is_that_of_every_patch_in_kernel_order():
    images = np.random.RandomState(0).randint(0, 256, [3, 6, 5, 3]).astype(np.uint8)
    np.testing.assert_allclose(patch_pca.patch_covariance(images, 3),
                               brute_force_patch_covariance(images, 3), rtol=1e-5, atol=1e-6)


def test_the_kernel_is_the_leading_directions_and_their_negatives_of_he_norm():
    # Each image a random colour plus faint noise: the patches vary along one direction
    # above all, each channel's value repeated over the 9 positions.
    random = np.random.RandomState(1)
    colours = random.randint(40, 216, [200, 1, 1, 3])
    images = np.clip(colours + random.randint(-3, 4, [200, 8, 8, 3]), 0, 255).astype(np.uint8)
    kernel = patch_pca.first_conv_kernel(images, 16)

    assert kernel.shape == (3, 3, 3, 16) and kernel.dtype == np.float32
    filters = kernel.reshape(27, 16)
    np.testing.assert_allclose(filters[:, 8:], -filters[:, :8])
    np.testing.assert_allclose(filters[:, :8].T @ filters[:, :8], 2 * np.eye(8), atol=1e-5)
    # The leading filter is constant over the positions: a weighted mean colour.
    leading = kernel[..., 0]
    np.testing.assert_allclose(leading, np.broadcast_to(leading[0, 0], leading.shape), atol=0.02)
    colour_covariance = np.cov(colours.reshape(-1, 3), rowvar=False)
    top_colour = np.linalg.eigh(colour_covariance)[1][:, -1]
    assert abs(np.dot(leading[0, 0] / np.linalg.norm(leading[0, 0]), top_colour)) > 0.99


@pytest.mark.parametrize("filters", [15, 56])
def test_filters_must_be_even_and_within_the_directions(filters):
    images = np.zeros([2, 8, 8, 3], np.uint8)
    with pytest.raises(ValueError, match="filters must be even and at most 54"):
        patch_pca.first_conv_kernel(images, filters)


def test_the_trainer_starts_the_first_convolution_only_for_a_job_without_checkpoints(
        tmp_path):
    data_dir = tmp_path / "data"
    cifar_archives.make_tiny_tfrecords(str(data_dir))
    job_dir = tmp_path / "job"

    def settings(*extra):
        return flags.parse(["--data-dir", str(data_dir), "--job-dir", str(job_dir),
                            "--num-gpus", "0", *extra])

    assert trainer.starting_values(settings()) == {}
    starting_values = trainer.starting_values(settings("--patch-pca-init"))
    assert list(starting_values) == ["resnet/conv2d/kernel"]
    kernel = starting_values["resnet/conv2d/kernel"]
    assert kernel.shape == (3, 3, 3, 16)
    # The name is the training graph's: its first convolution starts from the kernel.
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=4)
    with tf.Graph().as_default():
        images = tf.random.uniform([4, 32, 32, 3], maxval=255.0, seed=1)
        labels = tf.random.uniform([4], maxval=10, dtype=tf.int32, seed=2)
        spec = model_fn.make_model_fn(model_fn.TowerLayout.for_devices(0), hparams,
                                      starting_values=starting_values)(
            *input_fn.split_batch_into_towers(images, labels, 1),
            tf.estimator.ModeKeys.TRAIN, None)
        [first_conv] = [variable for variable in tf.compat.v1.global_variables()
                        if variable.op.name.endswith("/conv2d/kernel")]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer(),
                        feed_dict=spec.scaffold.init_feed_dict)
            np.testing.assert_array_equal(session.run(first_conv), kernel)
    job_dir.mkdir()
    (job_dir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-5"\n')
    (job_dir / "model.ckpt-5.index").write_bytes(b"")
    assert trainer.starting_values(settings("--patch-pca-init")) == {}
