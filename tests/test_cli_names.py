"""Every command names itself in messages the way the user typed it."""

import os
import shutil
import subprocess
import sys

import pytest

from cli_helpers import REPO_ROOT, assert_one_line_error, cli_env, run_module

# (console command, module) pairs from setup.py.
COMMANDS = [
    ("cifar10-train", "cifar10_estimator.main"),
    ("cifar10-generate-tfrecords", "cifar10_estimator.generate_tfrecords"),
    ("cifar10-local-cluster", "cifar10_estimator.distributed.local_cluster"),
    ("cifar10-predict", "cifar10_estimator.serving.predict"),
    ("cifar10-evaluate", "cifar10_estimator.serving.evaluate"),
    ("cifar10-convert", "cifar10_estimator.serving.convert"),
    ("cifar10-synthetic-archive", "cifar10_estimator.data.synthetic_archive"),
    ("cifar10-benchmark", "cifar10_estimator.benchmarks"),
    ("cifar10-curves", "cifar10_estimator.curves"),
    ("cifar10-gpu-check", "cifar10_estimator.machine.gpu_check"),
    ("cifar10-cuda-libraries", "cifar10_estimator.machine.cuda_libraries"),
]


def console_command(name):
    """The installed console command beside this interpreter, or skip if not installed."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        path = shutil.which(name)
    if not path:
        pytest.skip("%s is not installed (pip install -e .)" % name)
    return path


@pytest.mark.parametrize("command, module", COMMANDS)
def test_python_m_names_the_module(command, module):
    result = run_module(module, ["--no-such-flag"], timeout=120)
    line = assert_one_line_error(result, 2)
    assert line.startswith("python -m %s: error:" % module), line


@pytest.mark.parametrize("command, module", COMMANDS)
def test_console_command_names_itself(command, module):
    result = subprocess.run([console_command(command), "--no-such-flag"], cwd=REPO_ROOT,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=120)
    line = assert_one_line_error(result, 2)
    assert line.startswith("%s: error:" % command), line


def test_script_names_itself():
    result = subprocess.run(
        [sys.executable, os.path.join("scripts", "launch_local_cluster.py"), "--no-such-flag"],
        cwd=REPO_ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    line = assert_one_line_error(result, 2)
    assert line.startswith("python scripts/launch_local_cluster.py: error:"), line
