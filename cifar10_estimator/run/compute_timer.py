"""ComputeTimer: the time of the training steps a process runs, and their FLOPs
(training.compute), for the rate the closing summary gives."""

import time

import tensorflow as tf

from cifar10_estimator import cifar10_utils
from cifar10_estimator.training import example_skipping


class ComputeTimer(tf.compat.v1.train.SessionRunHook):
    """Times the training steps this process runs and adds up their FLOPs: they reached
    `flops / secs`.

    With --skip-learned a step's FLOPs are those of the examples it kept: the growth of
    the checkpoints' count of examples trained per phase (example_skipping), read after
    each step (a read may see the update of the step in flight or not, so a step's count
    can move to its neighbour; their sum holds), and `examples_per_phase` is that count
    when training ends.

    A step's time is its session run with the hooks around it. Left out: a session's
    first step (it also sets the graph's kernels up) and a step that saved a checkpoint,
    after which the run may evaluate before the step ends (the hook's
    `checkpoint_listener` tells it; give that to the TrainSpec's saving_listeners).
    """

    def __init__(self, training_compute, clock=time.perf_counter):
        """Args:
          training_compute: the run's TrainingCompute.
          clock: callable returning seconds.
        """
        self.training_compute = training_compute
        self._clock = clock
        self.flops = 0.0
        self.secs = 0.0
        self.steps = 0
        self._global_step = None
        self._step_start = None
        self._leave_out = True
        self.checkpoint_listener = _CheckpointMark(self)
        self._trained_counts = None
        self._last_counts = None
        self.examples_per_phase = None

    def begin(self):
        self._global_step = cifar10_utils.global_step_of_graph(self)
        self._leave_out = True
        counts = [variable for variable in tf.compat.v1.global_variables()
                  if variable.op.name == example_skipping.COUNTS_NAME]
        self._trained_counts = counts[0].read_value() if counts else None

    def after_create_session(self, session, coord):
        if self._trained_counts is not None:
            self._last_counts = session.run(self._trained_counts)

    def end(self, session):
        if self._trained_counts is not None:
            self.examples_per_phase = [int(count) for count in session.run(self._trained_counts)]

    def leave_out_this_step(self):
        """Leave the step under way out of the timing."""
        self._leave_out = True

    def before_run(self, run_context):
        self._step_start = self._clock()
        fetches = {"global_step": self._global_step}
        if self._trained_counts is not None:
            fetches["counts"] = self._trained_counts
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        secs = self._clock() - self._step_start
        flops = self._step_flops(run_values.results["global_step"],
                                 run_values.results.get("counts"))
        if self._leave_out:
            self._leave_out = False
            return
        self.flops += flops
        self.secs += secs
        self.steps += 1


    def _step_flops(self, global_step, counts):
        if counts is None:
            # Read in the step's own run, before or after its update: at a change of
            # image size one step may count at the next size's cost.
            return self.training_compute.flops(global_step, global_step + 1)
        growth = [now - before for now, before in zip(counts, self._last_counts)]
        self._last_counts = counts
        return self.training_compute.flops_of_counts(growth)


class _CheckpointMark(tf.compat.v1.train.CheckpointSaverListener):
    """Tells a ComputeTimer that the step under way saves a checkpoint."""

    def __init__(self, timer):
        self._timer = timer

    def before_save(self, session, global_step_value):
        self._timer.leave_out_this_step()
