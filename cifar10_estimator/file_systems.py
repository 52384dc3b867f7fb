"""The file functions that reach a path: Python's own for a local path, TensorFlow's for
a URL.

Job and data dirs may be local or on an object store (gs://, hdfs://), which only
TensorFlow's file systems reach. A local path is checked with Python's own functions, so
that a command names a missing file in a moment instead of after the seconds that loading
TensorFlow takes.
"""

import os
import types


def is_url(path):
    """True for a path that only TensorFlow's file systems reach (gs://bucket/job)."""
    return "://" in str(path)


def for_path(path):
    """isdir, exists, listdir, open (as a text reader) and errors (what they raise) for
    `path`."""
    if is_url(path):
        import tensorflow as tf
        return types.SimpleNamespace(isdir=tf.io.gfile.isdir, exists=tf.io.gfile.exists,
                                     listdir=tf.io.gfile.listdir, open=tf.io.gfile.GFile,
                                     errors=(OSError, tf.errors.OpError))
    return types.SimpleNamespace(isdir=os.path.isdir, exists=os.path.exists,
                                 listdir=os.listdir, open=open, errors=(OSError,))
