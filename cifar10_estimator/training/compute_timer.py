"""ComputeTimer: the time of the training steps a process runs, and their FLOPs
(training.compute), for the rate the closing summary gives."""

import time

import tensorflow as tf

from cifar10_estimator import cifar10_utils


class ComputeTimer(tf.compat.v1.train.SessionRunHook):
    """Times the training steps this process runs and adds up their FLOPs: they reached
    `flops / secs`.

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

    def begin(self):
        self._global_step = cifar10_utils.global_step_of_graph(self)
        self._leave_out = True

    def leave_out_this_step(self):
        """Leave the step under way out of the timing."""
        self._leave_out = True

    def before_run(self, run_context):
        self._step_start = self._clock()
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        secs = self._clock() - self._step_start
        if self._leave_out:
            self._leave_out = False
            return
        # Read in the step's own run, before or after its update: at a change of image
        # size one step may count at the next size's cost.
        global_step = run_values.results
        self.flops += self.training_compute.flops(global_step, global_step + 1)
        self.secs += secs
        self.steps += 1


class _CheckpointMark(tf.compat.v1.train.CheckpointSaverListener):
    """Tells a ComputeTimer that the step under way saves a checkpoint."""

    def __init__(self, timer):
        self._timer = timer

    def before_save(self, session, global_step_value):
        self._timer.leave_out_this_step()
