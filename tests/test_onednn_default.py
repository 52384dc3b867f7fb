"""Every command of the package runs TensorFlow's oneDNN kernels, on any CPU, unless the
user decided (cifar10_estimator/__init__.py)."""

import os
import subprocess
import sys

import pytest

from cifar10_estimator.cli.child_process import child_environment

# What a child sees once it has imported the package and then TensorFlow.
PROBE = ("import os, cifar10_estimator; from cifar10_estimator.machine import hardware; "
         "print(os.environ['TF_ENABLE_ONEDNN_OPTS'], hardware.onednn_enabled())")


def probe(setting):
    base = {name: value for name, value in os.environ.items()
            if name != "TF_ENABLE_ONEDNN_OPTS"}
    if setting is not None:
        base["TF_ENABLE_ONEDNN_OPTS"] = setting
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            env=child_environment(base=base), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()


@pytest.mark.parametrize("setting, seen", [(None, ["1", "True"]), ("1", ["1", "True"]),
                                           ("0", ["0", "False"])])
def test_onednn_is_on_unless_the_user_turned_it_off(setting, seen):
    assert probe(setting) == seen
