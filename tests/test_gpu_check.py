"""The GPU check a GPU user runs first: its report's GPU parts from stand-in descriptions of
GPUs (A100s, a T4), their runs and their placements, and the real command on this
machine, where it trains on logical CPU devices and says so."""

import pytest

from cifar10_estimator.machine import cuda_libraries, gpu_check
from cifar10_estimator.machine.gpu_check import Gpu, Machine, TrainingRun
from cli_helpers import assert_one_line_error, run_module

MODULE = "cifar10_estimator.machine.gpu_check"
# tf.sysconfig.get_build_info() of TensorFlow 2.15.1's Linux wheel, its CUDA part.
BUILD_INFO = {"is_cuda_build": True, "cuda_version": "12.2", "cudnn_version": "8",
              "cuda_compute_capabilities": ["sm_50", "sm_60", "sm_70", "sm_75", "compute_80"]}
A100 = Gpu("NVIDIA A100-SXM4-80GB", (8, 0))
T4 = Gpu("Tesla T4", (7, 5))


def machine_of(gpus, **fields):
    wheel = cuda_libraries.Cudnn((8, 9, 4), "/venv/site-packages/nvidia/cudnn/lib/libcudnn.so.8",
                                 cuda_libraries.IN_THE_WHEEL)
    return Machine("2.15.1", BUILD_INFO, list(gpus), (8, 9), wheel, True, "535.104.05",
                   **fields)


@pytest.mark.parametrize("capability, source, compiled", [
    ((7, 5), "machine code (sm_75)", False), ((6, 1), "machine code (sm_60)", False),
    ((7, 2), "machine code (sm_70)", False), ((5, 0), "machine code (sm_50)", False),
    ((8, 0), "compiled from PTX (compute_80) at the first start", True),
    ((8, 6), "compiled from PTX (compute_80) at the first start", True),
    ((8, 9), "compiled from PTX (compute_80) at the first start", True),
    ((9, 0), "compiled from PTX (compute_80) at the first start", True),
    ((3, 7), "none: TensorFlow was built for no architecture this GPU runs", False)])
def test_how_tensorflows_kernels_run_on_each_compute_capability(capability, source, compiled):
    assert gpu_check.kernel_source(capability, BUILD_INFO["cuda_compute_capabilities"]) == (
        source, compiled)


def test_ampere_and_later_are_told_their_kernels_compile_from_ptx_at_the_first_start():
    lines = gpu_check.machine_lines(machine_of([A100, A100]), num_cpu_towers=2)
    report = "\n".join(lines)
    assert ("| GPU:1 | NVIDIA A100-SXM4-80GB | 8.0 | compiled from PTX (compute_80) at the "
            "first start |") in report
    assert ("TensorFlow 2.15.1 ships machine code for sm_50, sm_60, sm_70, sm_75 and PTX for "
            "compute_80 only: on GPU 0 (compute capability 8.0), GPU 1 (compute capability "
            "8.0) the driver compiles TensorFlow's kernels from PTX at the first start, which "
            "TensorFlow warns can take 30 minutes or longer") in report
    assert "CUDA_CACHE_MAXSIZE" in report
    assert "NVIDIA driver: 535.104.05." in report
    assert ("cuDNN it would load: 8.9.4 (/venv/site-packages/nvidia/cudnn/lib/libcudnn.so.8, "
            "TensorFlow's nvidia-cudnn wheel).") in report
    assert "logical CPU" not in report


def test_a_gpu_with_machine_code_gets_no_ptx_note():
    report = "\n".join(gpu_check.machine_lines(machine_of([T4]), num_cpu_towers=2))
    assert "| GPU:0 | Tesla T4 | 7.5 | machine code (sm_75) |" in report
    assert "PTX for" not in report
    assert gpu_check.ptx_note(machine_of([T4, A100])).count("GPU 1 (compute capability 8.0)") == 1


def test_ops_asked_for_on_a_gpu_and_placed_on_the_cpu_fell_back():
    gpu0 = "/job:localhost/replica:0/task:0/device:GPU:0"
    cpu0 = "/job:localhost/replica:0/task:0/device:CPU:0"
    requested = {"tower_0/resize/ResizeArea": ("ResizeArea", "/device:GPU:0"),
                 "tower_1/resize/ResizeArea": ("ResizeArea", "/gpu:1"),
                 "tower_0/conv2d/Conv2D": ("Conv2D", "/device:GPU:0"),
                 "tower_0/strided_slice": ("StridedSlice", "/device:GPU:0"),
                 "resnet/conv2d/kernel": ("VarHandleOp", "/device:CPU:0"),
                 "tower_0/removed_by_grappler": ("Identity", "/device:GPU:0")}
    placed = {"tower_0/resize/ResizeArea": cpu0, "tower_1/resize/ResizeArea": cpu0,
              "tower_0/conv2d/Conv2D": gpu0, "tower_0/strided_slice": gpu0,
              "resnet/conv2d/kernel": cpu0, "tower_0/conv2d/Conv2D/_send": gpu0}
    assert gpu_check.fallen_back_ops(requested, placed) == {
        "ResizeArea": ["tower_0/resize/ResizeArea", "tower_1/resize/ResizeArea"]}


def test_the_runs_table_gives_each_gpus_rate_and_memory_the_ratio_and_the_fallen_back_ops():
    one = TrainingRun(("/gpu:0",), 9000.0, {"/device:GPU:0": 900, "/device:CPU:0": 300}, {},
                      {"GPU:0": 1.25e9})
    two = TrainingRun(("/gpu:0", "/gpu:1"), 16200.0,
                      {"/device:GPU:0": 800, "/device:GPU:1": 700, "/device:CPU:0": 400},
                      {"ResizeArea": ["tower_0/ResizeArea", "tower_1/ResizeArea"]},
                      {"GPU:0": 1.3e9, "GPU:1": 1.2e9})
    lines = "\n".join(gpu_check.runs_lines([one, two], on_gpus=True)).splitlines()
    assert lines[0] == ("| GPUs | examples/sec | examples/sec per GPU | ops placed | "
                        "peak memory |")
    assert lines[2] == "| 1 (/gpu:0) | 9000.0 | 9000.0 | CPU:0 300, GPU:0 900 | GPU:0 1.25 GB |"
    assert lines[3] == ("| 2 (/gpu:0, /gpu:1) | 16200.0 | 8100.0 | CPU:0 400, GPU:0 800, "
                        "GPU:1 700 | GPU:0 1.30 GB, GPU:1 1.20 GB |")
    assert "2 GPUs / 1 GPU: 1.80x (2x would be perfect)." in lines
    assert lines[-2:] == ["Tower ops that fell back to the CPU (a copy each way a step):",
                          "- ResizeArea x2, e.g. tower_0/ResizeArea"]
    assert gpu_check.runs_lines([one], on_gpus=True)[-1] == (
        "Tower ops that fell back to the CPU: none.")


@pytest.mark.parametrize("text, version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC "
     "2023\nGCC version:  gcc version 12.2.0\n", "535.104.05"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  "
     "(dvs-builder@U16-I3-B03-4-3)\n", "550.54.14"),
    ("something else\n", None)])
def test_the_driver_version_is_read_from_what_the_loaded_driver_says(tmp_path, text, version):
    (tmp_path / "version").write_text(text)
    assert gpu_check.driver_version(str(tmp_path / "version")) == version
    assert gpu_check.driver_version(str(tmp_path / "absent")) is None


def test_the_check_trains_the_multi_tower_model_on_logical_cpu_devices_here():
    result = run_module(MODULE, ["--num-layers", "8", "--batch-size-per-tower", "2",
                                 "--warmup-steps", "1", "--steps", "2"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout
    assert report.startswith("# GPU check of cifar10_estimator\n\n    python -m %s --num-layers "
                             "8 --batch-size-per-tower 2 --warmup-steps 1 --steps 2\n" % MODULE)
    assert "TensorFlow 2.15" in report
    # fp32, as the trainer takes it: TF32 off before the first session.
    assert "TF32 (float32 products and convolutions on Ampere and later): off." in report
    assert "GPUs TensorFlow sees: none. This check trains on 2 logical CPU devices" in report
    assert ("Training: the trainer's model_fn, ResNet-8, fp32, channels_last, variables on the "
            "CPU, synthetic batches of 2 per tower; steps: 1 warm-up, then 2 timed.") in report
    rows = [line for line in report.splitlines() if line.startswith("| 1 (") or
            line.startswith("| 2 (")]
    assert rows[0].startswith("| 1 (/cpu:0) | ")
    assert rows[1].startswith("| 2 (/cpu:0, /cpu:1) | ")
    assert "CPU:1 " in rows[1] and "CPU:1 " not in rows[0]  # the second tower's ops
    assert "2 logical CPU devices / 1 logical CPU device: " in report
    assert "Tower ops that fell back to the CPU: none can here" in report


def test_a_depth_the_trainer_does_not_build_is_one_line():
    assert_one_line_error(run_module(MODULE, ["--num-layers", "9"]), 2,
                          "--num-layers: num_layers must be 6n+2")


def test_the_placements_of_a_step_show_a_gpu_op_without_a_gpu_kernel_on_the_cpu():
    import numpy as np
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        images = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 1])
        with tf.device("/gpu:0"):
            # ResizeArea has no GPU kernel in TensorFlow 2.15: it falls back on any machine.
            smaller = tf.image.resize(images, [4, 4], method="area")
        requested = {op.name: (op.type, op.device) for op in graph.get_operations()}
        metadata = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=gpu_check.session_config(1, 1)) as session:
            session.run(smaller, {images: np.ones([1, 8, 8, 1])}, run_metadata=metadata,
                        options=tf.compat.v1.RunOptions(output_partition_graphs=True))
    fallen = gpu_check.fallen_back_ops(requested, gpu_check.placements(metadata))
    assert fallen["ResizeArea"] == [smaller.op.name]
