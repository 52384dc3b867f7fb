"""JSON files the package writes (hparams.json, test results, data counts, reports).

Each is written whole or not at all: readers (a resumed job, evaluate, a user's script)
never see half a file, even when the writer is killed or two writers race.
"""

import json
import uuid

from cifar10_estimator.errors import Cifar10EstimatorError


def write_atomically(path, value):
    """Write `value` as indented, key-sorted JSON to `path`, replacing it in one rename.

    Local paths and TensorFlow file systems (gs://, hdfs://) alike: job dirs may be either.

    Raises:
      Cifar10EstimatorError: the file cannot be written (naming it and why).
    """
    import tensorflow as tf  # lazy: keeps the commands' --help and flag errors fast

    # Unique per writer: a restarted chief may write while its old self still does.
    temporary = "%s.tmp-%s" % (path, uuid.uuid4().hex)
    try:
        with tf.io.gfile.GFile(temporary, "w") as stream:
            stream.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        reason = getattr(error, "message", None) or getattr(error, "strerror", None) or error
        raise Cifar10EstimatorError("cannot write %s (%s)" % (path, reason))
    return path
