"""Run the package's command-line tools as real subprocesses."""

import os
import re
import subprocess
import sys

import pytest

from cifar10_estimator.cli.child_process import child_environment

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# TensorFlow 2.15 logs from C++ at import even when nothing is wrong (e.g. "Unable to
# register cuDNN factory" on machines without CUDA); those lines are not ours.
# Tests that start many TensorFlow processes at once take turns on one worker of a parallel
# run: real clusters on 127.0.0.1 (side by side they would crowd the cores, and each takes
# ports that were free a moment before), and apart from them the benchmark's tests (its
# trainers share one run, made once on the worker of its group).
many_processes = pytest.mark.xdist_group("many_processes")
benchmark_trainers = pytest.mark.xdist_group("benchmark_trainers")

TENSORFLOW_CPP_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ")


def cli_env(extra=None):
    """Environment for a child: the repo importable, TensorFlow's C++ INFO lines muted."""
    return child_environment(extra)


# Wall-clock bounds. The tests wait for events (a line, a file, an exit), never for a
# time. A bound on such a wait (a child's timeout=, a polling loop's deadline) only makes a
# hung child fail its test with its output, sooner than pytest.ini's timeout (600 s a
# test) would: it claims no speed, and a wait that ends returns at once. So each is set
# at several times what its wait takes on a loaded 2-core machine running the suite in
# parallel, by what the child does:
#   60 s    little: stops before TensorFlow's import (a usage error, a shell script's own
#           checks, a `python -c` probe), or exits on a signal already sent to it;
#   120 s   imports TensorFlow (seconds on a loaded machine) and stops at a check, or
#           trains, evaluates or exports a handful of steps or images;
#   180-300 s  a tiny run end to end (ResNet-8, a few steps, its evaluations and exports),
#           a conversion, or a wait for a line or a checkpoint inside one;
#   540-600 s  several TensorFlow processes at once (a cluster, the benchmark's trainers).
# A bound that is a behaviour under test (a time a run must keep to, an interval in which
# something must not happen) says beside it why it is that long.


def run_module(module, args, timeout=600, env=None):
    """Run `python -m module args...` to completion; returns the CompletedProcess (text).
    timeout: seconds before it is killed as hung (see the wall-clock bounds above)."""
    return subprocess.run(
        [sys.executable, "-m", module] + [str(a) for a in args],
        cwd=REPO_ROOT, env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=timeout)


def start_module(module, args, env=None, **popen_kwargs):
    """Start `python -m module args...` without waiting; returns the Popen."""
    return subprocess.Popen(
        [sys.executable, "-m", module] + [str(a) for a in args],
        cwd=REPO_ROOT, env=cli_env(env), universal_newlines=True, **popen_kwargs)


def assert_one_line_error(result, status, *fragments):
    """The process exited with `status` and printed one error line naming `fragments`."""
    assert result.returncode == status, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not TENSORFLOW_CPP_LOG_LINE.match(line)]
    assert len(lines) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
