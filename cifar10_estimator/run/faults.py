"""A run's faults that end it with one line: a diverging loss, a full or read-only disk.

Divergence: DivergenceHook ends training at the first step whose loss is NaN or infinite,
before tf.estimator's NanTensorHook would end it with a traceback, and leaves the job
dir's `checkpoint` file naming the newest checkpoint whose weights are all finite.
Nothing is evaluated or exported after it.

The disk: disk_fault turns an error of a full or read-only file system under the job dir
into one line (generate_tfrecords names its data dir on its own). TensorFlow writes a checkpoint under temporary names and updates the
`checkpoint` file last, so the checkpoint it names stays whole; the temporary files of
the save that failed are removed, and once there is space the same command resumes.
"""

import errno
import glob
import math
import os

import numpy as np
import tensorflow as tf

from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.settings import schedule


class TrainingDiverged(Cifar10EstimatorError):
    """The training loss became NaN or infinite."""


class DivergenceHook(tf.compat.v1.train.SessionRunHook):
    """Ends training with TrainingDiverged at the first step whose loss is not finite.

    It must run before tf.estimator's NanTensorHook: put it in the TrainSpec's hooks.
    """

    def __init__(self, hparams, job_dir):
        self._hparams = hparams
        self._job_dir = job_dir

    def begin(self):
        # tf.estimator adds its EstimatorSpec's loss to the LOSSES collection before the
        # training session, and so this hook, begins; the model adds no other.
        self._loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[-1]
        self._global_step = tf.compat.v1.train.get_global_step()
        self._step_fed = tf.compat.v1.placeholder(tf.int64, [])
        self._learning_rate_at_step = schedule.learning_rate_tensor(self._hparams,
                                                                    self._step_fed)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        loss = run_values.results
        if math.isfinite(loss):
            return
        session = run_context.session
        # The step whose loss it is: the global step before that step's update.
        step = int(session.run(self._global_step)) - 1
        learning_rate = session.run(self._learning_rate_at_step, {self._step_fed: step})
        raise TrainingDiverged(divergence_message(step, loss, learning_rate,
                                                  last_finite_checkpoint(self._job_dir)))


def divergence_message(step, loss, learning_rate, checkpoint):
    """The one line of a run whose loss at `step` was `loss` (NaN or infinite)."""
    if checkpoint:
        kept = "the last checkpoint with finite weights is %s" % checkpoint
    else:
        kept = "no checkpoint kept in the job dir holds finite weights"
    return ("training diverged at step %d: the loss became %s at learning rate %g; %s, and "
            "the diverged weights were not exported. Try a lower --learning-rate, a warm-up (--warmup-epochs) "
            "or --precision fp32" % (step, loss, learning_rate, kept))


def last_finite_checkpoint(job_dir):
    """The newest checkpoint of job_dir whose floating-point variables are all finite.

    Where newer checkpoints hold NaN or infinite values (written between the weights'
    divergence and the loss's), the job dir's `checkpoint` file is rewritten to name this
    one, so that a rerun, evaluate and export restore finite weights. Returns None where
    no checkpoint is finite.
    """
    state = tf.train.get_checkpoint_state(job_dir)
    if state is None or not state.model_checkpoint_path:
        return None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    for index in range(len(paths) - 1, -1, -1):
        if is_finite_checkpoint(paths[index]):
            if paths[index] != state.model_checkpoint_path:
                tf.compat.v1.train.update_checkpoint_state(job_dir, paths[index],
                                                           paths[:index + 1])
            return paths[index]
    return None


def is_finite_checkpoint(path):
    """Whether every floating-point variable of the checkpoint `path` is finite."""
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError):
        return False
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating and not np.all(np.isfinite(reader.get_tensor(name))):
            return False
    return True


# Each errno of a file system that takes no more writes: (the system's words for it,
# what the message says of the disk, what to do).
_DISK_FAULTS = {
    errno.ENOSPC: ("No space left on device", "is full", "free space there"),
    errno.EDQUOT: ("Disk quota exceeded", "is over its quota", "free space there"),
    errno.EROFS: ("Read-only file system", "is read-only", "make it writable"),
}


def disk_fault(error, job_dir):
    """A one-line Cifar10EstimatorError where `error` is a full or read-only disk, else None.

    Args:
      error: an OSError, a tf.errors.OpError, or a Cifar10EstimatorError (whose message
        carries the system's reason).
      job_dir: the job dir being written; the temporary files of a failed checkpoint
        save are removed from it.
    """
    if isinstance(error, OSError):
        fault = _DISK_FAULTS.get(error.errno)
    else:
        text = str(error)
        fault = next((value for value in _DISK_FAULTS.values() if value[0] in text), None)
    if fault is None:
        return None
    removed = _remove_failed_save(job_dir)
    checkpoint = tf.train.latest_checkpoint(job_dir)
    if checkpoint:
        kept = "%s is whole, and the same command resumes from it" % checkpoint
    else:
        kept = "no checkpoint had been written; the same command starts again"
    reason, state, remedy = fault
    return Cifar10EstimatorError(
        "the disk under the job dir %s %s (%s): %s, or rerun with a copy of the directory "
        "elsewhere; %s%s" % (
            job_dir, state, reason, remedy, kept,
            " (the failed save's %d temporary file%s removed)" % (
                removed, " was" if removed == 1 else "s were") if removed else ""))


def _remove_failed_save(directory):
    """Remove what a checkpoint save that failed leaves in `directory`; returns how many.

    tf.compat.v1.train.Saver writes model.ckpt-N_temp*/ (sharded data) and
    model.ckpt-N.meta.tmp* before renaming them; no finished file has those names.
    """
    removed = 0
    patterns = ("model.ckpt-*_temp*", "model.ckpt-*.meta.tmp*", "checkpoint.tmp*")
    for pattern in patterns:
        for path in glob.glob(os.path.join(directory, pattern)):
            try:
                if os.path.isdir(path):
                    tf.io.gfile.rmtree(path)
                else:
                    os.remove(path)
                removed += 1
            except (OSError, tf.errors.OpError):
                pass
    return removed
