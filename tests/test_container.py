"""The container image: what the Containerfile promises, and (where asked) its build and a
training in it, stopped and resumed, by scripts/container.sh with Docker or Podman."""

import os
import re
import shutil
import subprocess

import pytest

from cli_helpers import REPO_ROOT

CONTAINER_SH = os.path.join(REPO_ROOT, "scripts", "container.sh")


def read(path):
    with open(os.path.join(REPO_ROOT, path)) as stream:
        return stream.read()


def test_the_containerfile_takes_a_base_and_the_gpu_flavour_and_runs_the_trainer():
    containerfile = read("Containerfile")
    assert re.search(r"^ARG BASE=python:3\.11-slim$", containerfile, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", containerfile, re.M)
    assert re.search(r"^ARG EXTRAS=$", containerfile, re.M)
    assert '"/src${EXTRAS:+[$EXTRAS]}"' in containerfile
    assert re.search(r'"gpu": GPU_REQUIREMENTS', read("setup.py"))
    # The trainer through the virtualenv's own console command: no `python` on the PATH
    # needed (Debian's base images have only python3).
    assert re.search(r'^ENTRYPOINT \["/opt/cifar10-estimator/bin/cifar10-train"\]$',
                     containerfile, re.M)
    assert '"cifar10-train=cifar10_estimator.main:console_main"' in read("setup.py")
    assert re.search(r'^VOLUME \["/data", "/job"\]$', containerfile, re.M)


def test_the_build_context_holds_what_setup_py_reads_and_leaves_the_rest_out():
    kept = [line[1:] for line in read(".dockerignore").splitlines() if line.startswith("!")]
    assert read(".dockerignore").splitlines()[1] == "*"  # after the comment: nothing else
    setup_py = read("setup.py")
    for name in ("README.md", "requirements.txt"):
        assert name in setup_py and name in kept
    assert kept == ["setup.py", "requirements.txt", "README.md", "cifar10_estimator"]


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
