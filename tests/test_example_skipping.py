"""--skip-learned: steps leave out learned examples, weigh for them, and count what they train."""

import json

import numpy as np
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.training import example_skipping
from cli_helpers import assert_one_line_error, run_module

TRAINER = "cifar10_estimator.main"
NUM_EXAMPLES = 256
BATCH = 128


def chosen(kept_losses, batch_indices, fraction=0.5, global_step=10, stop_step=100):
    """(positions, weights) that choose() gives for a batch, the losses table set."""
    with tf.Graph().as_default():
        skipping = example_skipping.LearnedExampleSkipping(
            fraction, NUM_EXAMPLES, stop_step, phase_ends=[50])
        step = tf.constant(global_step, tf.int64)
        positions, weights = skipping.choose(tf.constant(batch_indices, tf.int64), step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(skipping.losses.assign(kept_losses))
            return session.run([positions, weights])


def half_learned_losses():
    """Examples 0..127 learned (loss 0.1), 128..255 not (loss 3): the mean is 1.55."""
    return np.where(np.arange(NUM_EXAMPLES) < 128, 0.1, 3.0).astype(np.float32)


def test_a_step_keeps_every_unlearned_example_and_about_r_of_the_learned_ones():
    batch = np.arange(64, 192)  # 64 learned, 64 not
    positions, weights = chosen(half_learned_losses(), batch, fraction=0.5)
    trained = batch[positions]
    assert set(range(128, 192)) <= set(trained)
    num_learned = int(np.sum(trained < 128))
    assert len(trained) % example_skipping.kept_multiple(BATCH) == 0
    assert 16 <= num_learned <= 48  # binomial(64, 0.5) rounded up to 16: far inside
    assert len(set(trained)) == len(trained)
    # The learned examples that stay weigh for the 64: the weights sum to the batch.
    np.testing.assert_allclose(weights[trained < 128], 64 / num_learned, rtol=1e-6)
    np.testing.assert_allclose(weights[trained >= 128], 1.0)
    np.testing.assert_allclose(np.sum(weights), len(batch), rtol=1e-5)


def test_unseen_examples_and_the_last_eighth_train_everything():
    unseen = np.full(NUM_EXAMPLES, np.inf, np.float32)
    positions, weights = chosen(unseen, np.arange(BATCH))
    assert sorted(positions) == list(range(BATCH))
    positions, weights = chosen(half_learned_losses(), np.arange(BATCH), global_step=100)
    assert sorted(positions) == list(range(BATCH))
    np.testing.assert_allclose(weights, 1.0)


def test_the_draws_follow_the_step_so_a_resumed_run_draws_the_same():
    first = chosen(half_learned_losses(), np.arange(BATCH), global_step=7)[0]
    again = chosen(half_learned_losses(), np.arange(BATCH), global_step=7)[0]
    later = chosen(half_learned_losses(), np.arange(BATCH), global_step=8)[0]
    assert sorted(first) == sorted(again)
    assert sorted(first) != sorted(later)


def test_the_stop_step_is_the_last_eighth_of_the_run():
    hparams = job_hparams.HParams(train_steps=800)
    assert example_skipping.skipping_stop_step(hparams) == 700


def test_a_run_trains_fewer_examples_than_its_steps_take_and_counts_them_per_phase(
        tiny_data_dir, tmp_path):
    # 64 training examples at batch 16: 4 steps an epoch, 40 steps, the first 8 at 16
    # pixels; skipping from the second epoch to step 35, kept counts rounded up to 2.
    job_dir = tmp_path / "job"
    result = run_module(TRAINER, [
        "--data-dir", tiny_data_dir, "--job-dir", job_dir, "--num-gpus", "0",
        "--num-layers", "8", "--train-steps", "40", "--train-batch-size", "16",
        "--eval-batch-size", "16", "--lower-resolution-epochs", "2",
        "--skip-learned", "0.9", "--seed", "3"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    reader = tf.train.load_checkpoint(str(job_dir))
    counts = reader.get_tensor("example_skipping/examples_trained")
    # The 16-pixel phase's first epoch is all unseen; after it, learned examples are
    # left out, and the last 5 steps take every example.
    assert counts[0] >= 4 * 16
    assert counts[0] + counts[1] < 40 * 16
    assert counts[1] >= 5 * 16
    losses = reader.get_tensor("example_skipping/losses")
    assert np.all(np.isfinite(losses)) and np.all(losses >= 0)
    # The compute the run reports is that of the examples it kept.
    assert "at most" in result.stderr.split("TFLOP of training")[0].splitlines()[-1]
    compute = json.loads((job_dir / "test_results.json").read_text())["training_compute"]
    assert [phase["examples"] for phase in compute["phases"]] == list(counts)
    assert compute["tflop"] < compute["planned_tflop"]
    np.testing.assert_allclose(compute["tflop"], sum(
        phase["mflop_per_example"] * 1e6 * phase["examples"] for phase in compute["phases"]) / 1e12,
        rtol=1e-9)
    assert "% of every example's" in result.stdout


def test_a_rate_of_one_is_refused_in_one_line(tiny_data_dir, tmp_path):
    result = run_module(TRAINER, [
        "--data-dir", tiny_data_dir, "--job-dir", tmp_path / "job", "--num-gpus", "0",
        "--skip-learned", "1"], timeout=120)
    assert_one_line_error(result, 2, "--skip-learned", "1 excluded")


def test_synthetic_data_with_skipping_is_refused_in_one_line(tmp_path):
    result = run_module(TRAINER, [
        "--use-synthetic-data", "--job-dir", tmp_path / "job", "--num-gpus", "0",
        "--skip-learned", "0.5"], timeout=120)
    assert_one_line_error(result, 2, "--skip-learned", "--use-synthetic-data")
