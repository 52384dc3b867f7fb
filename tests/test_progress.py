"""The hooks of the run's progress: their lines, pauses at checkpoints, a cluster's."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.run import progress as run_progress
from cifar10_estimator.run import time_to_go
from test_time_to_go import FakeClock


def train_on_fake_clock(hooks, clock, num_steps, seconds_per_step, first_global_step=0,
                        global_steps_per_step=1, checkpoint_dir=None):
    """Run num_steps steps, each moving the global step by global_steps_per_step and taking
    seconds_per_step on `clock`, in one session with `hooks`."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.get_variable(
            "global_step", [], tf.int64, tf.constant_initializer(first_global_step),
            trainable=False, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                                          tf.compat.v1.GraphKeys.GLOBAL_STEP])
        move_global_step = global_step.assign_add(global_steps_per_step)
        step = tf.numpy_function(
            lambda: np.float32(clock.advance(seconds_per_step) or 0), [], tf.float32)
        with tf.compat.v1.train.SingularMonitoredSession(
                hooks=hooks, checkpoint_dir=checkpoint_dir) as session:
            for _ in range(num_steps):
                # The global step moves outside the hooked run, so the value the hooks
                # fetch is exact (inside it, the read may come before or after the update).
                session.raw_session().run(move_global_step)
                session.run(step)


def progress_lines(messages):
    return [message for message in messages if message.startswith("step ")]


def test_progress_hook_logs_every_n_global_steps_and_when_its_session_ends(
        tensorflow_info_messages):
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step=100, examples_per_global_step=160,
                                      clock=clock)
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=24, seconds_per_step=2.5)
    # A global step of 160 examples each 2.5 s; the first step starts the clock.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 3 min 50 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 3 min 20 s to go",
        "step 24/100 (24 %), 64 examples/sec, about 3 min 10 s to go",
    ]


def test_a_new_session_continues_the_run_and_counts_the_time_between_sessions(
        tensorflow_info_messages):
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step=100, examples_per_global_step=160,
                                      clock=clock)
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=20, seconds_per_step=2.5)
    clock.advance(10)  # e.g. a new session's start
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=10, seconds_per_step=2.5, first_global_step=20)
    # Training: 2.5 .. 50 s and 62.5 .. 85 s; outside: the 10 s between the sessions and
    # the new session's first step. The rate is still a global step each 2.5 s.
    training_secs, outside_secs = 47.5 + 22.5, 10 + 2.5
    seconds_to_go = (100 - 30) * 2.5 * (training_secs + outside_secs) / training_secs
    assert progress.estimate().seconds_to_go == pytest.approx(seconds_to_go)
    # Each session's last line is its line at a multiple of 10, not repeated at its end.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 3 min 50 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 3 min 20 s to go",
        "step 30/100 (30 %), 64 examples/sec, about 3 min 30 s to go",
    ]


class EvaluationAtCheckpoints(tf.compat.v1.train.CheckpointSaverListener):
    """Takes evaluation_secs on `clock` after every checkpoint but the first, and at the end
    if the last one was not evaluated: what train_and_evaluate's own listener does."""

    def __init__(self, clock, evaluation_secs):
        self._clock = clock
        self._evaluation_secs = evaluation_secs
        self._evaluated_step = None

    def after_save(self, session, global_step_value):
        if self._evaluated_step is None:
            self._evaluated_step = global_step_value
            return
        self._evaluate(global_step_value)

    def end(self, session, global_step_value):
        if global_step_value != self._evaluated_step:
            self._evaluate(global_step_value)

    def _evaluate(self, global_step_value):
        self._clock.advance(self._evaluation_secs)
        self._evaluated_step = global_step_value


def test_evaluations_after_checkpoints_count_as_time_outside_training(
        tensorflow_info_messages, tmp_path):
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step=100, examples_per_global_step=160,
                                      clock=clock)
    checkpoint_saver = tf.compat.v1.train.CheckpointSaverHook(
        str(tmp_path), save_steps=10, listeners=[
            run_progress.ProgressCheckpointListener(progress),
            EvaluationAtCheckpoints(clock, evaluation_secs=30)])
    # The Estimator's order: the chief's checkpoint saver before the model_fn's hooks.
    train_on_fake_clock([checkpoint_saver, run_progress.ProgressHook(progress, every_n_steps=10)],
                        clock, num_steps=25, seconds_per_step=2.5, checkpoint_dir=str(tmp_path))
    # One line at each checkpoint, before its evaluation: the hook's own line at steps
    # 10 and 20 is not repeated. The rate stays a global step each 2.5 s; the time to go
    # is stretched by wall time over training time: 77.5 / 47.5 at step 20, 120 / 60 at 25.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 3 min 50 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 5 min 30 s to go",
        "step 25/100 (25 %), 64 examples/sec, about 6 min 20 s to go",
    ]
    assert progress.estimate().seconds_to_go == pytest.approx(75 * 2.5 * 120 / 60)


def test_a_stale_global_step_after_a_checkpoint_does_not_repeat_its_line(
        tensorflow_info_messages):
    # In one run the hook's fetch of the global step may read it before the update: one
    # less than the checkpoint's listener sees after the run.
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step=1000, examples_per_global_step=32,
                                      clock=clock)
    hook = run_progress.ProgressHook(progress, every_n_steps=20)
    listener = run_progress.ProgressCheckpointListener(progress)

    def run_step(fetched_global_step):
        hook.after_run(None, tf.compat.v1.train.SessionRunValues(fetched_global_step, None, None))

    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        hook.begin()
        for fetched_global_step in range(100):
            clock.advance(0.5)
            run_step(fetched_global_step)
        listener.before_save(None, 100)
        clock.advance(30)  # the evaluation, in the same run's after_run
        run_step(99)
        for fetched_global_step in range(100, 121):
            clock.advance(0.5)
            run_step(fetched_global_step)
    assert [line.split()[1] for line in progress_lines(tensorflow_info_messages)] == [
        "20/1000", "40/1000", "60/1000", "80/1000", "100/1000", "120/1000"]


def test_in_a_cluster_every_worker_logs_the_clusters_progress(tensorflow_info_messages):
    # A worker among 3 equally fast asynchronous workers of batch 640: each of its steps
    # of 5 s sees the global step move by 3 (its own and two others').
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step=300, examples_per_global_step=640,
                                      clock=clock)
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=8, seconds_per_step=5, global_steps_per_step=3)
    # Lines where the global step passes a multiple of 10; the cluster's 0.6 global steps
    # of 640 examples per second give the rate and the time to go.
    assert progress_lines(tensorflow_info_messages) == [
        "step 12/300 (4 %), 384 examples/sec, about 8 min to go",
        "step 21/300 (7 %), 384 examples/sec, about 7 min 50 s to go",
        "step 24/300 (8 %), 384 examples/sec, about 7 min 40 s to go",
    ]


def test_progress_hook_needs_a_global_step():
    hook = run_progress.ProgressHook(time_to_go.RunProgress(100, 32))
    with tf.Graph().as_default(), pytest.raises(RuntimeError, match="global step"):
        hook.begin()




class Evaluation(tf.compat.v1.train.CheckpointSaverListener):
    """What train_and_evaluate does after a checkpoint: here, 100 seconds pass."""

    def __init__(self, clock):
        self._clock = clock

    def after_save(self, session, global_step_value):
        self._clock.advance(100)


def test_the_training_timed_for_the_compute_report_leaves_out_the_evaluations(tmp_path):
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step=20, examples_per_global_step=10, clock=clock)
    checkpoint_saver = tf.compat.v1.train.CheckpointSaverHook(
        str(tmp_path), save_steps=5, listeners=[
            run_progress.ProgressCheckpointListener(progress), Evaluation(clock)])
    train_on_fake_clock([checkpoint_saver, run_progress.ProgressHook(progress, every_n_steps=10)],
                        clock, num_steps=20, seconds_per_step=0.5, checkpoint_dir=str(tmp_path))
    # 20 steps: the session's first starts the clock; the evaluations after the
    # checkpoints at steps 5, 10, 15 and 20 are left out.
    assert progress.timed_steps_per_phase == [19]
    assert progress.training_secs == pytest.approx(19 * 0.5)
