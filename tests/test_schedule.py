"""The learning-rate schedule: the last step, the rate at each step (tensor and numbers)."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import schedule


def learning_rates_at(steps, base, num_train_examples, global_batch_size, **fields):
    hparams = job_hparams.HParams(learning_rate=base, num_train_examples=num_train_examples,
                                  train_batch_size=global_batch_size, **fields)
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = schedule.learning_rate_tensor(hparams, step)
        with tf.compat.v1.Session() as session:
            rates = [session.run(rate, {step: s}) for s in steps]
    # The log and the tests read the same schedule as plain numbers.
    np.testing.assert_allclose([schedule.learning_rate_at(hparams, s) for s in steps], rates,
                               rtol=1e-6)
    return rates


def test_learning_rate_drops_at_epochs_82_123_300_of_the_global_batch():
    # 1000 examples, 2 workers x 10 = 20 per global step: 50 steps per epoch.
    steps = [0, 4100, 4101, 6150, 6151, 15000, 15001, 10 ** 7]
    rates = learning_rates_at(steps, 0.1, 1000, 20)
    np.testing.assert_allclose(rates, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.0002, 0.0002],
                               rtol=1e-6)


def test_learning_rate_epochs_count_the_real_number_of_examples():
    # The full data set: 40000 / 128 = 312 whole steps per epoch.
    rates = learning_rates_at([82 * 312, 82 * 312 + 1], 0.1, 40000, 128)
    np.testing.assert_allclose(rates, [0.1, 0.01], rtol=1e-6)


def test_train_epochs_sets_the_last_step_from_the_global_batch():
    # 40000 / 128 = 312 whole steps per epoch; with --sync and 2 workers, 40000 / 256 = 156.
    assert schedule.last_step(job_hparams.HParams(train_epochs=30)) == 9360
    assert schedule.last_step(job_hparams.HParams(
        train_epochs=30, num_workers=2, sync=True)) == 4680
    assert schedule.last_step(job_hparams.HParams(
        train_epochs=2.5, num_train_examples=50000)) == 975


@pytest.mark.parametrize("drops, boundaries", [
    ("paper", [4680, 7020]),        # 50 % and 75 % of 9360 steps
    ("tutorial", [2998, 4497]),     # 82/256 and 123/256 of 9360 steps
])
def test_train_epochs_places_the_drops_in_proportion_to_the_run(drops, boundaries):
    hparams = job_hparams.HParams(train_epochs=30, learning_rate_drops=drops)
    assert schedule.drops(hparams) == (boundaries, (1.0, 0.1, 0.01))
    steps = [0, boundaries[0], boundaries[0] + 1, boundaries[1], boundaries[1] + 1, 9360]
    rates = learning_rates_at(steps, 0.1, 40000, 128, train_epochs=30, learning_rate_drops=drops)
    np.testing.assert_allclose(rates, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


@pytest.mark.parametrize("batch, workers, sync, scaling, expected", [
    (128, 1, False, "none", 0.1),
    (128, 4, True, "none", 0.1),      # the original: 0.1 whatever the global batch
    (128, 1, False, "linear", 0.1),   # the reference batch itself
    (128, 2, True, "linear", 0.2),    # --sync: a global batch of 256
    (128, 4, False, "linear", 0.1),   # async: every update is one worker's batch of 128
    (64, 1, False, "linear", 0.05),
])
def test_linear_scaling_follows_the_global_batch(batch, workers, sync, scaling, expected):
    hparams = job_hparams.HParams(train_batch_size=batch, num_workers=workers, sync=sync,
                                  learning_rate_scaling=scaling)
    assert schedule.base_learning_rate(hparams) == pytest.approx(expected)


def test_the_scaled_rate_is_the_one_the_schedule_starts_from_and_drops():
    # 2 workers x 128 with --sync: 256 per step, 156 steps per epoch; drops at epochs 82 and 123.
    rates = learning_rates_at([0, 82 * 156, 82 * 156 + 1, 123 * 156 + 1], 0.1, 40000, 128,
                              num_workers=2, sync=True, learning_rate_scaling="linear")
    np.testing.assert_allclose(rates, [0.2, 0.2, 0.02, 0.002], rtol=1e-6)


def test_without_train_epochs_the_drops_are_the_tutorials_epochs():
    boundaries, factors = schedule.drops(job_hparams.HParams())
    assert boundaries == [82 * 312, 123 * 312, 300 * 312]
    assert factors == (1.0, 0.1, 0.01, 0.002)
