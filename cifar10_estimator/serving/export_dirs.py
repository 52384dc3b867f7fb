"""Where a job's exports are, and which one a path designates (see export.py).

Imports no TensorFlow: for a local path Python's own file functions answer
(files.for_path), so that predict and convert name a missing export in a moment, before
they load TensorFlow.
"""

import os

from cifar10_estimator import files
from cifar10_estimator.errors import Cifar10EstimatorError

EXPORT_SUBDIR = "export"
LATEST_EXPORTER_NAME = "latest"
BEST_EXPORTER_NAME = "best"
SAVED_MODEL_FILENAME = "saved_model.pb"


def timestamped_exports(directory):
    """Sub-directories of `directory` named by an export timestamp and holding a complete
    SavedModel, oldest first."""
    file_system = files.for_path(directory)
    if not file_system.isdir(directory):
        return []
    names = [name.rstrip("/") for name in file_system.listdir(directory)]
    return [os.path.join(directory, name) for name in sorted(
        (name for name in names if name.isdigit()), key=int)
        if file_system.exists(os.path.join(directory, name, SAVED_MODEL_FILENAME))]


def resolve_export_dir(path):
    """The SavedModel directory that `path` designates.

    Args:
      path: a SavedModel directory (job-dir/export/best/<timestamp>); a directory of
        timestamped exports (job-dir/export/latest), giving the newest; or a job dir,
        giving the newest export under export/best, else under export/latest.

    Raises:
      Cifar10EstimatorError: path holds none of these.
    """
    file_system = files.for_path(path)
    if file_system.exists(os.path.join(path, SAVED_MODEL_FILENAME)):
        return path
    candidates = [path] + [os.path.join(path, EXPORT_SUBDIR, name)
                           for name in (BEST_EXPORTER_NAME, LATEST_EXPORTER_NAME)]
    for directory in candidates:
        exports = timestamped_exports(directory)
        if exports:
            return exports[-1]
    if not file_system.isdir(path):
        raise Cifar10EstimatorError("export directory %s does not exist" % path)
    raise Cifar10EstimatorError(
        "no SavedModel in %s: pass an export (job-dir/export/best/<timestamp>), a directory "
        "of timestamped exports, or a job dir with export/best or export/latest (written "
        "when training evaluates)" % path)
