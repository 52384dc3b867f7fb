"""The hooks that feed the run's time to go (run.time_to_go.RunProgress) and show it:
a point every N global steps, a pause at each checkpoint (an evaluation may follow), and
the evaluations' times.
"""

import tensorflow as tf

from cifar10_estimator import cifar10_utils

# TensorBoard's tag of the run's rate (the rate of the time to go).
EXAMPLES_PER_SEC_TAG = "examples/sec"


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Reports where the run is and when it ends every N global steps and when its session
    ends, from the global step: in a cluster every worker reports the cluster's. It records
    a point at each, and at a session's first step or after an evaluation (resuming)."""

    def __init__(self, progress, every_n_steps=100, summary_dir=None,
                 summary_every_n_steps=100):
        """Args:
          progress: the run's time_to_go.RunProgress, shared by the process's sessions.
          every_n_steps: report when the global step reaches a multiple of this.
          summary_dir: where the rate goes as TensorBoard's `examples/sec` curve, at
            multiples of summary_every_n_steps (the chief's model dir), or None.
        """
        self._progress = progress
        self._every_n_steps = every_n_steps
        self._summary_writer = (tf.compat.v1.summary.FileWriterCache.get(summary_dir)
                                if summary_dir else None)
        self._summary_every_n_steps = summary_every_n_steps
        self._next_log_step = self._next_summary_step = 0
        self._global_step = self._newest_global_step = self._logged_global_step = None

    def begin(self):
        self._global_step = cifar10_utils.global_step_of_graph(self)

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
        global_step = self._progress.global_step
        # In a cluster the global step also moves by other workers' steps: it passes
        # the multiples rather than hitting each one.
        self._next_log_step = (global_step // self._every_n_steps + 1) * self._every_n_steps
        if not self._summary_writer or global_step < self._next_summary_step:
            return
        examples_per_sec = self._progress.estimate().examples_per_sec
        if examples_per_sec:
            self._summary_writer.add_summary(tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag=EXAMPLES_PER_SEC_TAG,
                                           simple_value=examples_per_sec)]), global_step)
            self._next_summary_step = ((global_step // self._summary_every_n_steps + 1)
                                       * self._summary_every_n_steps)

    def end(self, session):
        if self._newest_global_step is None or not self._progress.running:
            return  # no step was run, or the final checkpoint's listener paused and logged
        # The newest global step seen, not a fetch: in a cluster the parameter servers
        # may already be gone when a worker's session ends.
        self._progress.pause(self._newest_global_step)
        if self._progress.global_step != self._logged_global_step:
            self._log_progress()

    def _log_progress(self):
        self._progress.report()
        self._logged_global_step = self._progress.global_step


class ProgressCheckpointListener(tf.compat.v1.train.CheckpointSaverListener):
    """Pauses the run's progress at each checkpoint and reports it: train_and_evaluate on one
    machine evaluates in the training session, from its listener after this one
    (TrainSpec.saving_listeners come first); the next ProgressHook step resumes."""

    def __init__(self, progress):
        self._progress = progress

    def before_save(self, session, global_step_value):
        self.end(session, global_step_value)  # writing the checkpoint is not training

    def end(self, session, global_step_value):
        # Not running: the first checkpoint, written before any step, or the final one
        # seen twice (its save and the end of saving).
        if self._progress.running:
            self._progress.pause(global_step_value)
            self._progress.report()


class EvaluationTimer(tf.compat.v1.train.SessionRunHook):
    """Times each evaluation for the run's RunProgress, from its graph's end to its end;
    views_per_batch: views of an image in one evaluation step (batch times views)."""

    def __init__(self, progress, views_per_batch):
        self._progress = progress
        self._views_per_batch = views_per_batch
        self._start, self._steps = None, 0

    def begin(self):
        self._start, self._steps = self._progress.clock(), 0

    def after_run(self, run_context, run_values):
        self._steps += 1

    def end(self, session):
        self._progress.add_evaluation(self._progress.clock() - self._start,
                                      self._steps * self._views_per_batch)
