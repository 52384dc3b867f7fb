"""The hooks that feed the run's time to go (run.time_to_go) and show it.

ProgressHook records a point of the run's RunProgress every N global steps and reports
its line, ProgressCheckpointListener pauses the clock at each checkpoint, since an
evaluation may follow, EvaluationTimer times the evaluations, and EvaluationLineExporter
says each evaluation in one line.
"""

import tensorflow as tf

from cifar10_estimator import cifar10_utils
from cifar10_estimator.run import console
from cifar10_estimator.run import time_to_go

# TensorBoard's tag of the run's rate (the rate of the time to go).
EXAMPLES_PER_SEC_TAG = "examples/sec"


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Logs where the run is and when it ends every N global steps and when its session ends.

    The line (see time_to_go.progress_line) is the run's, from the global step: in a
    cluster every worker logs the cluster's progress and rate, and the time until the
    global step reaches the last step, whichever workers make the steps. (Each worker's
    own rate is ExamplesPerSecondHook's line.) Per step the hook only fetches the global
    step and compares it; it records a point for RunProgress at each line, and at the
    first step of a session or after an evaluation, which resumes the clock.
    """

    def __init__(self, progress, every_n_steps=100, summary_dir=None,
                 summary_every_n_steps=100):
        """Args:
          progress: the run's time_to_go.RunProgress, shared by every session of the
            process.
          every_n_steps: report when the global step reaches a multiple of this.
          summary_dir: where the run's rate goes as TensorBoard's `examples/sec` curve
            (the chief's model dir), or None.
          summary_every_n_steps: write the curve's point when the global step reaches a
            multiple of this.
        """
        self._progress = progress
        self._every_n_steps = every_n_steps
        self._summary_writer = (tf.compat.v1.summary.FileWriterCache.get(summary_dir)
                                if summary_dir else None)
        self._summary_every_n_steps = summary_every_n_steps
        self._next_summary_step = 0
        self._global_step = None
        self._next_log_step = 0  # the session's first step records a point
        self._newest_global_step = None
        self._logged_global_step = None

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
        self._write_summary()
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
        self._progress.report()
        self._logged_global_step = self._progress.global_step

    def _write_summary(self):
        global_step = self._progress.global_step
        if self._summary_writer is None or global_step < self._next_summary_step:
            return
        examples_per_sec = self._progress.estimate().examples_per_sec
        if examples_per_sec is None:
            return
        self._summary_writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=EXAMPLES_PER_SEC_TAG,
                                       simple_value=examples_per_sec)]), global_step)
        self._next_summary_step = ((global_step // self._summary_every_n_steps + 1)
                                   * self._summary_every_n_steps)


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
            self._progress.report()


class EvaluationTimer(tf.compat.v1.train.SessionRunHook):
    """Times each evaluation for the run's RunProgress: from its graph's end to its end."""

    def __init__(self, progress, views_per_batch):
        """Args:
          progress: the run's RunProgress.
          views_per_batch: forward passes of an image in one evaluation step (the batch
            times the views of each image).
        """
        self._progress = progress
        self._views_per_batch = views_per_batch
        self._start = None
        self._steps = 0

    def begin(self):
        self._start = self._progress.clock()
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1

    def end(self, session):
        self._progress.add_evaluation(self._start, self._progress.clock() - self._start,
                                      self._steps * self._views_per_batch)


class EvaluationLineExporter(tf.estimator.Exporter):
    """Logs each evaluation in one line for the console; exports nothing.

    An exporter is what tf.estimator hands every evaluation's results to, during
    training and for the final checkpoint, on one machine and on an evaluator task.
    """

    def __init__(self, evaluated, progress=None):
        """Args:
          evaluated: what the evaluation reads, e.g. 'validation set'.
          progress: the run's RunProgress, whose EvaluationTimer timed the evaluation.
        """
        self._evaluated = evaluated
        self._progress = progress

    @property
    def name(self):
        return "evaluation_line"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        took = ""
        if self._progress is not None and self._progress.last_evaluation_secs is not None:
            took = ", %s" % time_to_go.measured_duration_text(
                self._progress.last_evaluation_secs)
        console.console_logger().info(
            "evaluation of step %d on the %s: accuracy %.2f %%, loss %.4f%s",
            eval_result["global_step"], self._evaluated, 100 * eval_result["accuracy"],
            eval_result["loss"], took)
        return None
