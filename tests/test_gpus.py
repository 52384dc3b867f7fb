"""A GPU box, played by a stand-in nvidia-smi listing two GPUs that this machine's TensorFlow
cannot use: the trainer's one-line refusal, the one command's plan and its check after the
install, and CUDA_VISIBLE_DEVICES read alike by the script and the trainer."""

import os
import subprocess
import sys

import pytest

import stand_ins
from cifar10_estimator import flags
from cifar10_estimator.errors import UsageError
from cifar10_estimator.machine import hardware
from cli_helpers import REPO_ROOT, assert_one_line_error, cli_env, run_module

MODULE = "cifar10_estimator.main"
SETUP_AND_RUN = os.path.join(REPO_ROOT, "scripts", "setup_and_run.sh")
LISTED = "the NVIDIA driver lists 2 (GPU 0: NVIDIA A100-SXM4-80GB, GPU 1: NVIDIA A100-SXM4-80GB)"


@pytest.fixture
def two_gpus_listed(tmp_path):
    """Environment variables whose PATH starts with a stand-in nvidia-smi listing two GPUs."""
    if hardware.num_gpus_visible():
        pytest.skip("TensorFlow sees GPUs here: the stand-in driver would not be the only one")
    driver = stand_ins.nvidia_smi_dir(tmp_path / "driver")
    return {"PATH": str(driver) + os.pathsep + os.environ["PATH"]}


@pytest.mark.slow
@pytest.mark.parametrize("num_gpus_flags, asked", [(["--num-gpus", "2"], "--num-gpus 2 asked"),
                                                   ([], "--num-gpus 1 asked")])  # the default
def test_gpus_tensorflow_cannot_use_stop_the_trainer_in_one_line_naming_them_and_the_fix(
        tiny_data_dir, tmp_path, two_gpus_listed, num_gpus_flags, asked):
    result = run_module(MODULE, ["--data-dir", tiny_data_dir, "--job-dir", tmp_path / "job"]
                        + num_gpus_flags, timeout=300, env=two_gpus_listed)
    line = assert_one_line_error(
        result, 2, asked, "but 0 GPUs are visible to TensorFlow", LISTED,
        # What TensorFlow 2.15 says where it cannot load CUDA, names and all: its loader's
        # lines, which "Cannot dlopen some GPU libraries" alone does not give.
        'TensorFlow said: "Could not load dynamic library \'libcudart.so.12\'',
        "pip install -e '.[gpu]'", "the GPU image", "--num-gpus 0 trains on the CPU")
    assert "UUID" not in line
    assert not (tmp_path / "job").exists()


def test_num_gpus_0_trains_on_the_cpu_whatever_the_driver_lists(tiny_data_dir, tmp_path,
                                                                 two_gpus_listed, monkeypatch):
    monkeypatch.setenv("PATH", two_gpus_listed["PATH"])
    monkeypatch.setattr(hardware, "gpu_library_messages", lambda: pytest.fail("asked"))
    assert hardware.driver_gpus()  # the stand-in driver lists its two
    settings = flags.parse(["--data-dir", str(tiny_data_dir), "--job-dir", str(tmp_path / "job"),
                            "--num-gpus", "0", "--eval-batch-size", "8"])
    flags.validate(settings)
    assert flags.resolve(settings).num_gpus == 0


def probed(monkeypatch, visible, listed, messages=(), cudnn=None):
    monkeypatch.setattr(hardware, "num_gpus_visible", lambda: visible)
    monkeypatch.setattr(hardware, "driver_gpus", lambda: list(listed))
    monkeypatch.setattr(hardware, "gpu_library_messages", lambda: list(messages))
    monkeypatch.setattr(hardware, "cudnn_wheel_version", lambda: cudnn)


def refusal(num_gpus):
    with pytest.raises(UsageError) as raised:
        flags.check_gpus_present(num_gpus)
    return str(raised.value)


def test_the_refusal_names_the_fix_that_fits_what_is_installed(monkeypatch):
    gpus = ["GPU 0: Tesla T4", "GPU 1: Tesla T4"]
    said = "Cannot dlopen some GPU libraries."
    probed(monkeypatch, 0, gpus, [said])
    message = refusal(2)
    assert 'lists 2 (GPU 0: Tesla T4, GPU 1: Tesla T4); TensorFlow said: "%s"' % said in message
    assert "needs CUDA 12.2 and cuDNN 8.9: pip install -e '.[gpu]' brings them" in message
    probed(monkeypatch, 0, gpus, [said], cudnn="8.9.4.25")
    assert ("TensorFlow's CUDA wheels are installed (nvidia-cudnn-cu12 8.9.4.25), so check "
            "that the driver serves CUDA 12.2") in refusal(2)
    probed(monkeypatch, 1, gpus, [said])  # one of two: still TensorFlow's loading
    assert "1 GPU is visible to TensorFlow, and the NVIDIA driver lists 2" in refusal(2)
    probed(monkeypatch, 2, gpus)  # TensorFlow sees what the driver lists: no more to say
    assert refusal(4) == ("--num-gpus 4 asked, but 2 GPUs are visible to TensorFlow; use "
                          "--num-gpus 2 (0 trains on the CPU)")
    probed(monkeypatch, 0, [])
    assert refusal(1).endswith("use --num-gpus 0 (0 trains on the CPU)")
    probed(monkeypatch, 2, gpus)
    flags.check_gpus_present(2)


SECOND_UUID = "GPU-8b31d7e4-22f0-4a5c-b6d8-3c9a4e1f7a02"


@pytest.mark.parametrize("visible, expected", [
    (None, [0, 1]), ("", []), ("1", [1]), ("1,0", [1, 0]), ("GPU-8b31", [1]),
    (SECOND_UUID + ",0", [1, 0]), ("0,7,1", [0]), ("-1", []), (" 1 ", [1]),
])
def test_cuda_visible_devices_leaves_the_script_and_the_trainer_the_same_gpus(
        tmp_path, monkeypatch, visible, expected):
    driver = stand_ins.nvidia_smi_dir(tmp_path / "driver")
    monkeypatch.setenv("PATH", str(driver) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    script = subprocess.run(["bash", "-c", "source scripts/venv.sh; driver_gpus"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, universal_newlines=True,
                            timeout=60, check=True)
    names = ["GPU %d: NVIDIA A100-SXM4-80GB" % index for index in expected]
    assert script.stdout.splitlines() == names
    assert hardware.driver_gpus() == names


def run_setup_and_run(args, env):
    return subprocess.run(["bash", SETUP_AND_RUN] + args, cwd=REPO_ROOT, env=cli_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300)


def test_the_one_commands_plan_on_a_gpu_box_installs_the_gpu_extra_and_checks_it(
        tmp_path, two_gpus_listed):
    venv = tmp_path / "venv"
    result = run_setup_and_run(["--dry-run"], dict(two_gpus_listed, VENV_DIR=str(venv),
                                                   PYTHON=sys.executable))
    assert result.returncode == 0, result.stderr
    plan = result.stdout
    assert "GPUs: the NVIDIA driver lists 2 (nvidia-smi -L, as CUDA_VISIBLE_DEVICES leaves " \
           "them): GPU 0: NVIDIA A100-SXM4-80GB, GPU 1: NVIDIA A100-SXM4-80GB" in plan
    assert "Install: pip install -e '.[gpu]' into %s" % venv in plan
    assert "CUDA 12.2 and cuDNN 8.9 wheels" in plan
    assert "Check: TensorFlow sees the 2 GPUs, else stop" in plan
    assert "-m cifar10_estimator.main --data-dir data --job-dir job --num-gpus 2\n" in plan
    assert "the tutorial's schedule, ResNet-44 for 80000 steps, on the 2 GPUs" in plan
    assert not venv.exists()

    hidden = run_setup_and_run(["--dry-run"], dict(two_gpus_listed, VENV_DIR=str(venv),
                                                   PYTHON=sys.executable,
                                                   CUDA_VISIBLE_DEVICES=""))
    assert "Install: pip install -e '.' into" in hidden.stdout
    assert "--num-gpus 0 --recipe quick" in hidden.stdout
    assert "Check:" not in hidden.stdout


def venv_of_this_python(directory, requirement):
    """A virtualenv directory whose python is this one, with `requirement` marked installed,
    so that the script installs nothing."""
    (directory / "bin").mkdir(parents=True)
    stand_ins.write_program(directory / "bin" / "python",
                            '#!/bin/sh\nexec "%s" "$@"\n' % sys.executable)
    checksum = subprocess.run("cat setup.py requirements.txt | cksum | cut -d' ' -f1",
                              shell=True, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              universal_newlines=True, check=True).stdout.strip()
    (directory / ".cifar10_estimator-installed").write_text("%s %s\n" % (requirement, checksum))
    return directory


@pytest.mark.slow
def test_where_tensorflow_sees_none_of_the_gpus_the_one_command_stops_after_the_install(
        tmp_path, two_gpus_listed):
    venv = venv_of_this_python(tmp_path / "venv", ".[gpu]")
    data_dir = tmp_path / "data"
    result = run_setup_and_run(["--data-dir", str(data_dir)],
                               dict(two_gpus_listed, VENV_DIR=str(venv)))
    assert_one_line_error(result, 2, "scripts/setup_and_run.sh: error: --num-gpus 2 asked, but "
                          "0 GPUs are visible to TensorFlow", LISTED, "TensorFlow said: ")
    assert not data_dir.exists()  # stopped before the data step, and trained nothing
