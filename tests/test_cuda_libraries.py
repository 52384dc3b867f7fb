"""The CUDA libraries TensorFlow opens and their versions: the cuDNN a GPU run would load,
checked before training against the one TensorFlow was built for, with stand-in
libcudnn.so.8 files (compiled with gcc) whose cudnnGetVersion says an older or a matching
version, found where TensorFlow's dlopen finds them; and the check of every library (the
GPU image's), on this machine, which has none of them."""

import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest
import tensorflow as tf

import stand_ins
from cifar10_estimator.machine import cuda_libraries, hardware
from cifar10_estimator.machine.cuda_libraries import Cudnn
from cli_helpers import assert_one_line_error, run_module

TENSORFLOW_BUILD = {"is_cuda_build": True, "cuda_version": "12.2", "cudnn_version": "8"}
AND_CUDA = ["nvidia-cublas-cu12 (==12.2.5.6) ; extra == 'and-cuda'",
            "nvidia-cudnn-cu12 (==8.9.4.25) ; extra == 'and-cuda'"]


@pytest.fixture
def old_cudnn(tmp_path):
    return stand_ins.cudnn_dir(tmp_path / "old-cudnn", 8100)


@pytest.fixture
def matching_cudnn(tmp_path):
    return stand_ins.cudnn_dir(tmp_path / "cudnn-8.9.6", 8906)


@pytest.mark.parametrize("number, version", [
    (8100, (8, 1, 0)), (8906, (8, 9, 6)), (8904, (8, 9, 4)), (90100, (9, 1, 0)),  # cuDNN
    (21605, (2, 16, 5)), (2708, (2, 7, 8)),  # NCCL 2.16.5 (x 10000 from 2.9 on), 2.7.8
    (120205, (12, 2, 5))])  # cuBLASLt
def test_version_numbers_read_as_major_minor_patch(number, version):
    assert cuda_libraries.decoded_version_number(number) == version


def test_tensorflow_is_built_for_the_cudnn_its_cuda_extra_pins():
    pins = cuda_libraries.and_cuda_pins(AND_CUDA + ["numpy (>=1.23.5,<2.0.0)"])
    assert pins == {"nvidia-cublas-cu12": "12.2.5.6", "nvidia-cudnn-cu12": "8.9.4.25"}
    assert cuda_libraries.built_for_cudnn(TENSORFLOW_BUILD, pins) == (8, 9)
    assert cuda_libraries.built_for_cudnn(
        TENSORFLOW_BUILD, cuda_libraries.and_cuda_pins(AND_CUDA[:1])) == (8,)
    assert cuda_libraries.built_for_cudnn({"is_cuda_build": False}, pins) is None
    # This machine's TensorFlow 2.15 wheel: cuDNN "8" in its build info, 8.9.4 pinned, and
    # a pin for the wheel of each library TensorFlow opens.
    build = cuda_libraries.tensorflow_build()
    assert build.version == tf.version.VERSION
    assert cuda_libraries.built_for_cudnn(build.build_info, build.pins) == (8, 9)
    assert {library.wheel for library in cuda_libraries.LIBRARIES} <= set(build.pins)


@pytest.mark.parametrize("version, served", [
    ((8, 9, 4), True), ((8, 9, 0), True), ((8, 9, 7), True), ((8, 10, 0), True),
    ((8, 8, 1), False), ((8, 1, 0), False), ((9, 1, 0), False), ((7, 6, 5), False)])
def test_tensorflow_runs_with_the_same_major_and_an_equal_or_higher_minor(version, served):
    assert cuda_libraries.serves((8, 9), version) is served
    assert cuda_libraries.serves((8,), version) is (version[0] == 8)


def test_a_version_leads_a_longer_one_by_whole_numbers():
    assert cuda_libraries.leads((12, 2), (12, 2, 140))
    assert cuda_libraries.leads((2, 16, 5), (2, 16, 5))
    assert not cuda_libraries.leads((12, 2), (12, 20, 1))
    assert not cuda_libraries.leads((12, 2, 5), (12, 2))


def test_the_check_of_every_library_holds_cudnn_to_the_trainers_rule():
    expects = {"cudnn": cuda_libraries.Expected((8, 9), "its build", cuda_libraries.serves)}
    pins = cuda_libraries.and_cuda_pins(AND_CUDA)

    def problems(version, installed):
        return cuda_libraries.version_problems(cuda_libraries.CUDNN, version, installed,
                                               pins, expects)
    assert problems((8, 9, 4), "8.9.4.25") == []
    assert problems((8, 6, 0), "8.9.4.25") == [
        "version 8.6.0, but its wheel is nvidia-cudnn-cu12 8.9.4.25",
        "TensorFlow was built with cudnn 8.9 (its build)"]
    assert problems((8, 9, 7), "8.9.7.29") == [
        "nvidia-cudnn-cu12 8.9.7.29 installed, TensorFlow pins 8.9.4.25"]
    assert problems((8, 9, 4), None) == [
        "nvidia-cudnn-cu12 not installed, TensorFlow pins 8.9.4.25"]
    assert problems(None, "8.9.4.25") == ["it gives no version"]


def test_the_wheel_dirs_are_those_tensorflows_runpath_names_for_cudnn():
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    library = os.path.join(tf.sysconfig.get_lib(), "libtensorflow_framework.so.2")
    dynamic = subprocess.run(["readelf", "-d", library], stdout=subprocess.PIPE,
                             universal_newlines=True, check=True, timeout=60).stdout
    runpath = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", dynamic).group(1)
    cudnn_entries = [entry.replace("$ORIGIN/", "", 1) for entry in runpath.split(":")
                     if "cudnn" in entry]
    assert tuple(cudnn_entries) == cuda_libraries.WHEEL_DIRS_FROM_TENSORFLOW
    # RUNPATH, not RPATH: the loader searches LD_LIBRARY_PATH before it.
    assert "(RPATH)" not in dynamic


def test_ld_library_path_comes_before_the_wheel_as_for_tensorflows_dlopen(
        old_cudnn, matching_cudnn):
    found = cuda_libraries.loadable_cudnn("libcudnn.so.8", [str(matching_cudnn)],
                                          str(old_cudnn))
    assert found == Cudnn((8, 1, 0), str(old_cudnn / "libcudnn.so.8"),
                          cuda_libraries.ON_LD_LIBRARY_PATH)
    found = cuda_libraries.loadable_cudnn("libcudnn.so.8", [str(matching_cudnn)], "")
    assert found == Cudnn((8, 9, 6), str(matching_cudnn / "libcudnn.so.8"),
                          cuda_libraries.IN_THE_WHEEL)


def test_no_cudnn_to_load_is_left_to_tensorflows_own_gpu_check(tmp_path):
    if cuda_libraries.loadable_cudnn("libcudnn.so.8", [], "") is not None:
        pytest.skip("this machine has a cuDNN 8 of its own")
    assert cuda_libraries.loadable_cudnn("libcudnn.so.8", [str(tmp_path)], "") is None


def test_the_fix_depends_on_where_the_old_cudnn_was_found():
    on_path = Cudnn((8, 1, 0), "/opt/cudnn-8.1/lib/libcudnn.so.8",
                    cuda_libraries.ON_LD_LIBRARY_PATH)
    assert ("take /opt/cudnn-8.1/lib off LD_LIBRARY_PATH, or put a cuDNN 8.9 or a later 8.x "
            "before it there") in cuda_libraries.mismatch_text((8, 9), on_path)
    system = Cudnn((8, 6, 0), "/usr/lib/x86_64-linux-gnu/libcudnn.so.8",
                   cuda_libraries.ON_THE_SYSTEM)
    text = cuda_libraries.mismatch_text((8, 9), system)
    assert text.startswith("the cuDNN this process would load is 8.6.0 "
                           "(/usr/lib/x86_64-linux-gnu/libcudnn.so.8, the system's), but "
                           "TensorFlow was built for cuDNN 8.9")
    assert "pip install -e '.[gpu]' installs the cuDNN 8.9 wheel" in text


def trainer_on_one_gpu(tmp_path, cudnn_dir):
    """The trainer asked for one GPU with `cudnn_dir` first on LD_LIBRARY_PATH."""
    return run_module("cifar10_estimator.main",
                      ["--use-synthetic-data", "--job-dir", tmp_path / "job", "--num-gpus", "1"],
                      timeout=300, env={"LD_LIBRARY_PATH": str(cudnn_dir)})


def test_an_older_cudnn_first_on_ld_library_path_is_one_line_before_training(
        tmp_path, old_cudnn):
    result = trainer_on_one_gpu(tmp_path, old_cudnn)
    assert_one_line_error(
        result, 1, "error: the cuDNN this process would load is 8.1.0 (%s, first on "
        "LD_LIBRARY_PATH), but TensorFlow was built for cuDNN 8.9 and would fail at its "
        "first convolution" % (old_cudnn / "libcudnn.so.8"),
        "take %s off LD_LIBRARY_PATH" % old_cudnn, "--num-gpus 0 trains on the CPU")
    assert not (tmp_path / "job").exists()


def test_a_matching_cudnn_passes_the_check_silently(tmp_path, matching_cudnn):
    if hardware.num_gpus_visible():
        pytest.skip("TensorFlow sees GPUs here: it would train with the stand-in cuDNN")
    result = trainer_on_one_gpu(tmp_path, matching_cudnn)
    # The check after it: this machine has no GPU.
    line = assert_one_line_error(result, 2, "--num-gpus 1 asked, but 0 GPUs are visible")
    assert "cuDNN" not in line


# What TensorFlow 2.15's CUDA build opens (or, cuRAND, its and-cuda extra brings), by the
# names the check of every library prints them under.
CUDA_LIBRARY_NAMES = ("cudart", "cublas", "cublasLt", "cufft", "curand", "cusolver", "cusparse",
                      "cudnn", "nccl")


def cuda_library_lines(output):
    """{library name: its line} of the check of every library's output."""
    return {line.split()[0]: line for line in output.splitlines()
            if line.split() and line.split()[0] in CUDA_LIBRARY_NAMES + ("cuda",)}


def gpu_wheels_installed():
    try:
        importlib.metadata.version("nvidia-cuda-runtime-cu12")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(gpu_wheels_installed(), reason="TensorFlow's CUDA wheels are installed "
                    "here: the GPU image's test (CIFAR10_CONTAINER_TEST=1 CONTAINER_EXTRAS=gpu, "
                    "tests/test_container.py) covers the check where they are")
def test_the_check_of_every_library_finds_none_without_the_gpu_wheels():
    # This machine's virtualenv has TensorFlow without NVIDIA's wheels: TensorFlow's own
    # loader, asked for each library, opens none.
    result = run_module("cifar10_estimator.machine.cuda_libraries", [], timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = cuda_library_lines(result.stdout)
    assert result.stdout.startswith("TensorFlow 2.15.")
    assert ", built with CUDA 12.2 and cuDNN 8.9 (" in result.stdout.splitlines()[0]
    assert sorted(lines) == sorted(CUDA_LIBRARY_NAMES + ("cuda",))
    for name in CUDA_LIBRARY_NAMES:
        assert re.match(r"%s +missing: TensorFlow's loader cannot open it, and nvidia-\S+-cu12 "
                        r"is not installed$" % name, lines[name])
    assert lines["cuda"].startswith("cuda      missing: libcuda.so.1, the NVIDIA driver's")
    assert result.stdout.splitlines()[-1].startswith("not every CUDA library TensorFlow opens")
