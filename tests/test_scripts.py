"""The set-up scripts: Python version check and the offline --synthetic run, for real."""

import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

import cifar_archives
import stand_ins
from cli_helpers import REPO_ROOT, cli_env

SETUP_AND_RUN = os.path.join(REPO_ROOT, "scripts", "setup_and_run.sh")


def run_script(args, env, timeout=600):
    return subprocess.run(["bash", SETUP_AND_RUN] + args, cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)


def test_unsupported_python_stops_at_once_and_says_which_versions_work(tmp_path):
    fake = tmp_path / "python3.12"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.12.1" && exit 0\nexit 1\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = cli_env({"PYTHON": str(fake), "VENV_DIR": str(tmp_path / "venv")})
    result = run_script(["--synthetic"], env, timeout=60)
    assert result.returncode == 2
    assert "Python 3.12.1" in result.stderr
    assert "3.9, 3.10 or 3.11" in result.stderr and "TensorFlow 2.15" in result.stderr
    assert not (tmp_path / "venv").exists()


FETCH_PYTHON = "uv's CPython 3.11, fetched with uv python install 3.11, uv being "


def plan_without_python(tmp_path, stand_in_scripts):
    """The one command's --dry-run on a PATH with no Python 3.9-3.11, python3 being 3.13,
    and the stand-in programs {name: shell script} first."""
    path = stand_ins.path_without_python(tmp_path / "path")
    stand_in_dir = path.split(os.pathsep)[0]
    for name, script in stand_in_scripts.items():
        stand_ins.write_program(tmp_path / "path" / "stand-ins" / name, script)
    environment = {"PATH": path, "HOME": str(tmp_path / "home"),
                   "VENV_DIR": str(tmp_path / "venv"), "UV_DIR": str(tmp_path / "uv")}
    result = subprocess.run(["/bin/bash", SETUP_AND_RUN, "--dry-run"], cwd=REPO_ROOT,
                            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=60)
    assert not (tmp_path / "venv").exists() and not (tmp_path / "uv").exists()
    return result, stand_in_dir


PYTHON_313_WITH_PIP = """#!/bin/sh
case "$*" in "--version") echo "Python 3.13.1" ;; "-m pip --version") echo "pip 25.0" ;;
*) exit 1 ;; esac
"""


@pytest.mark.parametrize("stand_in_scripts, uv_from", [
    # The curl of uv's standalone installer (Ubuntu 24.04 and Debian 13 come without pip).
    ({"curl": "#!/bin/sh\nexit 7\n"}, "its standalone installer, fetched with curl -LsSf "
     "https://astral.sh/uv/install.sh | UV_INSTALL_DIR={uv}/bin sh"),
    ({"wget": "#!/bin/sh\nexit 7\n"}, "its standalone installer, fetched with wget -qO- "),
    # A pip installs uv's wheel beside the system's packages, which PEP 668 allows.
    ({"python3": PYTHON_313_WITH_PIP, "curl": "#!/bin/sh\nexit 7\n"},
     "its wheel, fetched with {stand_ins}/python3 -m pip install --target {uv} uv"),
    # A uv of the user's, which has not fetched a CPython 3.11 yet.
    ({"uv": "#!/bin/sh\nexit 2\n"}, "{stand_ins}/uv;"),
])
def test_without_python_3_9_to_3_11_the_plan_is_uvs_cpython_3_11(tmp_path, stand_in_scripts,
                                                                  uv_from):
    result, stand_in_dir = plan_without_python(tmp_path, stand_in_scripts)
    assert result.returncode == 0, result.stderr
    assert "Python: none of python3.11, python3.10, python3.9, python3 is 3.9-3.11 here " \
           "(python3 is Python 3.13.1): " + FETCH_PYTHON in result.stdout
    assert uv_from.format(uv=tmp_path / "uv", stand_ins=stand_in_dir) in result.stdout
    assert "the virtualenv %s is made with it" % (tmp_path / "venv") in result.stdout


def test_where_uv_cannot_be_had_either_the_plan_is_one_line_naming_the_ways_that_work(
        tmp_path):
    result, _ = plan_without_python(tmp_path, {})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: no Python 3.9, 3.10 or 3.11 here (python3 is "
                                    "Python 3.13.1), and no uv to fetch one with")
    for way in ("Install uv (https://docs.astral.sh/uv/", "fetches CPython 3.11 with it",
                "set PYTHON=/path/to/python3.11", "the container image (docs/install.md"):
        assert way in result.stderr


# A virtualenv's python that logs each call and plays its part: pip installs uv (a uv that
# logs and exits with UV_STATUS), -c programs succeed and print where packages go.
FAKE_VENV_PYTHON = """#!/bin/sh
echo "python $*" >> "$CALLS"
case "$*" in
  "-m pip install --quiet uv")
    printf '#!/bin/sh\necho "uv $*" >> "$CALLS"\nexit $UV_STATUS\n' > "$(dirname "$0")/uv"
    chmod +x "$(dirname "$0")/uv" ;;
  -c*) echo "$(dirname "$0")" ;;
esac
exit 0
"""


def install_with_fake_tools(tmp_path, env):
    """The installer's calls and stderr, ensuring a virtualenv whose python is a fake."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_VENV_PYTHON)
    (bin_dir / "python").chmod(0o755)
    calls = tmp_path / "calls"
    result = subprocess.run(
        ["bash", "-c", 'set -euo pipefail; source scripts/venv.sh; ensure_venv ".[test]"'],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=60,
        env=cli_env(dict(env, VENV_DIR=str(tmp_path / "venv"), CALLS=str(calls))))
    assert result.returncode == 0, result.stderr
    installs = [line for line in calls.read_text().splitlines()
                if " install " in line or line.startswith("uv ")]
    return installs, result.stderr


def test_the_scripts_install_with_uv_and_fall_back_to_pip(tmp_path):
    venv_python = str(tmp_path / "venv" / "bin" / "python")
    pip_install = "python -m pip install --quiet --no-compile -e .[test]"
    uv_install = "uv pip install --quiet --python %s -e .[test]" % venv_python
    get_uv = "python -m pip install --quiet uv"

    installs, stderr = install_with_fake_tools(tmp_path / "uv", {"UV": "1", "UV_STATUS": "0"})
    assert installs == [get_uv, uv_install.replace(str(tmp_path), str(tmp_path / "uv"))]
    assert "pip instead" not in stderr

    installs, stderr = install_with_fake_tools(tmp_path / "uv_fails",
                                               {"UV": "1", "UV_STATUS": "1"})
    assert installs == [get_uv, uv_install.replace(str(tmp_path), str(tmp_path / "uv_fails")),
                        pip_install]
    assert "uv could not install .[test]; installing with pip instead" in stderr

    installs, _ = install_with_fake_tools(tmp_path / "pip_only", {"UV": "0"})
    assert installs == [pip_install]


@pytest.mark.slow
def test_synthetic_run_prepares_data_and_trains_without_a_download(tmp_path):
    # The current interpreter's environment already has the package's dependencies.
    env = cli_env({"VENV_DIR": sys.prefix, "PYTHON": sys.executable,
                   "CIFAR10_DOWNLOAD_URL": "http://127.0.0.1:9/unreachable"})
    data_dir, job_dir = tmp_path / "data", tmp_path / "job"
    result = run_script(["--synthetic", "--data-dir", str(data_dir), "--job-dir", str(job_dir),
                         "--", "--num-gpus", "0", "--num-layers", "8", "--train-steps", "4",
                         "--train-batch-size", "16", "--eval-batch-size", "40"], env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (data_dir / "train.tfrecords").exists()
    assert os.path.exists(str(job_dir / "model.ckpt-4.index"))
    assert "Test accuracy: " in result.stderr


@pytest.mark.slow
def test_unreachable_server_points_to_the_offline_path(tmp_path):
    env = cli_env({"VENV_DIR": sys.prefix, "PYTHON": sys.executable,
                   "CIFAR10_DOWNLOAD_URL": "http://127.0.0.1:9/cifar-10-python.tar.gz"})
    result = run_script(["--data-dir", str(tmp_path / "data")], env)
    assert result.returncode == 1
    assert "cannot download" in result.stderr
    assert "--synthetic" in result.stderr
    assert not (tmp_path / "data" / "train.tfrecords").exists()


@pytest.mark.slow
def test_without_a_gpu_the_one_command_trains_the_quick_recipe_and_says_so(tmp_path):
    # An official-format archive of 500 images a batch: 2000 to train on, 500 to validate
    # and 500 to test, which the quick recipe's evaluation batch of 500 divides.
    data_dir, job_dir = tmp_path / "data", tmp_path / "job"
    data_dir.mkdir()
    cifar_archives.write_archive_with_md5(
        str(data_dir / cifar_archives.ARCHIVE_NAME), cifar_archives.make_batches(500, seed=3))
    env = cli_env({"VENV_DIR": sys.prefix, "PYTHON": sys.executable,
                   "CUDA_VISIBLE_DEVICES": ""})
    process = subprocess.Popen(
        ["bash", SETUP_AND_RUN, "--data-dir", str(data_dir), "--job-dir", str(job_dir)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        universal_newlines=True, start_new_session=True)
    seen = []
    # A hang guard (cli_helpers): the conversion and the trainer's start; killed, the
    # script's output ends, and with it the reading, line or no line.
    hang_guard = threading.Timer(300, os.killpg, (process.pid, signal.SIGKILL))
    hang_guard.start()
    try:
        # The trainer's plan line comes once its flags, data and hparams.json are settled:
        # what was chosen is known by then, so the run is stopped there.
        for line in process.stderr:
            seen.append(line)
            if "Recipe " in line:
                break
    finally:
        hang_guard.cancel()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    text = "".join(seen)
    assert "No GPU found: training the quick recipe" in text, text[-3000:]
    assert "bash scripts/setup_and_run.sh -- --num-gpus 0 --recipe long" in text
    assert "for the tutorial's schedule: bash scripts/setup_and_run.sh -- --num-gpus 0" in text
    # 20 epochs of 2000 images at 64 a step (31 whole steps an epoch).
    assert "Recipe quick. Training to step 620 (20.0 epochs of 2000 examples" in text, text[-3000:]
    saved = json.loads((job_dir / "hparams.json").read_text())["runs"][-1]["hparams"]
    assert saved["recipe"] == "quick"
    assert saved["num_layers"] == 14 and saved["train_epochs"] == 20
    assert saved["precision"] in ("fp32", "bf16")  # auto resolved
