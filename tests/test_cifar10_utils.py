"""Training helpers: the examples/sec and progress hooks, local device setters, greedy load
balancing."""

import re
import time

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10_utils

LOG_LINE = re.compile(r"^Average examples/sec: (\S+) \((\S+)\), step = (\S+)$")


def train_with_hook(hook, num_steps, seconds_per_step, first_global_step=0):
    """Run num_steps steps, each sleeping seconds_per_step; return the wall time in seconds."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.get_variable(
            "global_step", [], tf.int64, tf.constant_initializer(first_global_step),
            trainable=False, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                                          tf.compat.v1.GraphKeys.GLOBAL_STEP])
        sleep = tf.numpy_function(lambda: np.float32(time.sleep(seconds_per_step) or 0), [],
                                  tf.float32)
        with tf.control_dependencies([sleep]):
            train_op = global_step.assign_add(1)
        with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as session:
            start = time.time()
            for _ in range(num_steps):
                session.run(train_op)
            return time.time() - start


def logged_rates(messages):
    """(average, current, steps) of every examples/sec line among messages."""
    lines = [message for message in messages if message.startswith("Average examples/sec")]
    for line in lines:
        assert LOG_LINE.match(line), line
    return [tuple(float(number) for number in LOG_LINE.match(line).groups()) for line in lines]


def test_examples_per_second_hook_logs_plausible_rates(tensorflow_info_messages):
    batch_size, seconds_per_step = 32, 0.01
    wall_secs = train_with_hook(
        cifar10_utils.ExamplesPerSecondHook(batch_size, every_n_steps=5),
        num_steps=21, seconds_per_step=seconds_per_step, first_global_step=1000)
    rates = logged_rates(tensorflow_info_messages)
    fastest_possible = batch_size / seconds_per_step
    slowest_possible = batch_size * 20 / wall_secs
    for average, current, steps in rates:
        assert 0 < average <= fastest_possible
        assert 0 < current <= fastest_possible
        assert average >= slowest_possible * 0.9
    # The first trigger starts the clock; then every 5 steps the hook logs how
    # many steps of its own it has timed (not the global step), as the original did.
    assert [steps for _, _, steps in rates] == [5, 10, 15, 20]
    # Training on one machine: no cluster line.
    assert not [message for message in tensorflow_info_messages if "Cluster" in message]


@pytest.mark.parametrize("global_steps_per_step, examples_per_global_step", [
    (3, 32),  # without --sync each worker's batch is a global step of its own
    (1, 96),  # with --sync a global step aggregates one batch of each of the 3 workers
], ids=["async", "sync"])
def test_examples_per_second_hook_logs_this_workers_rate_and_the_clusters(
        monkeypatch, tensorflow_info_messages, global_steps_per_step, examples_per_global_step):
    # A worker of batch 32 among 3 equally fast workers, on a fake clock: 6 steps of
    # 0.5 s, then 5 of 0.25 s. Its own rate is 64 then 128 examples/sec, the cluster's
    # three times that.
    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    hook = cifar10_utils.ExamplesPerSecondHook(
        32, every_n_steps=5, examples_per_global_step=examples_per_global_step)
    global_step = 1000
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        hook.begin()
        for seconds in [0.5] * 6 + [0.25] * 5:
            clock[0] += seconds
            global_step += global_steps_per_step
            hook.after_run(None, tf.compat.v1.train.SessionRunValues(global_step, None, None))
    assert [message for message in tensorflow_info_messages if "examples/sec" in message] == [
        "Average examples/sec: 64 (64), step = 5",
        "Cluster examples/sec: 192 (192), global step = %d" % (1000 + 6 * global_steps_per_step),
        "Average examples/sec: 85.3333 (128), step = 10",
        "Cluster examples/sec: 256 (384), global step = %d" % (1000 + 11 * global_steps_per_step),
    ]


def test_examples_per_second_hook_can_log_every_n_seconds(monkeypatch, tensorflow_info_messages):
    # On a fake clock (the hook's timer reads time.time), so the machine's speed cannot
    # change how often it logs: steps of 0.25 s, a line once 1 s has passed.
    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    hook = cifar10_utils.ExamplesPerSecondHook(8, every_n_steps=None, every_n_secs=1)
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        hook.begin()
        for step in range(1, 14):
            clock[0] += 0.25
            hook.after_run(None, tf.compat.v1.train.SessionRunValues(step, None, None))
    # The first step starts the clock; then every 4 steps (1 s) a line at 32 examples/sec.
    assert logged_rates(tensorflow_info_messages) == [(32, 32, 4), (32, 32, 8), (32, 32, 12)]


@pytest.mark.parametrize("every_n_steps, every_n_secs", [(None, None), (100, 10)])
def test_examples_per_second_hook_needs_exactly_one_interval(every_n_steps, every_n_secs):
    with pytest.raises(ValueError, match="exactly one"):
        cifar10_utils.ExamplesPerSecondHook(32, every_n_steps=every_n_steps,
                                            every_n_secs=every_n_secs)


def test_examples_per_second_hook_needs_a_global_step():
    hook = cifar10_utils.ExamplesPerSecondHook(32)
    with tf.Graph().as_default(), pytest.raises(RuntimeError, match="global step"):
        hook.begin()


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
    (0.4, "about 0 s"), (45, "about 45 s"), (89, "about 89 s"), (90, "about 2 min"),
    (21 * 60 + 10, "about 21 min"), (3569, "about 59 min"), (3600, "about 1 h"),
    (95 * 60, "about 1 h 35 min"),
])
def test_durations_read_as_a_person_would_say_them(secs, text):
    assert cifar10_utils.duration_text(secs) == text


def test_progress_line_gives_steps_percent_rate_and_time_to_go():
    clock = FakeClock()
    progress = cifar10_utils.RunProgress(last_step=10530, examples_per_global_step=128,
                                         clock=clock)
    progress.record(4000)
    clock.advance(50)
    progress.record(4200)  # 4 global steps/sec of 128 examples
    estimate = progress.estimate()
    assert estimate == cifar10_utils.ProgressEstimate(
        4200, 10530, examples_per_sec=512, seconds_to_go=(10530 - 4200) / 4)
    assert cifar10_utils.progress_line(estimate) == (
        "step 4200/10530 (40 %), 512 examples/sec, about 26 min to go")


def test_time_to_go_is_not_known_before_a_stretch_of_training():
    clock = FakeClock()
    progress = cifar10_utils.RunProgress(last_step=10530, examples_per_global_step=128,
                                         clock=clock)
    progress.record(30)
    assert cifar10_utils.progress_line(progress.estimate()) == (
        "step 30/10530 (0 %), time to go not known yet")
    clock.advance(20)
    progress.pause(30)  # paused before a single step: still no rate
    assert progress.estimate().seconds_to_go is None


def test_time_to_go_follows_the_recent_rate_not_the_rate_since_the_start():
    clock = FakeClock()
    progress = cifar10_utils.RunProgress(last_step=1000, examples_per_global_step=128,
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
        progress = cifar10_utils.RunProgress(last_step=1000, examples_per_global_step=128,
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
    progress = cifar10_utils.RunProgress(last_step=100, examples_per_global_step=32,
                                         clock=clock)
    train_on_fake_clock([cifar10_utils.ProgressHook(progress, every_n_steps=10)], clock,
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
    progress = cifar10_utils.RunProgress(last_step=100, examples_per_global_step=32,
                                         clock=clock)
    train_on_fake_clock([cifar10_utils.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=20, seconds_per_step=0.5)
    clock.advance(10)  # e.g. an evaluation between two training sessions
    train_on_fake_clock([cifar10_utils.ProgressHook(progress, every_n_steps=10)], clock,
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
    progress = cifar10_utils.RunProgress(last_step=100, examples_per_global_step=32,
                                         clock=clock)
    checkpoint_saver = tf.compat.v1.train.CheckpointSaverHook(
        str(tmp_path), save_steps=10, listeners=[
            cifar10_utils.ProgressCheckpointListener(progress),
            EvaluationAtCheckpoints(clock, evaluation_secs=30)])
    # The Estimator's order: the chief's checkpoint saver before the model_fn's hooks.
    train_on_fake_clock([checkpoint_saver, cifar10_utils.ProgressHook(progress, every_n_steps=10)],
                        clock, num_steps=25, seconds_per_step=0.5, checkpoint_dir=str(tmp_path))
    # One line at each checkpoint, before its evaluation: the hook's own line at steps
    # 10 and 20 is not repeated. The rate stays 2 global steps/sec; time to go is
    # stretched by wall time over training time: 39.5 / 9.5 at step 20, 72 / 12 at 25.
    assert progress_lines(tensorflow_info_messages) == [
        "step 10/100 (10 %), 64 examples/sec, about 45 s to go",
        "step 20/100 (20 %), 64 examples/sec, about 3 min to go",
        "step 25/100 (25 %), 64 examples/sec, about 4 min to go",
    ]
    assert progress.estimate().seconds_to_go == pytest.approx(75 / 2 * 72 / 12)


def test_a_stale_global_step_after_a_checkpoint_does_not_repeat_its_line(
        tensorflow_info_messages):
    # In one run the hook's fetch of the global step may read it before the update: one
    # less than the checkpoint's listener sees after the run.
    clock = FakeClock()
    progress = cifar10_utils.RunProgress(last_step=1000, examples_per_global_step=32,
                                         clock=clock)
    hook = cifar10_utils.ProgressHook(progress, every_n_steps=20)
    listener = cifar10_utils.ProgressCheckpointListener(progress)

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
    progress = cifar10_utils.RunProgress(last_step=300, examples_per_global_step=32,
                                         clock=clock)
    train_on_fake_clock([cifar10_utils.ProgressHook(progress, every_n_steps=10)], clock,
                        num_steps=8, seconds_per_step=0.25, global_steps_per_step=3)
    # Lines where the global step passes a multiple of 10; the cluster's 12 global steps
    # of 32 examples per second give the rate and the time to go.
    assert progress_lines(tensorflow_info_messages) == [
        "step 12/300 (4 %), 384 examples/sec, about 24 s to go",
        "step 21/300 (7 %), 384 examples/sec, about 23 s to go",
        "step 24/300 (8 %), 384 examples/sec, about 23 s to go",
    ]


def test_progress_hook_needs_a_global_step():
    hook = cifar10_utils.ProgressHook(cifar10_utils.RunProgress(100, 32))
    with tf.Graph().as_default(), pytest.raises(RuntimeError, match="global step"):
        hook.begin()


def cpu_session(graph, num_cpus):
    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_cpus})
    return tf.compat.v1.Session(graph=graph, config=config)


def placement_of_last_run(session, fetches):
    """(values, {node name: device name} as the session actually placed them)."""
    run_metadata = tf.compat.v1.RunMetadata()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    values = session.run(fetches, options=options, run_metadata=run_metadata)
    devices = {node.node_name: device.device.lower()
               for device in run_metadata.step_stats.dev_stats
               for node in device.node_stats}
    return values, devices


def test_local_device_setter_puts_variables_round_robin_and_ops_on_the_worker():
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device(cifar10_utils.local_device_setter(
                num_devices=3, worker_device="/cpu:2")):
            variables = [tf.compat.v1.get_variable("v%d" % i, [2],
                                                   initializer=tf.ones_initializer())
                         for i in range(4)]
            reference_variable = tf.compat.v1.Variable([1.0, 1.0], name="ref", use_resource=False)
            total = tf.add_n([tf.identity(v) for v in variables + [reference_variable]],
                             name="total")
        assert [v.op.type for v in variables] == ["VarHandleOp"] * 4
        assert reference_variable.op.type == "VariableV2"
        assert [v.op.device for v in variables + [reference_variable]] == [
            "/device:CPU:0", "/device:CPU:1", "/device:CPU:2", "/device:CPU:0", "/device:CPU:1"]
        assert total.op.device == "/device:CPU:2"
        with cpu_session(graph, 3) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            value, devices = placement_of_last_run(session, total)
    np.testing.assert_array_equal(value, [5.0, 5.0])
    assert devices["v0"].endswith("cpu:0") and devices["v3"].endswith("cpu:0")
    assert devices["v1"].endswith("cpu:1") and devices["ref"].endswith("cpu:1")
    assert devices["v2"].endswith("cpu:2") and devices["total"].endswith("cpu:2")


def test_local_device_setter_keeps_fields_of_an_enclosing_device():
    with tf.Graph().as_default():
        with tf.compat.v1.device("/job:localhost/replica:0/task:0"), \
                tf.compat.v1.device(cifar10_utils.local_device_setter(num_devices=2)):
            first = tf.compat.v1.get_variable("first", [1])
            second = tf.compat.v1.get_variable("second", [1])
            total = tf.add(first, second)
    assert first.op.device == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert second.op.device == "/job:localhost/replica:0/task:0/device:CPU:1"
    assert total.op.device == "/job:localhost/replica:0/task:0/device:CPU:0"


def test_local_device_setter_rejects_a_strategy_that_is_not_callable():
    with pytest.raises(TypeError, match="callable"):
        cifar10_utils.local_device_setter(ps_strategy=3)


def test_greedy_strategy_places_each_variable_on_the_least_loaded_device():
    # Sizes in bytes: 400, 40, 40, 40, then 200 as float64. Round robin would
    # alternate devices 0, 1, 0, 1, 0 and load them 680 / 80 bytes.
    shapes_and_dtypes = [([10, 10], tf.float32), ([10], tf.float32), ([10], tf.float32),
                         ([2, 5], tf.float32), ([25], tf.float64)]
    strategy = cifar10_utils.GreedyLoadBalancingStrategy(2, cifar10_utils.byte_size_load_fn)
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device(cifar10_utils.local_device_setter(ps_strategy=strategy)):
            variables = [tf.compat.v1.get_variable("v%d" % i, shape, dtype)
                         for i, (shape, dtype) in enumerate(shapes_and_dtypes)]
            total = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in variables])
        assert [v.op.device for v in variables] == [
            "/device:CPU:0", "/device:CPU:1", "/device:CPU:1", "/device:CPU:1", "/device:CPU:1"]
        assert strategy.loads == (400, 320)
        with cpu_session(graph, 2) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            _, devices = placement_of_last_run(session, total)
    assert devices["v0"].endswith("cpu:0")
    assert all(devices["v%d" % i].endswith("cpu:1") for i in range(1, 5))


def test_greedy_strategy_breaks_ties_towards_the_lowest_device():
    strategy = cifar10_utils.GreedyLoadBalancingStrategy(3, lambda op: 1)
    assert [strategy(None) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert strategy.loads == (3, 2, 2)


@pytest.mark.parametrize("strategy_class", [cifar10_utils.GreedyLoadBalancingStrategy,
                                            cifar10_utils.RoundRobinStrategy])
def test_strategies_need_at_least_one_device(strategy_class):
    arguments = (0, cifar10_utils.byte_size_load_fn) if strategy_class is \
        cifar10_utils.GreedyLoadBalancingStrategy else (0,)
    with pytest.raises(ValueError, match="at least 1"):
        strategy_class(*arguments)


def test_byte_size_of_resource_and_reference_variables():
    with tf.Graph().as_default():
        resource_variable = tf.compat.v1.get_variable("resource", [3, 4], tf.float32)
        reference_variable = tf.compat.v1.Variable(np.zeros(5), use_resource=False)
        scalar = tf.compat.v1.get_variable("scalar", [], tf.int64)
    assert cifar10_utils.byte_size_load_fn(resource_variable.op) == 3 * 4 * 4
    assert cifar10_utils.byte_size_load_fn(reference_variable.op) == 5 * 8
    assert cifar10_utils.byte_size_load_fn(scalar.op) == 8


def test_byte_size_of_a_variable_without_a_static_shape_is_an_error():
    with tf.Graph().as_default():
        unknown = tf.compat.v1.Variable(tf.zeros([2]), shape=tf.TensorShape(None))
        with pytest.raises(ValueError, match="not fully defined"):
            cifar10_utils.byte_size_load_fn(unknown.op)


def test_byte_size_of_an_op_that_is_not_a_variable_is_an_error():
    with tf.Graph().as_default():
        constant = tf.constant([1.0, 2.0])
        with pytest.raises(ValueError, match="no 'shape' and 'dtype'"):
            cifar10_utils.byte_size_load_fn(constant.op)
