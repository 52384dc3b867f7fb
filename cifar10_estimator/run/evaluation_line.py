"""Each evaluation in one line on the console: the step, the set, its accuracy and loss,
and how long it took where the run's progress timed it (run.progress.EvaluationTimer).
"""

import tensorflow as tf

from cifar10_estimator.run import console
from cifar10_estimator.run import time_to_go


class EvaluationLineExporter(tf.estimator.Exporter):
    """Logs each evaluation of `evaluated` (e.g. 'validation set') in one line for the
    console, with its time where `progress`'s EvaluationTimer timed it; exports nothing.
    tf.estimator hands an exporter every evaluation's results, on any task."""

    def __init__(self, evaluated, progress=None):
        self._evaluated = evaluated
        self._progress = progress

    @property
    def name(self):
        return "evaluation_line"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        took = ""
        if self._progress is not None and self._progress.last_evaluation_secs is not None:
            took = ", %s" % time_to_go.duration_text(self._progress.last_evaluation_secs)
        console.console_logger().info(
            "evaluation of step %d on the %s: accuracy %.2f %%, loss %.4f%s",
            eval_result["global_step"], self._evaluated, 100 * eval_result["accuracy"],
            eval_result["loss"], took)
        return None
