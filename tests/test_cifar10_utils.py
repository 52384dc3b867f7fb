"""The tutorial's training helpers: the examples/sec hook, local device setters, greedy load
balancing, and the --sync chief's hook."""

import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10_utils
from cli_helpers import REPO_ROOT, cli_env

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
    for average, current, steps in rates:
        assert 0 < average <= fastest_possible
        assert 0 < current <= fastest_possible
        # The steps a line averages were timed within the whole loop's wall time. (Not
        # 20 steps' worth: a busy machine can stall the first steps, and the early
        # lines' averages with them, below the loop's overall rate.) 0.1 %: "%g" rounds.
        assert average >= batch_size * steps / wall_secs * 0.999
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


# A --sync chief in a program of its own: the update thread's last run is cancelled when
# the session closes, and here comes back from TensorFlow late, as it may on a busy
# machine: only once training has returned (an event, so that it is still there then on
# any machine), and 2 s later still, long past the interpreter's way to its exit, where a
# thread that nothing waits for would be left running (and within the
# SYNC_UPDATES_EXIT_WAIT_SECS the exit waits). The first atexit handler runs last and
# reports whether the thread still runs.
SYNC_CHIEF_PROGRAM = """
import atexit, threading, time
import tensorflow as tf
from cifar10_estimator import cifar10_utils

def update_threads():
    return [t for t in threading.enumerate() if t.name == "sync_replicas_updates"]

atexit.register(lambda: print("update threads at exit:", len(update_threads()), flush=True))
session_run = tf.compat.v1.Session.run
trained = threading.Event()

def run_late_once_cancelled(self, *args, **kwargs):
    try:
        return session_run(self, *args, **kwargs)
    except tf.errors.CancelledError:
        if threading.current_thread().name == "sync_replicas_updates":
            trained.wait()
            time.sleep(2)
        raise

tf.compat.v1.Session.run = run_late_once_cancelled
tf.compat.v1.disable_eager_execution()
step = tf.compat.v1.train.get_or_create_global_step()
weight = tf.compat.v1.get_variable("weight", initializer=1.0)
optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
    tf.compat.v1.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=1,
    total_num_replicas=1)
train_op = optimizer.minimize(tf.square(weight), global_step=step)
hooks = [optimizer.make_session_run_hook(is_chief=False),
         cifar10_utils.SyncReplicasChiefHook(optimizer),
         tf.compat.v1.train.StopAtStepHook(last_step=3)]
with tf.compat.v1.train.MonitoredTrainingSession(is_chief=True, hooks=hooks) as session:
    while not session.should_stop():
        session.run(train_op)
print("update threads after training:", len(update_threads()), flush=True)
trained.set()
"""


@pytest.mark.slow
def test_the_sync_chiefs_update_thread_ends_before_the_program_exits():
    result = subprocess.run([sys.executable, "-c", SYNC_CHIEF_PROGRAM], cwd=REPO_ROOT,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # Training returned while the thread was still on its way back from TensorFlow...
    assert "update threads after training: 1" in result.stdout, result.stdout
    # ...and the exit waited for it: a daemon thread still in TensorFlow's C++ frames when
    # the interpreter finalizes can abort the process ("FATAL: exception not rethrown").
    assert "update threads at exit: 0" in result.stdout, result.stdout
