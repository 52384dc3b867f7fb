"""The tutorial's training helpers: throughput logging, device setters and their parameter
strategies; and the chief's hook for --sync.

The tutorial took the greedy parameter-device strategy from tf.contrib.training,
which no longer exists; GreedyLoadBalancingStrategy and byte_size_load_fn replace it.
"""

import atexit
import threading

import tensorflow as tf

DEFAULT_PS_OPS = ("Variable", "VariableV2", "VarHandleOp")

# How long a program's exit waits for the --sync chief's update thread to come back from
# its last, cancelled wait: it comes back as soon as the session has closed.
SYNC_UPDATES_EXIT_WAIT_SECS = 10


class ExamplesPerSecondHook(tf.compat.v1.train.SessionRunHook):
    """Logs training throughput: this worker's, and in a cluster the whole cluster's.

    Every N steps of this worker (or N seconds) it logs

        Average examples/sec: A (C), step = S

    for this worker as the tutorial did: A the average since the hook's first timed
    step, C the rate over the last interval, S this worker's steps timed so far, each
    step one batch of batch_size examples. Given examples_per_global_step, it adds

        Cluster examples/sec: A (C), global step = G

    over the same intervals: the global steps every worker made, each of
    examples_per_global_step examples. Without --sync every worker's step is a
    global step of its batch, so the cluster's rate is the sum of the workers' own;
    with --sync a global step aggregates one batch of every worker. Per step the hook
    only fetches the global step and asks the timer whether to log.
    """

    def __init__(self, batch_size, every_n_steps=100, every_n_secs=None,
                 examples_per_global_step=None):
        """Args:
          batch_size: examples per step of this worker, over all its towers.
          every_n_steps: log every this many steps of this worker, or None.
          every_n_secs: log every this many seconds, or None.
          examples_per_global_step: examples behind one global step of the cluster,
            or None to log this worker's throughput only (training on one machine).

        Raises:
          ValueError: not exactly one of every_n_steps and every_n_secs is given.
        """
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("exactly one of every_n_steps and every_n_secs must be given, "
                             "got every_n_steps=%r, every_n_secs=%r"
                             % (every_n_steps, every_n_secs))
        self._timer = tf.compat.v1.train.SecondOrStepTimer(
            every_secs=every_n_secs, every_steps=every_n_steps)
        self._worker = _Throughput(batch_size)
        self._cluster = _Throughput(examples_per_global_step) if examples_per_global_step else None
        self._steps_run = 0
        self._global_step_at_trigger = None
        self._global_step = None

    def begin(self):
        self._global_step = global_step_of_graph(self)
        # A new session (e.g. training resumed after evaluation) starts a new
        # interval, so time spent outside training is not counted.
        self._timer.reset()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        self._steps_run += 1
        if not self._timer.should_trigger_for_step(self._steps_run):
            return
        elapsed_secs, elapsed_steps = self._timer.update_last_triggered_step(self._steps_run)
        global_step, previous_global_step = run_values.results, self._global_step_at_trigger
        self._global_step_at_trigger = global_step
        if not elapsed_secs:  # the first trigger of a session only starts the clock
            return
        tf.compat.v1.logging.info("Average examples/sec: %g (%g), step = %g",
                                  *self._worker.add(elapsed_steps, elapsed_secs),
                                  self._worker.steps)
        if self._cluster:
            tf.compat.v1.logging.info(
                "Cluster examples/sec: %g (%g), global step = %d",
                *self._cluster.add(global_step - previous_global_step, elapsed_secs), global_step)


def global_step_of_graph(hook):
    """The default graph's global step, which `hook` reads every step; RuntimeError if none."""
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        raise RuntimeError("%s needs a global step; create one with "
                           "tf.compat.v1.train.get_or_create_global_step()"
                           % type(hook).__name__)
    return global_step


class _Throughput:
    """Examples/sec of steps of a fixed size, counted interval by interval."""

    def __init__(self, examples_per_step):
        self._examples_per_step = examples_per_step
        self.steps = 0
        self._secs = 0.0

    def add(self, steps, secs):
        """Count `steps` made in `secs`; returns (average over all intervals, this one's)
        examples/sec."""
        self.steps += steps
        self._secs += secs
        return (self._examples_per_step * self.steps / self._secs,
                self._examples_per_step * steps / secs)


class SyncReplicasChiefHook(tf.compat.v1.train.SessionRunHook):
    """The chief's part of SyncReplicasOptimizer, ending with training instead of two minutes later.

    Every worker, the chief included, also needs
    sync_optimizer.make_session_run_hook(is_chief=False) for its local step. This hook
    sets the step of the gradient accumulators and applies the aggregated updates in
    a thread, as the optimizer's own chief hook does, but:
      - it puts no initial tokens in the token queue, so the first update waits for a
        gradient from every worker instead of taking the chief's alone;
      - its thread is not registered with the session's coordinator: after the last
        update it waits for gradients no worker will send, and the coordinator would
        wait two minutes for it before closing the session (then a CancelledError
        traceback). Here closing the session ends the wait quietly;
      - at the end it closes the token queue, so a worker still waiting for a token
        stops (OutOfRange) instead of hanging;
      - the program's exit waits for the thread (SYNC_UPDATES_EXIT_WAIT_SECS at most),
        so that a run that finished does not abort on the way out.
    """

    def __init__(self, sync_optimizer):
        self._sync_optimizer = sync_optimizer

    def begin(self):
        queue_runner = self._sync_optimizer.get_chief_queue_runner()
        self._chief_init_op = self._sync_optimizer.chief_init_op
        (self._apply_update_op,) = queue_runner.enqueue_ops
        self._close_token_queue_op = queue_runner.cancel_op

    def after_create_session(self, session, coord):
        session.run(self._chief_init_op)
        thread = threading.Thread(target=self._apply_updates, args=(session, coord),
                                  name="sync_replicas_updates", daemon=True)
        thread.start()
        # Its last update waits inside TensorFlow until the session closes. Should that
        # wait return once the interpreter is finalizing, Python ends the thread inside
        # TensorFlow's C++ frames and the process aborts ("FATAL: exception not
        # rethrown") after a finished run. atexit handlers run before that point.
        atexit.register(thread.join, SYNC_UPDATES_EXIT_WAIT_SECS)

    def _apply_updates(self, session, coord):
        try:
            while not coord.should_stop():
                session.run(self._apply_update_op)
        except tf.errors.CancelledError:
            pass  # the session closed while the update waited for gradients
        except Exception as error:  # ends training with the error, as a QueueRunner does
            coord.request_stop(error)

    def end(self, session):
        session.run(self._close_token_queue_op)


class RoundRobinStrategy:
    """Parameter-device chooser cycling through 0 .. num_tasks - 1."""

    def __init__(self, num_tasks):
        if num_tasks < 1:
            raise ValueError("num_tasks must be at least 1, got %r" % (num_tasks,))
        self._num_tasks = num_tasks
        self._next_task = 0

    def __call__(self, op):
        task = self._next_task
        self._next_task = (task + 1) % self._num_tasks
        return task


class GreedyLoadBalancingStrategy:
    """Parameter-device chooser putting each variable on the least-loaded device.

    Ties go to the lowest device index, so the first num_tasks variables are
    spread like round robin; afterwards big variables are balanced by size.
    """

    def __init__(self, num_tasks, load_fn):
        """Args:
          num_tasks: number of parameter devices.
          load_fn: op -> load it adds to its device (e.g. byte_size_load_fn).
        """
        if num_tasks < 1:
            raise ValueError("num_tasks must be at least 1, got %r" % (num_tasks,))
        self._load_fn = load_fn
        self._loads = [0] * num_tasks

    @property
    def loads(self):
        """Load placed so far on each device, a tuple indexed by device."""
        return tuple(self._loads)

    def __call__(self, op):
        task = min(range(len(self._loads)), key=self._loads.__getitem__)
        self._loads[task] += self._load_fn(op)
        return task


def byte_size_load_fn(op):
    """Bytes of the variable that op creates: elements of its `shape` attr times dtype size.

    Works for resource (VarHandleOp) and reference (VariableV2, Variable) variables;
    both carry the variable's shape and dtype as attrs (a VarHandleOp's output is
    a scalar handle, so its output shape says nothing). Dtypes without a fixed
    size (string, variant) count as 0 bytes.

    Raises:
      ValueError: op has no shape/dtype attrs (not a variable op) or its shape is
        not fully defined (e.g. validate_shape=False), so its size is unknown;
        give the variable a static shape or use round-robin placement.
    """
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except ValueError:
        raise ValueError("cannot size %s op %r: it has no 'shape' and 'dtype' attrs "
                         "(only variable ops can be load balanced)" % (op.type, op.name))
    if not shape.is_fully_defined():
        raise ValueError("cannot size variable %r: its shape %s is not fully defined; give it a "
                         "static shape or place variables round robin" % (op.name, shape))
    return shape.num_elements() * dtype.size


def local_device_setter(num_devices=1, ps_device_type="cpu", worker_device="/cpu:0",
                        ps_ops=None, ps_strategy=None):
    """A device function (for tf.compat.v1.device) putting variables on local parameter devices.

    Variable ops go to /{ps_device_type}:{ps_strategy(op)}; every other op goes to
    worker_device. Fields of a device the op already has (from an enclosing
    tf.device) take precedence over the chosen one.

    Args:
      num_devices: parameter devices for the default round-robin strategy.
      ps_device_type: 'cpu' or 'gpu'.
      worker_device: device of the computation, e.g. '/gpu:1'.
      ps_ops: op types placed as variables; default DEFAULT_PS_OPS.
      ps_strategy: callable op -> device index; default RoundRobinStrategy(num_devices).

    Raises:
      TypeError: ps_strategy is not callable.
    """
    ps_ops = frozenset(DEFAULT_PS_OPS if ps_ops is None else ps_ops)
    if ps_strategy is None:
        ps_strategy = RoundRobinStrategy(num_devices)
    if not callable(ps_strategy):
        raise TypeError("ps_strategy must be callable, got %r" % (ps_strategy,))
    worker_device_spec = tf.DeviceSpec.from_string(worker_device or "")

    def choose_device(op):
        current_device_spec = tf.DeviceSpec.from_string(op.device or "")
        if op.type in ps_ops:
            chosen = tf.DeviceSpec.from_string("/%s:%d" % (ps_device_type, ps_strategy(op)))
        else:
            chosen = worker_device_spec
        return chosen.make_merged_spec(current_device_spec).to_string()

    return choose_device
