"""A job's hyper-parameters in TensorBoard's HParams dashboard, beside its accuracies.

The chief writes the resolved HParams (the record hparams.json holds) into the job dir's
events when it starts, with the dashboard's metrics: the evaluations' accuracy and loss
on the validation set (job-dir/eval_validation/) and the test accuracy
(job-dir/eval_test/), whose newest values the dashboard shows. `tensorboard --logdir
JOBS` over several job dirs then lists each job as a row, so recipes and seeds compare
in one table. Uses the HParams plugin of the tensorboard package TensorFlow installs.
"""

import os

import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from cifar10_estimator.run.evaluation_dirs import VALIDATION_DIR


def dashboard_values(recorded):
    """The recorded values (hparams.record's) the dashboard can show (numbers, strings and
    booleans that are set); a field left unset (None) is left out of the job's row."""
    return {name: value for name, value in recorded.items()
            if isinstance(value, (bool, int, float, str))}


def dashboard_metrics(test_dir):
    """(the evaluation's directory under the job dir, its tag, the dashboard's column) of
    each metric; test_dir: the one test evaluation's directory (report's)."""
    return ((VALIDATION_DIR, "accuracy", "validation accuracy"),
            (VALIDATION_DIR, "loss", "validation loss"),
            (test_dir, "accuracy", "test accuracy"))


def write(job_dir, recorded, test_dir):
    """Write the job's recorded hyper-parameters (hparams.record's) and the dashboard's
    metrics into job_dir's events.

    Call in eager mode (main's, outside the Estimator's graphs). Each run that trains
    the job writes them again; the dashboard shows the newest.

    Args:
      test_dir: the directory of the one test evaluation under the job dir.
    """
    values = dashboard_values(recorded)
    writer = tf.summary.create_file_writer(job_dir, filename_suffix=".hparams")
    with writer.as_default():
        hparams_api.hparams_config(
            hparams=[hparams_api.HParam(name) for name in sorted(values)],
            metrics=[hparams_api.Metric(tag, group=group, display_name=column)
                     for group, tag, column in dashboard_metrics(test_dir)])
        hparams_api.hparams(values, trial_id=os.path.basename(os.path.normpath(job_dir)))
    writer.close()
