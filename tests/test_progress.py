"""The run's progress: its rate and time to go, the hook's lines, pauses at checkpoints."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.training import progress as run_progress


class FakeClock:
    """A clock for RunProgress that moves only when told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, secs):
        self.now += secs


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


@pytest.mark.parametrize("secs, text", [
    (0.4, "about 0 s"), (45, "about 45 s"), (89, "about 89 s"), (90, "about 1 min 30 s"),
    (176, "about 3 min"), (271, "about 4 min 30 s"), (594, "about 9 min 50 s"),
    (596, "about 10 min"),
    (21 * 60 + 10, "about 21 min"), (3569, "about 59 min"), (3600, "about 1 h"),
    (95 * 60, "about 1 h 35 min"),
])
def test_durations_read_as_a_person_would_say_them(secs, text):
    assert run_progress.duration_text(secs) == text


def test_progress_line_gives_steps_percent_rate_and_time_to_go():
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=10530, examples_per_global_step=128,
                                        clock=clock)
    progress.record(4000)
    clock.advance(50)
    progress.record(4200)  # 4 global steps/sec of 128 examples
    estimate = progress.estimate()
    assert estimate == run_progress.ProgressEstimate(
        4200, 10530, examples_per_sec=512, seconds_to_go=(10530 - 4200) / 4)
    assert run_progress.progress_line(estimate) == (
        "step 4200/10530 (40 %), 512 examples/sec, about 26 min to go")


def test_time_to_go_is_not_known_before_a_stretch_of_training():
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=10530, examples_per_global_step=128,
                                        clock=clock)
    progress.record(30)
    assert run_progress.progress_line(progress.estimate()) == (
        "step 30/10530 (0 %), time to go not known yet")
    clock.advance(20)
    progress.pause(30)  # paused before a single step: still no rate
    assert progress.estimate().seconds_to_go is None


def test_time_to_go_follows_the_recent_rate_not_the_rate_since_the_start():
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=1000, examples_per_global_step=128,
                                        window_secs=300, clock=clock)
    global_step = 0
    progress.record(global_step)
    for secs, steps in [(60, 10)] * 20 + [(40, 40)] * 10:  # 1200 s slow, then 400 s fast
        clock.advance(secs)
        global_step += steps
        progress.record(global_step)
    # The newest intervals spanning 300 s are all fast: 1 global step/sec. Since the
    # start it would be 600 steps in 1600 s, and 1067 s to go.
    estimate = progress.estimate()
    assert estimate.examples_per_sec == 128
    assert estimate.seconds_to_go == 400


def test_time_outside_training_raises_time_to_go_in_proportion():
    def estimate_after(evaluation_secs):
        clock = FakeClock()
        progress = run_progress.RunProgress(last_step=1000, examples_per_global_step=128,
                                            window_secs=300, clock=clock)
        progress.record(0)
        for global_step in range(50, 301, 50):  # 300 s of training at 1 step/sec
            clock.advance(50)
            progress.record(global_step)
        progress.pause(300)
        clock.advance(evaluation_secs)
        progress.pause(300)  # a second pause (the session's end) changes nothing
        progress.record(300)
        for global_step in (350, 400):
            clock.advance(50)
            progress.record(global_step)
        return progress.estimate()

    without_evaluation, with_evaluation = estimate_after(0), estimate_after(100)
    assert without_evaluation.seconds_to_go == 600
    # The evaluation did not slow the training rate, but it took 100 s of the 500 s
    # so far: the 600 s of training to go are expected to take 500 / 400 as long.
    assert with_evaluation.examples_per_sec == without_evaluation.examples_per_sec == 128
    assert with_evaluation.seconds_to_go == 600 * 500 / 400


def test_progress_hook_logs_every_n_global_steps_and_when_its_session_ends(
        tensorflow_info_messages):
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=100, examples_per_global_step=32,
                                        clock=clock)
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=24, seconds_per_step=0.5)
    # 2 global steps/sec of 32 examples; the first step starts the clock.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 45 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 40 s to go",
        "step 24/100 (24 %), 64 examples/sec, about 38 s to go",
    ]


def test_a_new_session_continues_the_run_and_counts_the_time_between_sessions(
        tensorflow_info_messages):
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=100, examples_per_global_step=32,
                                        clock=clock)
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=20, seconds_per_step=0.5)
    clock.advance(10)  # e.g. an evaluation between two training sessions
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=10, seconds_per_step=0.5, first_global_step=20)
    # Training: 0.5 .. 10 s and 20.5 .. 25 s; outside: the 10 s between the sessions and
    # the new session's first step. The rate is still 2 global steps/sec.
    training_secs, outside_secs = 9.5 + 4.5, 10 + 0.5
    seconds_to_go = (100 - 30) / 2 * (training_secs + outside_secs) / training_secs
    assert progress.estimate().seconds_to_go == pytest.approx(seconds_to_go)
    # Each session's last line is its line at a multiple of 10, not repeated at its end.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 45 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 40 s to go",
        "step 30/100 (30 %), 64 examples/sec, about 61 s to go",
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
    progress = run_progress.RunProgress(last_step=100, examples_per_global_step=32,
                                        clock=clock)
    checkpoint_saver = tf.compat.v1.train.CheckpointSaverHook(
        str(tmp_path), save_steps=10, listeners=[
            run_progress.ProgressCheckpointListener(progress),
            EvaluationAtCheckpoints(clock, evaluation_secs=30)])
    # The Estimator's order: the chief's checkpoint saver before the model_fn's hooks.
    train_on_fake_clock([checkpoint_saver, run_progress.ProgressHook(progress, every_n_steps=10)],
                        clock, num_steps=25, seconds_per_step=0.5, checkpoint_dir=str(tmp_path))
    # One line at each checkpoint, before its evaluation: the hook's own line at steps
    # 10 and 20 is not repeated. The rate stays 2 global steps/sec; time to go is
    # stretched by wall time over training time: 39.5 / 9.5 at step 20, 72 / 12 at 25.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 45 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 2 min 50 s to go",
        "step 25/100 (25 %), 64 examples/sec, about 3 min 50 s to go",
    ]
    assert progress.estimate().seconds_to_go == pytest.approx(75 / 2 * 72 / 12)


def test_a_stale_global_step_after_a_checkpoint_does_not_repeat_its_line(
        tensorflow_info_messages):
    # In one run the hook's fetch of the global step may read it before the update: one
    # less than the checkpoint's listener sees after the run.
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=1000, examples_per_global_step=32,
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
        listener.after_save(None, 100)
        clock.advance(30)  # the evaluation, in the same run's after_run
        run_step(99)
        for fetched_global_step in range(100, 121):
            clock.advance(0.5)
            run_step(fetched_global_step)
    assert [line.split()[1] for line in progress_lines(tensorflow_info_messages)] == [
        "20/1000", "40/1000", "60/1000", "80/1000", "100/1000", "120/1000"]


def test_in_a_cluster_every_worker_logs_the_clusters_progress(tensorflow_info_messages):
    # A worker among 3 equally fast asynchronous workers of batch 32: each of its steps
    # of 0.25 s sees the global step move by 3 (its own and two others').
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=300, examples_per_global_step=32,
                                        clock=clock)
    train_on_fake_clock([run_progress.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=8, seconds_per_step=0.25, global_steps_per_step=3)
    # Lines where the global step passes a multiple of 10; the cluster's 12 global steps
    # of 32 examples per second give the rate and the time to go.
    assert progress_lines(tensorflow_info_messages) == [
        "step 12/300 (4 %), 384 examples/sec, about 24 s to go",
        "step 21/300 (7 %), 384 examples/sec, about 23 s to go",
        "step 24/300 (8 %), 384 examples/sec, about 23 s to go",
    ]


def test_progress_hook_needs_a_global_step():
    hook = run_progress.ProgressHook(run_progress.RunProgress(100, 32))
    with tf.Graph().as_default(), pytest.raises(RuntimeError, match="global step"):
        hook.begin()


def train_steady(progress, clock, from_step, to_step, steps_per_sec, every=10):
    for global_step in range(from_step + every, to_step + 1, every):
        clock.advance(every / steps_per_sec)
        progress.record(global_step)


def test_a_phase_not_yet_trained_is_rated_from_the_one_before_by_its_cost():
    # The first 100 steps on images of half the pixels, then 200 on full-size images.
    clock = FakeClock()
    progress = run_progress.RunProgress(
        last_step=300, examples_per_global_step=10, clock=clock,
        phases=(run_progress.TrainingPhase(100, relative_cost=0.5),
                run_progress.TrainingPhase(300)))
    progress.record(0)
    train_steady(progress, clock, 0, 60, steps_per_sec=2)
    # 40 steps to go at 2 a second; full-size steps cost twice as much: 1 a second.
    estimate = progress.estimate()
    assert estimate.examples_per_sec == 20
    assert estimate.seconds_to_go == pytest.approx(40 / 2 + 200 / 1)
    train_steady(progress, clock, 60, 100, steps_per_sec=2)
    # Its first steps, less than PHASE_SETTLING_SECS: still rated from the phase before.
    train_steady(progress, clock, 100, 110, steps_per_sec=1.5)
    assert progress.estimate().seconds_to_go == pytest.approx(190 / 1)
    # Settled: its own rate.
    train_steady(progress, clock, 110, 160, steps_per_sec=1.5)
    estimate = progress.estimate()
    assert estimate.examples_per_sec == pytest.approx(15)
    assert estimate.seconds_to_go == pytest.approx(140 / 1.5)


def test_the_evaluations_to_come_are_timed_from_training_until_one_is_measured():
    clock = FakeClock()
    plan = run_progress.EvaluationPlan(
        every_secs=100, views_per_evaluation=1000, final_views=3000,
        num_final_evaluations=2, exports_per_evaluation=1, checkpoint_every_secs=100)
    progress = run_progress.RunProgress(last_step=200, examples_per_global_step=10,
                                        clock=clock, evaluations=plan)
    progress.record(0)
    train_steady(progress, clock, 0, 50, steps_per_sec=1)
    # 10 training examples a second: 50 views a second.
    set_up = run_progress.EVALUATION_SET_UP_SECS
    evaluation = 1000 / 50 + set_up + run_progress.EXPORT_SECS
    final = 3000 / 50 + 2 * set_up + run_progress.EXPORT_SECS
    # 150 s of training to go, 50 s after the start: one evaluation comes within it.
    assert progress.estimate().seconds_to_go == pytest.approx(150 + evaluation + final)

    progress.pause(50)
    progress.add_evaluation(start=clock(), secs=set_up + 18, views=1000)
    clock.advance(set_up + 18)
    progress.record(50)
    # Measured: 18 ms a view; the evaluation's time is not training's.
    evaluation = 18 + set_up + run_progress.EXPORT_SECS
    final = 3000 * 0.018 + 2 * set_up + run_progress.EXPORT_SECS
    estimate = progress.estimate()
    assert estimate.examples_per_sec == 10
    assert estimate.seconds_to_go == pytest.approx(150 + evaluation + final)


def test_training_phases_follow_the_low_resolution_epochs():
    from cifar10_estimator import hparams as job_hparams
    hparams = job_hparams.HParams(train_steps=1000, low_resolution_epochs=0.5,
                                  low_resolution=24, num_train_examples=64000,
                                  train_batch_size=128)
    assert run_progress.training_phases(hparams, 32) == (
        run_progress.TrainingPhase(250, pytest.approx(0.25 + 0.75 * (24 / 32) ** 2)),
        run_progress.TrainingPhase(1000))
    assert run_progress.training_phases(job_hparams.HParams(train_steps=1000), 32) == (
        run_progress.TrainingPhase(1000),)
    three = job_hparams.HParams(train_steps=1000, lower_resolution_epochs=0.25,
                                lower_resolution=16, low_resolution_epochs=0.5,
                                low_resolution=24, num_train_examples=64000,
                                train_batch_size=128)
    assert run_progress.training_phases(three, 32) == (
        run_progress.TrainingPhase(125, pytest.approx(0.25 + 0.75 * (16 / 32) ** 2)),
        run_progress.TrainingPhase(375, pytest.approx(0.25 + 0.75 * (24 / 32) ** 2)),
        run_progress.TrainingPhase(1000))


def test_a_phases_slow_first_seconds_rate_it_only_until_it_has_trained_longer():
    clock = FakeClock()
    progress = run_progress.RunProgress(last_step=1000, examples_per_global_step=10,
                                        clock=clock)
    progress.record(0)
    # The first PHASE_SETTLING_SECS at 1 step a second: all there is, so they rate it.
    train_steady(progress, clock, 0, 20, steps_per_sec=1)
    assert progress.estimate().examples_per_sec == 10
    # After them, 4 steps a second: the slow start no longer counts.
    train_steady(progress, clock, 20, 100, steps_per_sec=4)
    estimate = progress.estimate()
    assert estimate.examples_per_sec == 40
    assert estimate.seconds_to_go == pytest.approx(900 / 4)
