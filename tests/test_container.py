"""The container image: what the Dockerfile promises, and (where asked) its build and a
training in it, stopped and resumed, by scripts/container.sh with Docker or Podman; and the
GPU image's CUDA libraries, opened as TensorFlow opens them (the check of every library,
cifar10_estimator.machine.cuda_libraries, whose run without the GPU wheels
tests/test_cuda_libraries.py tests)."""

import os
import re
import shutil
import subprocess

import pytest

from cli_helpers import REPO_ROOT
from test_cuda_libraries import CUDA_LIBRARY_NAMES, cuda_library_lines

CONTAINER_SH = os.path.join(REPO_ROOT, "scripts", "container.sh")


def read(path):
    with open(os.path.join(REPO_ROOT, path)) as stream:
        return stream.read()


def test_the_dockerfile_takes_a_base_and_the_gpu_flavour_and_runs_the_trainer():
    dockerfile = read("Dockerfile")
    assert re.search(r"^ARG BASE=python:3\.11-slim$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", dockerfile, re.M)
    assert re.search(r"^ARG EXTRAS=$", dockerfile, re.M)
    assert '"/src${EXTRAS:+[$EXTRAS]}"' in dockerfile
    assert re.search(r'"gpu": GPU_REQUIREMENTS', read("setup.py"))
    # The trainer through the virtualenv's own console command: no `python` on the PATH
    # needed (Debian's base images have only python3).
    assert re.search(r'^ENTRYPOINT \["/opt/cifar10-estimator/bin/cifar10-train"\]$',
                     dockerfile, re.M)
    assert '"cifar10-train=cifar10_estimator.main:console_main"' in read("setup.py")
    assert re.search(r'^VOLUME \["/data", "/job", "/cuda-cache"\]$', dockerfile, re.M)


def dockerfile_environment():
    """{name: value} of the Dockerfile's ENV lines (continued over backslashes)."""
    text = re.sub(r"\\\n\s*", " ", read("Dockerfile"))
    pairs = [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("ENV ")]
    return dict(re.findall(r"(\w+)=(\S+)", " ".join(pairs)))


def test_the_image_shows_the_nvidia_runtime_every_gpu_and_keeps_compiled_kernels_on_a_volume():
    environment = dockerfile_environment()
    assert environment["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert environment["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # The driver's kernel cache: on the volume, and 4 GiB (CUDA's largest; TensorFlow's
    # kernels compiled from PTX outgrow the default 256 MiB).
    assert environment["CUDA_CACHE_PATH"] == "/cuda-cache"
    assert int(environment["CUDA_CACHE_MAXSIZE"]) == 4 * 2 ** 30


def test_the_build_context_holds_what_setup_py_reads_and_no_more():
    lines = [line for line in read(".dockerignore").splitlines() if not line.startswith("#")]
    assert lines[0] == "*"  # nothing but what is named after it
    kept = [line[1:] for line in lines if line.startswith("!")]
    setup_py = read("setup.py")
    for name in ("README.md", "requirements.txt"):
        assert name in setup_py and name in kept
    assert kept == ["setup.py", "requirements.txt", "README.md", "cifar10_estimator"]
    # The check of the CUDA libraries that `scripts/container.sh cuda` runs in the image: a
    # console command of the package, in the virtualenv's bin/ with the others.
    assert ('"cifar10-cuda-libraries=cifar10_estimator.machine.cuda_libraries:console_main"'
            in setup_py)
    assert "--entrypoint cifar10-cuda-libraries" in read("scripts/container.sh")


def engine():
    return os.environ.get("CONTAINER_ENGINE") or shutil.which("podman") or shutil.which("docker")


@pytest.mark.slow
# A hang guard (cli_helpers) on the image's build (minutes, and the package index's
# downloads) and its runs: many times what it takes.
@pytest.mark.timeout(3000)
@pytest.mark.skipif(not (engine() and os.environ.get("CIFAR10_CONTAINER_TEST") == "1"),
                    reason="builds the image (minutes, about 2 GB, the package index) and "
                    "runs it: set CIFAR10_CONTAINER_TEST=1 where Docker or Podman runs "
                    "(and CONTAINER_* as scripts/container.sh says)")
def test_the_image_builds_trains_stops_with_its_step_saved_and_resumes():
    result = subprocess.run(["bash", CONTAINER_SH], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True, timeout=3000)
    assert result.returncode == 0, result.stdout[-5000:]
    assert re.search(r"^stopped in [0-9.]+ s, exit status 143$", result.stdout, re.M)
    assert re.search(r"^resumed from step \d+ and finished at step 50 in ", result.stdout, re.M)


def run_container_sh(command):
    return subprocess.run(["bash", CONTAINER_SH, command], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=3000)


@pytest.mark.slow
@pytest.mark.timeout(3000)
@pytest.mark.skipif(not (engine() and os.environ.get("CIFAR10_CONTAINER_TEST") == "1"
                         and "gpu" in os.environ.get("CONTAINER_EXTRAS", "")),
                    reason="builds the GPU image (minutes, about 5 GB, 1.9 GB of CUDA wheels "
                    "from the package index): set CIFAR10_CONTAINER_TEST=1 CONTAINER_EXTRAS=gpu "
                    "where Docker or Podman runs")
def test_the_gpu_image_opens_every_cuda_library_tensorflow_opens_but_the_drivers():
    built = run_container_sh("build")
    assert built.returncode == 0, built.stdout[-5000:]
    checked = run_container_sh("cuda")
    assert checked.returncode == 0, checked.stdout
    lines = cuda_library_lines(checked.stdout)
    for name in CUDA_LIBRARY_NAMES:  # its file in its wheel's directory, at its version
        assert re.match(r"%s +lib%s\.so\.\d+ +\d+\.\d+(\.\d+)? +nvidia-[\w-]+==[\d.]+ +"
                        r"/\S+/site-packages/nvidia/\w+/lib/lib%s\.so\.\d+$" % (name, name, name),
                        lines[name]), lines[name]
    assert "PROBLEM" not in checked.stdout
    # Without a GPU the driver's library alone is missing; given one (CONTAINER_RUN_OPTIONS
    # --gpus all, or --device nvidia.com/gpu=all), none is.
    missing = [name for name, line in lines.items() if " missing: " in line]
    assert missing in (["cuda"], []), checked.stdout
