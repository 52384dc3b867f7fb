"""A job's checkpoints that cannot be read: a damaged newest checkpoint costs one.

A copy cut short or a disk error can leave the newest checkpoint of a job dir with a
data file truncated, a shard missing or its index damaged, while the ones before it
are whole. A checkpoint reads when every tensor it holds does (each is checked against
its checksum). The trainer moves the newest that do not read into
job-dir/damaged_checkpoints/, out of the job's checkpoint list, and resumes from the
newest that reads; evaluate evaluates that one and leaves the job dir as it is. Each
says so in one line; where none reads, one line names them all.
"""

import dataclasses
import os
import typing

import tensorflow as tf
from google.protobuf import text_format

from cifar10_estimator import files
from cifar10_estimator.cli.command import first_line
from cifar10_estimator.errors import Cifar10EstimatorError

DAMAGED_DIR = "damaged_checkpoints"
# The file of the job's checkpoint list (tf.train.get_checkpoint_state's).
CHECKPOINT_STATE_FILENAME = "checkpoint"


@dataclasses.dataclass(frozen=True)
class NewestReadable:
    """The newest checkpoint of a job that reads, and the newer ones that do not.

    Attributes:
      checkpoint: its prefix (JOB/model.ckpt-N), or None where the job has none.
      unreadable: ((prefix, why it cannot be read), ...) of the newer ones, newest first.
    """

    checkpoint: typing.Optional[str]
    unreadable: tuple = ()

    def unreadable_text(self):
        """'JOB/model.ckpt-N cannot be read (why)', naming each unreadable one."""
        return _unreadable_text(self.unreadable)


def unreadable_reason(prefix):
    """Why the checkpoint `prefix` cannot be read, in one line, or None where it reads."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    # The reader raises some of TensorFlow's statuses as Python's own errors: a data file
    # cut short as IndexError ('Read less bytes than requested').
    except (tf.errors.OpError, ValueError, IndexError, RuntimeError) as error:
        return first_line(error)
    return None


def job_checkpoints(job_dir):
    """The prefixes of the checkpoints job_dir's checkpoint list names, newest first."""
    state = tf.train.get_checkpoint_state(job_dir)
    if state is None:
        return []
    newest_first = [state.model_checkpoint_path] + list(state.all_model_checkpoint_paths)[::-1]
    return list(dict.fromkeys(path for path in newest_first if path))


def newest_readable(job_dir):
    """The NewestReadable of job_dir; the checkpoints older than it are not read.

    Raises:
      Cifar10EstimatorError: the job has checkpoints and none reads (naming each).
    """
    unreadable = []
    for prefix in job_checkpoints(job_dir):
        reason = unreadable_reason(prefix)
        if reason is None:
            return NewestReadable(prefix, tuple(unreadable))
        unreadable.append((prefix, reason))
    if unreadable:
        raise Cifar10EstimatorError(
            "no checkpoint of %s can be read: %s; restore them from a copy, or pass another "
            "--job-dir" % (job_dir, _unreadable_text(unreadable).replace(" cannot be read", "")))
    return NewestReadable(None)


def _unreadable_text(unreadable):
    if len(unreadable) == 1:
        return "%s cannot be read (%s)" % unreadable[0]
    return "%s cannot be read" % ", ".join("%s (%s)" % pair for pair in unreadable)


def resume_point(job_dir):
    """Where a trainer resumes job_dir from: its newest checkpoint that reads, the newer
    ones that do not moved into job-dir/DAMAGED_DIR/ and off the checkpoint list.

    Returns:
      (the checkpoint or None where the job has none, the line that says where the run
      resumes from and what was moved aside, or None).

    Raises:
      Cifar10EstimatorError: the job has checkpoints and none reads.
    """
    newest = newest_readable(job_dir)
    if newest.checkpoint is None:
        return None, None
    if not newest.unreadable:
        return newest.checkpoint, "Resuming from %s" % newest.checkpoint
    folder = os.path.join(job_dir, DAMAGED_DIR)
    for prefix, _ in newest.unreadable:
        _move_checkpoint(prefix, folder)
    _drop_from_checkpoint_list(job_dir, newest.checkpoint,
                               [prefix for prefix, _ in newest.unreadable])
    return newest.checkpoint, "%s: moved aside to %s; resuming from %s" % (
        newest.unreadable_text(), folder, newest.checkpoint)


def _move_checkpoint(prefix, folder):
    """Move the files of the checkpoint `prefix` into `folder`, under a prefix of the same
    name there (with a number where one of it is there already)."""
    tf.io.gfile.makedirs(folder)
    name = os.path.basename(prefix)
    target = os.path.join(folder, name)
    number = 1
    while tf.io.gfile.glob(target + ".*"):
        number += 1
        target = os.path.join(folder, "%s.%d" % (name, number))
    for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.rename(path, target + path[len(prefix):])


def _drop_from_checkpoint_list(job_dir, newest, dropped):
    """Rewrite job_dir's checkpoint list without `dropped`, naming `newest` the newest,
    its paths relative to job_dir as the trainer's Saver writes them."""
    state = tf.train.get_checkpoint_state(job_dir)
    kept = [(path, stamp) for path, stamp in zip(
        state.all_model_checkpoint_paths,
        list(state.all_model_checkpoint_timestamps) or [None] * len(
            state.all_model_checkpoint_paths)) if path not in dropped]
    state.model_checkpoint_path = os.path.relpath(newest, job_dir)
    del state.all_model_checkpoint_paths[:]
    state.all_model_checkpoint_paths.extend(os.path.relpath(path, job_dir) for path, _ in kept)
    if state.all_model_checkpoint_timestamps:
        del state.all_model_checkpoint_timestamps[:]
        state.all_model_checkpoint_timestamps.extend(stamp for _, stamp in kept)
    path = os.path.join(job_dir, CHECKPOINT_STATE_FILENAME)
    with files.written_whole(path) as temporary:
        with files.for_path(path).open(temporary, "w") as stream:
            stream.write(text_format.MessageToString(state))
