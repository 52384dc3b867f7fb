"""Training helpers: throughput and progress logging, the chief's --sync hook, device setters.

The tutorial took the greedy parameter-device strategy from tf.contrib.training,
which no longer exists; GreedyLoadBalancingStrategy and byte_size_load_fn replace it.
"""

import collections
import dataclasses
import threading
import time

import tensorflow as tf

DEFAULT_PS_OPS = ("Variable", "VariableV2", "VarHandleOp")

# The rate behind the time to go comes from about this much recent training: long enough
# to smooth over a checkpoint or a slow batch, short enough to follow a change of speed.
PROGRESS_WINDOW_SECS = 300


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
        self._global_step = _global_step_of_graph(self)
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


def _global_step_of_graph(hook):
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


@dataclasses.dataclass(frozen=True)
class ProgressEstimate:
    """Where a run is and when it ends, as RunProgress.estimate sees it.

    Attributes:
      global_step: the newest global step seen.
      last_step: the global step at which training stops.
      examples_per_sec: over the recent window, or None before there is a rate.
      seconds_to_go: wall time to last_step, evaluations included, or None when unknown.
    """

    global_step: int
    last_step: int
    examples_per_sec: float = None
    seconds_to_go: float = None


class RunProgress:
    """The global steps and wall time of a whole training run, and the time it has to go.

    Create one per training process and hand it to every ProgressHook and
    ProgressCheckpointListener: a hook lives for one training session, while the
    recent rate and the time spent in evaluations span the run.

    Time is either training (between two points of one stretch of training) or
    outside it (from a pause to the point that resumes training: evaluations, and
    the start-up of a new session). Only training time gives the rate; the time to
    go is the remaining global steps at that rate, stretched by the run's ratio of
    wall time to training time, so evaluations are expected to keep taking their
    share. The start-up before the first point is counted as neither: it happens
    once and must not be extrapolated.
    """

    def __init__(self, last_step, examples_per_global_step, window_secs=PROGRESS_WINDOW_SECS,
                 clock=time.monotonic):
        """Args:
          last_step: the global step at which training stops.
          examples_per_global_step: examples behind one global step (the global batch
            with --sync, one worker's batch without).
          window_secs: the rate comes from the newest training intervals spanning at
            least this many seconds of training.
          clock: callable returning seconds; differences of its values are durations.
        """
        self._last_step = last_step
        self._examples_per_global_step = examples_per_global_step
        self._window_secs = window_secs
        self._clock = clock
        self._global_step = None
        self._time_of_global_step = None
        self._paused_since = None
        self._training_secs = 0.0
        self._outside_secs = 0.0
        self._window = collections.deque()  # (secs, global steps) of recent training intervals
        self._window_secs_total = 0.0
        self._window_steps_total = 0

    @property
    def global_step(self):
        """The newest global step seen, or None before the first record."""
        return self._global_step

    @property
    def running(self):
        """Whether training is under way: a point was recorded and no pause came after it."""
        return self._time_of_global_step is not None and self._paused_since is None

    def record(self, global_step):
        """Note that training is at global_step now; the first point after a pause resumes it."""
        now = self._clock()
        if self._global_step is not None:
            # The global step never goes back; a hook's fetch in the same run as the
            # update may read it one step before the value a checkpoint listener saw.
            global_step = max(global_step, self._global_step)
        if self._paused_since is not None:
            self._outside_secs += now - self._paused_since
            self._paused_since = None
        elif self._time_of_global_step is not None:
            self._add_training(now - self._time_of_global_step, global_step - self._global_step)
        self._global_step, self._time_of_global_step = global_step, now

    def pause(self, global_step):
        """Note that training stops at global_step until the next record (an evaluation may
        run, or the session ends). Does nothing unless training is running."""
        if not self.running:
            return
        self.record(global_step)
        self._paused_since = self._time_of_global_step

    def estimate(self):
        """Returns: the ProgressEstimate as of the newest point (call after the first record)."""
        if not (self._window_secs_total > 0 and self._window_steps_total > 0):
            return ProgressEstimate(self._global_step, self._last_step)
        global_steps_per_sec = self._window_steps_total / self._window_secs_total
        wall_secs_per_training_sec = ((self._training_secs + self._outside_secs)
                                      / self._training_secs)
        steps_to_go = max(0, self._last_step - self._global_step)
        return ProgressEstimate(
            self._global_step, self._last_step,
            examples_per_sec=global_steps_per_sec * self._examples_per_global_step,
            seconds_to_go=steps_to_go / global_steps_per_sec * wall_secs_per_training_sec)

    def _add_training(self, secs, global_steps):
        self._training_secs += secs
        self._window.append((secs, global_steps))
        self._window_secs_total += secs
        self._window_steps_total += global_steps
        while self._window_secs_total - self._window[0][0] >= self._window_secs:
            oldest_secs, oldest_steps = self._window.popleft()
            self._window_secs_total -= oldest_secs
            self._window_steps_total -= oldest_steps


def duration_text(secs):
    """A duration as a person would say it: 'about 45 s', 'about 21 min', 'about 1 h 35 min'."""
    if round(secs) < 90:
        return "about %d s" % round(secs)
    minutes = round(secs / 60)
    if minutes < 60:
        return "about %d min" % minutes
    hours, minutes = divmod(minutes, 60)
    return "about %d h %d min" % (hours, minutes) if minutes else "about %d h" % hours


def progress_line(estimate):
    """The log line of a ProgressEstimate.

    E.g. 'step 4200/10530 (40 %), 489 examples/sec, about 21 min to go', or
    'step 30/10530 (0 %), time to go not known yet' before there is a rate.
    """
    where = "step %d/%d (%d %%)" % (estimate.global_step, estimate.last_step,
                                    round(100 * estimate.global_step / estimate.last_step))
    if estimate.seconds_to_go is None:
        return where + ", time to go not known yet"
    return "%s, %.0f examples/sec, %s to go" % (where, estimate.examples_per_sec,
                                                 duration_text(estimate.seconds_to_go))


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Logs where the run is and when it ends every N global steps and when its session ends.

    The line (see progress_line) is the run's, from the global step: in a cluster
    every worker logs the cluster's progress and rate, and the time until the global
    step reaches the last step, whichever workers make the steps. (Each worker's own
    rate is ExamplesPerSecondHook's line.) Per step the hook only fetches the global
    step and compares it; it records a point for RunProgress at each line, and at the
    first step of a session or after an evaluation, which resumes the clock.
    """

    def __init__(self, progress, every_n_steps=100):
        """Args:
          progress: the run's RunProgress, shared by every session of the process.
          every_n_steps: log when the global step reaches a multiple of this.
        """
        self._progress = progress
        self._every_n_steps = every_n_steps
        self._global_step = None
        self._next_log_step = 0  # the session's first step records a point
        self._newest_global_step = None
        self._logged_global_step = None

    def begin(self):
        self._global_step = _global_step_of_graph(self)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        global_step = self._newest_global_step = run_values.results
        if global_step < self._next_log_step and self._progress.running:
            return
        # Not running: the session's first step, or the first after an evaluation,
        # whose point resumes the clock and has no new line to tell.
        resuming = not self._progress.running
        self._progress.record(global_step)
        if not resuming:
            self._log_progress()
        # In a cluster the global step also moves by other workers' steps, so it
        # passes the multiples rather than hitting each one.
        self._next_log_step = ((self._progress.global_step // self._every_n_steps + 1)
                               * self._every_n_steps)

    def end(self, session):
        if self._newest_global_step is None or not self._progress.running:
            return  # no step was run, or the final checkpoint's listener paused and logged
        # The newest global step seen, not a fetch: in a cluster the parameter servers
        # may already be gone when a worker's session ends.
        self._progress.pause(self._newest_global_step)
        if self._progress.global_step != self._logged_global_step:
            self._log_progress()

    def _log_progress(self):
        tf.compat.v1.logging.info(progress_line(self._progress.estimate()))
        self._logged_global_step = self._progress.global_step


class ProgressCheckpointListener(tf.compat.v1.train.CheckpointSaverListener):
    """Pauses the run's progress at each checkpoint and logs its line: an evaluation may follow.

    tf.estimator.train_and_evaluate on one machine evaluates inside the training
    session, from its own listener right after this one (TrainSpec.saving_listeners
    come first); the next ProgressHook step resumes the clock, so the evaluation
    counts as time outside training instead of slowing the rate.
    """

    def __init__(self, progress):
        """Args:
          progress: the run's RunProgress.
        """
        self._progress = progress

    def after_save(self, session, global_step_value):
        self._pause_and_log(global_step_value)

    def end(self, session, global_step_value):
        self._pause_and_log(global_step_value)

    def _pause_and_log(self, global_step):
        # Not running: the first checkpoint, written before any step, or the final one
        # seen twice (its save and the end of saving).
        if self._progress.running:
            self._progress.pause(global_step)
            tf.compat.v1.logging.info(progress_line(self._progress.estimate()))


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
        stops (OutOfRange) instead of hanging.
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
        threading.Thread(target=self._apply_updates, args=(session, coord),
                         name="sync_replicas_updates", daemon=True).start()

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
