"""What was measured on this machine, kept in the user's cache for the next run.

A speed holds on the machine it was measured on only. Each kind of measurement (the
precision probe's speeds, the step times the time to go rates phases from) is a file of
its own in $XDG_CACHE_HOME/cifar10_estimator/ (~/.cache/cifar10_estimator/ by default):
{"format": its format, "machines": {machine_key(): what was measured there}}. A missing,
unreadable or foreign file is an empty record, and what it would hold is measured anew.
"""

import json
import os

import tensorflow as tf

from cifar10_estimator import files
from cifar10_estimator.machine import hardware


def cache_path(filename):
    """Where the measurements of a kind are kept, per user: the file `filename`."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "cifar10_estimator", filename)


def machine_key():
    """What the speeds depend on: CPU, its bf16 instructions, TensorFlow and oneDNN."""
    first = hardware.first_cpu()
    flags = sorted(hardware.flags_of(first) & {
        "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_tile", "avx512f", "avx2"})
    return "%s | family %s model %s | %s | TensorFlow %s | oneDNN %s" % (
        first.get("model name", "unknown CPU"), first.get("cpu family", "?"),
        first.get("model", "?"), " ".join(flags), tf.__version__,
        "on" if hardware.onednn_enabled() else "off")


def read_cache(path, cache_format):
    """{machine key: what was measured there} of a cache file of `cache_format`; {} for a
    missing, unreadable or foreign one."""
    try:
        with open(path) as stream:
            content = json.load(stream)
        if content.get("format") == cache_format and isinstance(content["machines"], dict):
            return content["machines"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return {}


def write_cache(path, cache_format, machines):
    """Write {machine key: what was measured there} whole to the cache file `path`.

    Raises:
      OSError, Cifar10EstimatorError: the file or its folder could not be written.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.write_json(path, {"format": cache_format, "machines": machines})
