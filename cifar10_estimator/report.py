"""The end of a training run: its one test evaluation, test_results.json, the closing summary.

Evaluations during training pick the best export on the validation set; the test set
is used once, on the final checkpoint, so that its accuracy is an honest estimate.
That evaluation goes to job-dir/eval_test/ (the Estimator's folder for an evaluation
named "test"), one log line and job-dir/test_results.json, which keeps the run's
training compute too (training.compute).
"""

import json
import os

from cifar10_estimator import files
from cifar10_estimator.training import compute

TEST_EVAL_NAME = "test"
TEST_RESULTS_FILENAME = "test_results.json"
TEST_RESULTS_FORMAT = "cifar10_estimator.test_results/1"


def test_accuracy_line(results):
    """The log line of the test evaluation, from `test_results`' dict."""
    return "Test accuracy: %.4f on %d examples (checkpoint %s); weights: %s" % (
        results["accuracy"], results["num_examples"], os.path.basename(results["checkpoint"]),
        results["weights"])


def test_results(metrics, num_examples, checkpoint, weights, training_compute=None):
    """The JSON-ready record of a test evaluation.

    Args:
      metrics: the Estimator's evaluation dict (accuracy, loss, global_step).
      num_examples: examples evaluated, each once.
      checkpoint: the checkpoint path evaluated.
      weights: which weights were evaluated (weight_averaging.evaluated_weights).
      training_compute: the run's training compute (training.compute.record), or None.
    """
    results = {
        "format": TEST_RESULTS_FORMAT,
        "subset": "eval",
        "accuracy": float(metrics["accuracy"]),
        "loss": float(metrics["loss"]),
        "num_examples": int(num_examples),
        "global_step": int(metrics["global_step"]),
        "checkpoint": checkpoint,
        "weights": weights,
    }
    if training_compute is not None:
        results["training_compute"] = training_compute
    return results


def write_test_results(job_dir, results):
    """Write `results` to job-dir/test_results.json atomically; returns its path."""
    return files.write_json(os.path.join(job_dir, TEST_RESULTS_FILENAME), results)


def read_test_results(job_dir):
    """job-dir/test_results.json as `test_results` made it, or None where the job has none
    that reads (it is written whole, so a reader never sees half of it)."""
    path = os.path.join(job_dir, TEST_RESULTS_FILENAME)
    path_files = files.for_path(path)
    try:
        with path_files.open(path, "r") as stream:
            results = json.loads(stream.read())
    except path_files.errors + (ValueError,):
        return None
    return results if isinstance(results, dict) else None


def _newest_export(job_dir, exporter_name):
    from cifar10_estimator.errors import Cifar10EstimatorError
    from cifar10_estimator.serving import export_dirs

    directory = os.path.join(job_dir, export_dirs.EXPORT_SUBDIR, exporter_name)
    try:
        return export_dirs.resolve_export_dir(directory)
    except Cifar10EstimatorError:
        return None


def summary(job_dir, data_dir, validation_metrics, results):
    """The closing text of a training run: accuracies, exports, and the next commands.

    Args:
      job_dir, data_dir: the run's flags (data_dir None with synthetic data).
      validation_metrics: the last evaluation on the validation set, or None when the
        run evaluated on the test set during training.
      results: the test evaluation, as `test_results` returns it.
    """
    from cifar10_estimator.serving import export_dirs

    lines = ["Training finished at step %d in %s." % (results["global_step"], job_dir)]
    if validation_metrics is not None:
        lines.append("  validation accuracy  %.4f" % validation_metrics["accuracy"])
    lines.append("  test accuracy        %.4f on %d examples (%s)" % (
        results["accuracy"], results["num_examples"],
        os.path.join(job_dir, TEST_RESULTS_FILENAME)))
    if "training_compute" in results:
        lines += compute.summary_lines(results["training_compute"])
    best = _newest_export(job_dir, export_dirs.BEST_EXPORTER_NAME)
    latest = _newest_export(job_dir, export_dirs.LATEST_EXPORTER_NAME)
    if best:
        lines.append("  best export          %s (highest validation accuracy)" % best)
    if latest:
        lines.append("  latest export        %s" % latest)
    lines.append("Next:")
    if best or latest:
        lines.append("  python -m cifar10_estimator.serving.predict --export-dir %s IMAGE.png"
                     % (best or latest))
    if data_dir:
        lines.append("  python -m cifar10_estimator.serving.evaluate --job-dir %s --data-dir %s "
                     "--subset eval" % (job_dir, data_dir))
    lines.append("  tensorboard --logdir %s" % job_dir)
    return "\n".join(lines)
