"""The learning-rate schedule: the last step, the rate at each step (tensor and numbers)."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.settings import schedule


def rates(hparams, steps):
    """The rate at each global step of `steps`: the tensor the trainer's optimizer reads."""
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = schedule.learning_rate_tensor(hparams, step)
        with tf.compat.v1.Session() as session:
            return [float(session.run(rate, {step: s})) for s in steps]


def rate(hparams, step):
    return rates(hparams, [step])[0]


def learning_rates_at(steps, base, num_train_examples, global_batch_size, **fields):
    return rates(job_hparams.HParams(learning_rate=base, num_train_examples=num_train_examples,
                                     train_batch_size=global_batch_size, **fields), steps)


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


# --- shapes and warm-up ------------------------------------------------------------------

def shaped(shape, warmup_epochs=0.0, **fields):
    # 1000 examples at 100 per step: 10 steps per epoch; 10 epochs: 100 steps.
    return job_hparams.HParams(learning_rate=0.1, num_train_examples=1000, train_batch_size=100,
                               train_epochs=10, learning_rate_schedule=shape,
                               warmup_epochs=warmup_epochs, **fields)


@pytest.mark.parametrize("shape, expected", [
    ("cosine", [0.1, 0.1 * (1 + np.cos(np.pi / 4)) / 2, 0.05, 0.1 * (1 + np.cos(np.pi * 0.99)) / 2,
                0.0, 0.0]),
    ("linear", [0.1, 0.075, 0.05, 0.001, 0.0, 0.0]),
])
def test_smooth_shapes_fall_from_the_base_rate_to_exactly_0_at_the_last_step(shape, expected):
    hparams = shaped(shape)
    steps = [0, 25, 50, 99, 100, 150]
    assert schedule.last_step(hparams) == 100
    rates = learning_rates_at(steps, 0.1, 1000, 100, train_epochs=10,
                              learning_rate_schedule=shape)
    np.testing.assert_allclose(rates, expected, rtol=1e-5, atol=1e-8)
    assert rate(hparams, 100) == 0.0


@pytest.mark.parametrize("shape, after_warmup", [
    # 2 warm-up epochs = 20 steps; the fall then spans steps 20..100.
    ("cosine", [0.1, 0.05, 0.0]),      # steps 20, 60, 100
    ("linear", [0.1, 0.05, 0.0]),
    ("piecewise", [0.1, 0.01, 0.001]),  # drops stay at 50 % and 75 % of the run
])
def test_warm_up_rises_linearly_to_the_base_rate_then_the_shape_follows(shape, after_warmup):
    fields = dict(train_epochs=10, learning_rate_schedule=shape, warmup_epochs=2)
    assert schedule.warmup_steps(shaped(shape, 2)) == 20
    warming = learning_rates_at([0, 9, 19], 0.1, 1000, 100, **fields)
    np.testing.assert_allclose(warming, [0.1 / 20, 0.1 * 10 / 20, 0.1], rtol=1e-5)
    later_steps = [20, 60, 100] if shape != "piecewise" else [20, 51, 76]
    np.testing.assert_allclose(learning_rates_at(later_steps, 0.1, 1000, 100, **fields),
                               after_warmup, rtol=1e-5, atol=1e-8)


def test_a_decaying_label_smoothing_falls_linearly_to_0_at_the_last_step():
    decaying = job_hparams.HParams(train_steps=100, label_smoothing=0.2,
                                   label_smoothing_decay=True)
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        factor = schedule.label_smoothing(decaying, step)
        with tf.compat.v1.Session() as session:
            factors = [float(session.run(factor, {step: s})) for s in (0, 25, 50, 100, 150)]
    np.testing.assert_allclose(factors, [0.2, 0.15, 0.1, 0.0, 0.0], rtol=1e-6, atol=1e-8)
    # Without the decay the factor is the flag's number, the same at every step.
    assert schedule.label_smoothing(job_hparams.HParams(label_smoothing=0.2), None) == 0.2


def test_smooth_shapes_work_with_train_steps_too():
    hparams = job_hparams.HParams(train_steps=40, learning_rate_schedule="linear")
    assert rate(hparams, 20) == pytest.approx(0.05)
    assert schedule.never_drops_warning(hparams) is None  # only the piecewise drops can be missed


@pytest.mark.parametrize("shape, warmup_epochs, described_as", [
    ("cosine", 0, "learning rate 0.1, cosine decay to 0 at step 100"),
    ("linear", 1.5, "learning rate 0.1 reached after a linear warm-up of 15 steps (1.5 epochs), "
                    "linear decay to 0 at step 100"),
    ("piecewise", 0, "learning rate 0.1, x0.1 after step 50, x0.01 after step 75"),
])
def test_the_log_line_states_the_shape(shape, warmup_epochs, described_as):
    line = schedule.describe(shaped(shape, warmup_epochs))
    assert line.startswith("Training to step 100 (10.0 epochs of 1000 examples at 100 per step)")
    assert line.endswith(described_as), line


@pytest.mark.parametrize("sync, last", [(True, 50), (False, 100)])
def test_every_shape_counts_the_global_steps_of_a_cluster(sync, last):
    # 2 workers of 100: with --sync a global step is both batches (10 epochs = 50 steps),
    # without it each worker's batch is a global step of its own (100 steps).
    hparams = shaped("cosine", 1, num_workers=2, sync=sync)
    assert schedule.last_step(hparams) == last
    assert schedule.warmup_steps(hparams) == last // 10
    assert rate(hparams, last) == 0.0
    assert rate(hparams, last // 10) == pytest.approx(0.1)


def test_train_steps_with_named_drops_is_the_papers_schedule_exactly():
    hparams = job_hparams.HParams(train_steps=64000, learning_rate_drops="paper",
                                  num_train_examples=45000, num_layers=20)
    assert schedule.drops(hparams) == ([32000, 48000], (1.0, 0.1, 0.01))
    assert schedule.describe(hparams) == (
        "Training to step 64000 (182.3 epochs of 45000 examples at 128 per step); learning "
        "rate 0.1, x0.1 after step 32000, x0.01 after step 48000")
    assert schedule.never_drops_warning(
        job_hparams.HParams(train_steps=100, learning_rate_drops="paper")) is None
    # Unnamed, a --train-steps run keeps the tutorial's drops at epochs 82 and 123.
    assert schedule.drops(job_hparams.HParams(train_steps=64000, num_train_examples=45000))[0][:2] \
        == [82 * 351, 123 * 351]


@pytest.mark.parametrize("epochs, expected_steps", [(0.0, 0), (1.0, 703), (2.5, 1758)])
def test_low_resolution_steps_are_the_epochs_in_whole_global_steps(epochs, expected_steps):
    hparams = job_hparams.HParams(num_train_examples=45000, train_batch_size=64,
                                  low_resolution_epochs=epochs, train_epochs=10)
    assert schedule.low_resolution_steps(hparams) == expected_steps
    described = schedule.describe(hparams)
    if expected_steps:
        assert described.endswith("; images 24x24 until step %d (%g epochs), then 32x32"
                                  % (expected_steps, epochs))
    else:
        assert "images" not in described


def test_lower_resolution_epochs_come_first_and_the_phases_end_where_their_epochs_add_up():
    # 703 steps an epoch: 16 pixels until 2 epochs (step 1406), 24 until 2 + 3 (3515).
    hparams = job_hparams.HParams(num_train_examples=45000, train_batch_size=64,
                                  lower_resolution_epochs=2.0, lower_resolution=16,
                                  low_resolution_epochs=3.0, train_epochs=10)
    assert schedule.resolution_phases(hparams) == [(16, 1406), (24, 3515)]
    assert schedule.low_resolution_steps(hparams) == 3515
    assert schedule.describe(hparams).endswith(
        "; images 16x16 until step 1406 (2 epochs), 24x24 until step 3515 (3 epochs), "
        "then 32x32")
    alone = job_hparams.HParams(num_train_examples=45000, train_batch_size=64,
                                lower_resolution_epochs=2.0, train_epochs=10)
    assert schedule.resolution_phases(alone) == [(16, 1406)]
    assert schedule.resolution_phases(job_hparams.HParams()) == []
