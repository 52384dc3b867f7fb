"""The progressive phases' area resize: TensorFlow's pixels, from ops a GPU has."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.training import area_resize


@pytest.mark.parametrize("side", [8, 16, 20, 24, 28, 32])
def test_area_resize_gives_tensorflows_area_pixels(side):
    images = np.random.default_rng(side).integers(0, 256, (3, 32, 32, 3)).astype(np.float32)
    expected = tf.image.resize(images, [side, side], method="area").numpy()
    resized = area_resize.area_resize(tf.constant(images), side).numpy()
    assert resized.shape == (3, side, side, 3)
    # float32 rounding only: 8-bit pixels are 1 apart, TensorFlow sums in another order.
    np.testing.assert_allclose(resized, expected, rtol=0, atol=2e-3)


def test_each_output_pixel_shares_out_exactly_its_footprint():
    weights = area_resize.area_weights(32, 24)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-6)
    # Every input pixel counts as much as any other: 24 outputs of 4/3 pixels each.
    np.testing.assert_allclose(weights.sum(axis=0), 24 / 32, rtol=1e-6)
    np.testing.assert_allclose(weights[0, :2], [0.75, 0.25])
