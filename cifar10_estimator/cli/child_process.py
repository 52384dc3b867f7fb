"""The environment of a child Python process that imports this copy of the package."""

import os

# The folder holding this copy of the package: a child process imports it from there.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_environment(extra=None, base=None):
    """The environment of a child Python process that imports this copy of the package.

    `base` (default os.environ) with PACKAGE_ROOT first on PYTHONPATH (and no empty entry,
    which Python would read as the working directory), TensorFlow's C++ INFO lines muted
    unless the environment says otherwise, and `extra` (a dict) over it all.
    """
    environment = dict(os.environ if base is None else base)
    environment["PYTHONPATH"] = os.pathsep.join(
        path for path in (PACKAGE_ROOT, environment.get("PYTHONPATH")) if path)
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    environment.update(extra or {})
    return environment
