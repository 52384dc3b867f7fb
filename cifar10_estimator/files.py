"""The package's file plumbing: a path's file functions, files written whole, JSON files.

Job and data dirs may be local or on an object store (gs://, hdfs://), which only
TensorFlow's file systems reach. A local path is handled with Python's own functions, so
that a command names a missing file in a moment instead of after the seconds that loading
TensorFlow takes (the curves command loads none at all).

Every file the package writes for others to read (TFRecords and their metadata, the JSON
files, a converted model, the curves' PNG, an archive) is written whole or not at all
(`written_whole`): under a temporary name beside it that only its writer uses, then
renamed over it. Readers (a resumed job, evaluate, a user's script) never see half a file,
even when the writer is killed or two writers race; the file gets the mode any new file
of the user's gets (the umask's); what a killed writer leaves is told by
`is_temporary_of`, and generate_tfrecords removes it.
"""

import contextlib
import json
import os
import types
import uuid

from cifar10_estimator.errors import Cifar10EstimatorError

# The end of written_whole's temporary names: '.<name>.<32 hex digits>.tmp'.
TEMPORARY_SUFFIX = ".tmp"


def is_url(path):
    """True for a path that only TensorFlow's file systems reach (gs://bucket/job)."""
    return "://" in str(path)


def for_path(path):
    """isdir, exists, listdir, open (as a text reader), rename (over its target), remove
    and errors (what they raise) for `path`."""
    if is_url(path):
        import tensorflow as tf
        return types.SimpleNamespace(
            isdir=tf.io.gfile.isdir, exists=tf.io.gfile.exists, listdir=tf.io.gfile.listdir,
            open=tf.io.gfile.GFile, remove=tf.io.gfile.remove,
            rename=lambda source, target: tf.io.gfile.rename(source, target, overwrite=True),
            errors=(OSError, tf.errors.OpError))
    return types.SimpleNamespace(isdir=os.path.isdir, exists=os.path.exists,
                                 listdir=os.listdir, open=open, remove=os.remove,
                                 rename=os.replace, errors=(OSError,))


def temporary_path(path):
    """A name beside `path` that no other writer uses: '.<name>.<32 hex digits>.tmp'."""
    folder, name = os.path.split(path)
    return os.path.join(folder, ".%s.%s%s" % (name, uuid.uuid4().hex, TEMPORARY_SUFFIX))


def is_temporary_of(name, target_name):
    """Whether the file name `name` is a temporary_path of a file named target_name: a
    writer's at work, or what a killed one left."""
    return name.startswith("." + target_name + ".") and name.endswith(TEMPORARY_SUFFIX)


@contextlib.contextmanager
def written_whole(path):
    """Yields a temporary path beside `path` for the block to write the file to; when the
    block ends, that file replaces `path` in one rename, or is removed if the block raised.

    The block creates the file as any other (open(), TensorFlow's writers, a library's
    save), so it gets the mode a plain open() gives. Local paths and TensorFlow's file
    systems alike; a local one loads no TensorFlow.
    """
    files = for_path(path)
    temporary = temporary_path(path)
    try:
        yield temporary
        files.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(*files.errors):
            if files.exists(temporary):
                files.remove(temporary)
        raise


def write_json(path, value):
    """Write `value` as indented, key-sorted JSON to `path`, whole or not at all.

    Returns: path.

    Raises:
      Cifar10EstimatorError: the file cannot be written (naming it and why).
    """
    files = for_path(path)
    try:
        with written_whole(path) as temporary:
            with files.open(temporary, "w") as stream:
                stream.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
    except files.errors as error:
        reason = getattr(error, "message", None) or getattr(error, "strerror", None) or error
        raise Cifar10EstimatorError("cannot write %s (%s)" % (path, reason))
    return path
