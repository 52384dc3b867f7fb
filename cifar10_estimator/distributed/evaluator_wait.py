"""The chief's wait for the evaluator's final result, so that a job's end does not cut it off.

With a chief, Kubeflow's training operator marks a TFJob succeeded when its chief has
succeeded, and the run policy `cleanPodPolicy: Running` (kubernetes/cifar10-tfjob.yaml)
then deletes the pods still running: the ps, which never exit, and an evaluator still
evaluating the final checkpoint. So a chief whose TF_CONFIG cluster lists an evaluator,
as the operator writes it, waits once training ended for the evaluator's final result:
job-dir/test_results.json at the last training step or later, which the evaluator writes
once it has evaluated, exported and tested the final checkpoint. The wait has a bound
(--evaluator-wait-secs); where it runs out, the chief says so in one line and ends as
it would have, its training done and saved. A cluster that leaves the evaluator out of
TF_CONFIG (tf.estimator's shape, the local launcher's default) does not tell the chief
that one runs, and the chief ends with its training, as tf.estimator's does.
"""

import os
import time

from cifar10_estimator import report
from cifar10_estimator.distributed import cluster
from cifar10_estimator.run import console

# As often as the evaluator looks for a new checkpoint (evaluator.CHECKPOINT_POLL_SECS).
POLL_SECS = 2


def chief_waits_for_the_evaluator(task):
    """Whether `task` (a cluster.ClusterTask, or None) is a chief whose TF_CONFIG cluster
    lists an evaluator."""
    return (task is not None and task.task_type == cluster.CHIEF
            and cluster.EVALUATOR in task.cluster)


def wait_for_final_result(job_dir, last_step, timeout_secs, stop_signals=None,
                          poll_secs=POLL_SECS):
    """Wait up to timeout_secs for job_dir's test results at last_step or later, saying
    so, and what came of it, on the console.

    An earlier run's results, at an earlier step, do not end the wait; those of a job
    whose final checkpoint was already evaluated end it at once.

    Args:
      stop_signals: the process's stop_signals.StopSignals, or None: a stop signal then
        ends the wait.

    Returns:
      The test results (report.test_results' dict), or None where the bound ran out.

    Raises:
      errors.RunStopped: a stop signal came during the wait.
    """
    path = os.path.join(job_dir, report.TEST_RESULTS_FILENAME)
    logger = console.console_logger()
    logger.info("Training done; waiting up to %g s (--evaluator-wait-secs) for the "
                "evaluator's final result, %s at step %d or later", timeout_secs, path,
                last_step)
    deadline = time.monotonic() + timeout_secs
    while True:
        results = report.read_test_results(job_dir)
        if results and results.get("global_step", -1) >= last_step:
            logger.info("The evaluator's final result: %s", report.test_accuracy_line(results))
            return results
        left_secs = deadline - time.monotonic()
        if left_secs <= 0:
            break
        if stop_signals is not None:
            stop_signals.raise_if_requested(
                "while waiting for the evaluator's final result, training done and its "
                "final checkpoint saved")
        time.sleep(min(poll_secs, left_secs))
    logger.warning(
        "no final result from the evaluator within %g s (--evaluator-wait-secs): %s has "
        "none at step %d or later; training is done and its final checkpoint saved "
        "(python -m cifar10_estimator.serving.evaluate --job-dir %s evaluates it)",
        timeout_secs, path, last_step, job_dir)
    return None
