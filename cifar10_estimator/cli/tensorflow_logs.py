"""TensorFlow's chatter muted: its C++ lines below a level, and its v1 deprecation notices."""

import logging
import os


def quiet_tensorflow_logs(cpp_min_log_level, python_log_level):
    """Mute TensorFlow's chatter: C++ lines below a level and v1 deprecation notices.

    Loads no TensorFlow: call it before TensorFlow is first imported (the C++ level is
    read once), e.g. before checks that may load it. A TF_CPP_MIN_LOG_LEVEL the user
    exported wins.

    Args:
      cpp_min_log_level: "0" all, "1" no INFO, "2" no WARNING, "3" no ERROR.
      python_log_level: level of TensorFlow's Python logger, e.g. "INFO" or "ERROR".
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", cpp_min_log_level)
    # The logger tf.get_logger() returns, which TensorFlow configures without a level.
    logger = logging.getLogger("tensorflow")
    logger.setLevel(python_log_level)
    logger.addFilter(_not_a_deprecation_notice)


def _not_a_deprecation_notice(record):
    """Whether a record of TensorFlow's logger is not a v1 deprecation notice, which its
    deprecation module logs as a warning at the first call of each deprecated function."""
    return record.module != "deprecation"
