"""The first command a GPU user runs: what TensorFlow sees and a few training steps on one
GPU and on all, as a report to paste into a bug.

    python -m cifar10_estimator.machine.gpu_check [--num-layers 44] [--precision fp32]

It lists the GPUs TensorFlow sees (name, compute capability, how TensorFlow's kernels run
there), the CUDA and cuDNN it was built for and the cuDNN it would load (cuda_libraries),
then trains the trainer's own multi-tower model_fn on synthetic batches, a fixed batch per
tower, on GPU 0 and on all the visible GPUs: examples/sec in all and per GPU, their ratio,
each GPU's peak memory, where the ops were placed and which tower ops fell back to the CPU.
Without a GPU it does the same on logical CPU devices (the trainer's --num-cpu-towers) and
says so: those figures show the multi-tower path works, not how fast a GPU is.
"""

import collections
import dataclasses
import platform
import re
import sys
import time
import typing

import cifar10_estimator
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.cli.command import invoked_program, run_command
from cifar10_estimator.cli.markdown import markdown_table
from cifar10_estimator.cli.options import option, options_parser, parse, positive_int
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.machine import cuda_libraries
from cifar10_estimator.settings import precision


# Timed steps on GPUs; without a GPU, a batch and a number of timed steps that make the
# run take seconds (on GPUs the batch is the trainer's).
GPU_STEPS = 50
CPU_BATCH_SIZE_PER_TOWER = 16
CPU_STEPS = 5


@dataclasses.dataclass(frozen=True)
class GpuCheckOptions:
    """The command line: the model trained and how long it is timed."""

    num_layers: int = option(
        job_hparams.DEFAULTS.num_layers, "ResNet depth, 6n+2 (default %d, the trainer's)."
                                         % job_hparams.DEFAULTS.num_layers,
        type=job_hparams.resnet_depth, metavar="L")
    batch_size_per_tower: typing.Optional[int] = option(
        None, "Synthetic examples a tower trains on each step (default %d, the trainer's "
              "batch, on GPUs; %d on logical CPU devices)."
              % (job_hparams.DEFAULTS.train_batch_size, CPU_BATCH_SIZE_PER_TOWER),
        type=positive_int)
    precision: str = option("fp32", "What training computes in (the trainer's "
                                        "--precision).", choices=precision.PRECISIONS)
    warmup_steps: int = option(
        10, "Steps before the timed ones (graph optimisation, cuDNN's choice of "
            "algorithms and any kernel compiled from PTX fall in them; the first also "
            "says where each op ran).", type=positive_int)
    steps: typing.Optional[int] = option(
        None, "Timed steps (default %d on GPUs, %d on logical CPU devices)."
              % (GPU_STEPS, CPU_STEPS), type=positive_int)
    num_cpu_towers: int = option(
        2, "Without a GPU: the logical CPU devices it trains on instead.",
        type=positive_int, metavar="K")


# A PTX-compiled GPU: what TensorFlow 2.15 warns at start-up ("CUDA kernels will be
# jit-compiled from PTX, which could take 30 minutes or longer").
PTX_NOTE = (
    "TensorFlow %s ships machine code for %s and PTX for %s only: on %s the driver "
    "compiles TensorFlow's kernels from PTX at the first start, which TensorFlow warns "
    "can take 30 minutes or longer (its warm-up steps take it here, not the timed ones). "
    "They are cached in CUDA_CACHE_PATH (default ~/.nv/ComputeCache) up to "
    "CUDA_CACHE_MAXSIZE bytes: set it to 4294967296 so that they fit, else a later start "
    "compiles them again.")


# Where the loaded NVIDIA driver says its version: "NVRM version: NVIDIA UNIX x86_64 Kernel
# Module  535.104.05  Sat Aug 19 ..." (or "... Open Kernel Module for x86_64  535.104.05 ...").
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
DRIVER_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU as TensorFlow describes it (tf.config.experimental.get_device_details)."""

    name: str
    compute_capability: tuple


@dataclasses.dataclass(frozen=True)
class Machine:
    """What TensorFlow sees: its version and build info (tf.sysconfig.get_build_info()),
    its GPUs, the cuDNN it was built for and the one it would load (cuda_libraries), and
    whether float32 matrix products and convolutions run in TF32, and the version of the
    NVIDIA driver loaded (None: none is)."""

    tensorflow_version: str
    build_info: dict
    gpus: list
    cudnn_built_for: typing.Optional[tuple] = None
    cudnn: typing.Optional[cuda_libraries.Cudnn] = None
    tf32: bool = False
    driver_version: typing.Optional[str] = None


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """What a few timed steps on `devices` (one tower each) gave.

    Attributes:
      devices: the towers' devices, e.g. ('/gpu:0', '/gpu:1').
      examples_per_sec: of all the towers together, over the timed steps.
      ops_per_device: {device TensorFlow placed ops on: how many}.
      fallen_back: {op type: [names]} of the tower ops asked for on a GPU and placed on
        the CPU.
      peak_memory_bytes: {GPU ('GPU:0'): the peak its allocator held}; empty on the CPU.
    """

    devices: tuple
    examples_per_sec: float
    ops_per_device: dict
    fallen_back: dict
    peak_memory_bytes: dict

    @property
    def examples_per_sec_per_device(self):
        return self.examples_per_sec / len(self.devices)


def capability_of(arch):
    """(major, minor) of a build's architecture: 'sm_75' -> (7, 5), 'compute_80' -> (8, 0)."""
    digits = arch.split("_")[1]
    return int(digits[:-1]), int(digits[-1])


def kernel_source(capability, archs):
    """How TensorFlow's kernels run on a GPU of compute capability `capability`, given the
    architectures it was built for (build info's cuda_compute_capabilities).

    Machine code for sm_XY runs on X.Z for Z >= Y; else the driver compiles the newest
    PTX (compute_XY) at or below the GPU's capability.

    Returns:
      (text, whether the kernels are compiled from PTX at start-up).
    """
    machine_code = [arch for arch in archs if arch.startswith("sm_")
                    and capability_of(arch)[0] == capability[0]
                    and capability_of(arch) <= tuple(capability)]
    if machine_code:
        return "machine code (%s)" % max(machine_code, key=capability_of), False
    ptx = [arch for arch in archs if arch.startswith("compute_")
           and capability_of(arch) <= tuple(capability)]
    if ptx:
        return "compiled from PTX (%s) at the first start" % max(ptx, key=capability_of), True
    return "none: TensorFlow was built for no architecture this GPU runs", False


def ptx_note(machine):
    """PTX_NOTE for the GPUs of `machine` that compile TensorFlow's kernels from PTX, or
    None where none does."""
    archs = machine.build_info.get("cuda_compute_capabilities", [])
    compiling = ["GPU %d (compute capability %d.%d)" % ((index,) + tuple(gpu.compute_capability))
                 for index, gpu in enumerate(machine.gpus)
                 if kernel_source(gpu.compute_capability, archs)[1]]
    if not compiling:
        return None
    return PTX_NOTE % (machine.tensorflow_version,
                       ", ".join(arch for arch in archs if arch.startswith("sm_")),
                       ", ".join(arch for arch in archs if arch.startswith("compute_")),
                       ", ".join(compiling))


def driver_version(path=DRIVER_VERSION_FILE):
    """The version of the NVIDIA kernel driver loaded ("535.104.05"), or None."""
    try:
        with open(path) as stream:
            match = DRIVER_VERSION.search(stream.read())
    except OSError:
        return None
    return match.group(1) if match else None


def machine_lines(machine, num_cpu_towers):
    """The report's lines on what TensorFlow sees: its build, the cuDNN it would load,
    TF32, and its GPUs as a table (or that it trains on logical CPU devices instead)."""
    info = machine.build_info
    if not info.get("is_cuda_build"):
        built = "built without CUDA"
    else:
        built = "built for CUDA %s and cuDNN %s (kernels for %s)" % (
            info.get("cuda_version"), cuda_libraries.version_text(machine.cudnn_built_for),
            ", ".join(info.get("cuda_compute_capabilities", [])))
    lines = ["cifar10_estimator %s, Python %s, TensorFlow %s, %s." % (
        cifar10_estimator.__version__, platform.python_version(), machine.tensorflow_version,
        built)]
    lines.append("NVIDIA driver: %s." % (machine.driver_version or "none loaded (%s absent)"
                                         % DRIVER_VERSION_FILE))
    if machine.cudnn_built_for:
        lines.append("cuDNN it would load: %s." % (
            machine.cudnn.describe() if machine.cudnn else "none found (libcudnn.so.%d on "
            "neither LD_LIBRARY_PATH, TensorFlow's nvidia-cudnn wheel nor the system's "
            "library path)" % machine.cudnn_built_for[0]))
    lines.append("TF32 (float32 products and convolutions on Ampere and later): %s." % (
        "on" if machine.tf32 else "off"))
    if not machine.gpus:
        lines += ["", "GPUs TensorFlow sees: none. This check trains on %d logical CPU "
                      "devices instead (--num-cpu-towers): its figures show the multi-tower "
                      "path works, not how fast a GPU is." % num_cpu_towers]
        return lines
    archs = info.get("cuda_compute_capabilities", [])
    lines += ["", markdown_table(
        ["GPU", "name", "compute capability", "TensorFlow's kernels"],
        [["GPU:%d" % index, gpu.name, "%d.%d" % tuple(gpu.compute_capability),
          kernel_source(gpu.compute_capability, archs)[0]]
         for index, gpu in enumerate(machine.gpus)])]
    note = ptx_note(machine)
    return lines + (["", note] if note else [])


def fallen_back_ops(requested, placed):
    """The tower ops asked for on a GPU that TensorFlow placed on a CPU.

    Args:
      requested: {op name: (op type, the device the graph asks for)}.
      placed: {op name: the device TensorFlow placed it on}; ops the graph optimiser
        made or removed are left out.

    Returns:
      {op type: [op names]}, in name order.
    """
    fallen = collections.defaultdict(list)
    for name in sorted(set(requested) & set(placed)):
        op_type, device = requested[name]
        if _device_type(device) == "GPU" and _device_type(placed[name]) == "CPU":
            fallen[op_type].append(name)
    return dict(fallen)


def _device_type(device):
    """'GPU' of '/gpu:0' or '/job:localhost/replica:0/task:0/device:GPU:0'; '' of ''."""
    match = re.search(r"(?:device:)?([A-Za-z]+):\d+$", device or "")
    return match.group(1).upper() if match else ""


def short_device(device):
    """'GPU:0' of '/job:localhost/replica:0/task:0/device:GPU:0' or of '/gpu:0'."""
    match = re.search(r"([A-Za-z]+):(\d+)$", device)
    return "%s:%s" % (match.group(1).upper(), match.group(2)) if match else device


def gigabytes(num_bytes):
    return "%.2f GB" % (num_bytes / 1e9)


def runs_lines(runs, on_gpus):
    """The report's lines on the training runs: a table, the ratio of the last run to the
    first, and the ops that fell back to the CPU."""
    rows = []
    for run in runs:
        memory = (", ".join("%s %s" % (gpu, gigabytes(peak))
                            for gpu, peak in sorted(run.peak_memory_bytes.items()))
                  if on_gpus else "not measured on CPU devices")
        rows.append(["%d (%s)" % (len(run.devices), ", ".join(run.devices)),
                     "%.1f" % run.examples_per_sec, "%.1f" % run.examples_per_sec_per_device,
                     ", ".join("%s %d" % (short_device(device), count)
                               for device, count in sorted(run.ops_per_device.items())),
                     memory])
    kind = "GPU" if on_gpus else "logical CPU device"
    lines = [markdown_table(["%ss" % kind, "examples/sec", "examples/sec per %s" % kind,
                             "ops placed", "peak memory"], rows)]
    if len(runs) > 1:
        many, one = runs[-1], runs[0]
        lines += ["", "%d %ss / 1 %s: %.2fx (%dx would be perfect%s)." % (
            len(many.devices), kind, kind, many.examples_per_sec / one.examples_per_sec,
            len(many.devices), "" if on_gpus else "; logical CPU devices share the cores")]
    return lines + [""] + fallen_back_lines(runs, on_gpus)


def fallen_back_lines(runs, on_gpus):
    """The tower ops of `runs` that fell back to the CPU: each type, how many, one name."""
    if not on_gpus:
        return ["Tower ops that fell back to the CPU: none can here (the towers are on CPUs)."]
    fallen = collections.defaultdict(set)
    for run in runs:
        for op_type, names in run.fallen_back.items():
            fallen[op_type].update(names)
    if not fallen:
        return ["Tower ops that fell back to the CPU: none."]
    return ["Tower ops that fell back to the CPU (a copy each way a step):"] + [
        "- %s x%d, e.g. %s" % (op_type, len(names), min(names))
        for op_type, names in sorted(fallen.items())]


def this_machine():
    """The Machine TensorFlow sees here; its GPUs set to take memory as they need it
    (so that each GPU's peak is what training took), before anything starts them."""
    import tensorflow as tf  # lazy: keeps --help and flag errors fast
    physical = tf.config.list_physical_devices("GPU")
    gpus = []
    for device in physical:
        tf.config.experimental.set_memory_growth(device, True)
        details = tf.config.experimental.get_device_details(device)
        gpus.append(Gpu(details.get("device_name", device.name),
                        tuple(details.get("compute_capability", (0, 0)))))
    # Starts them, so that the sessions after it find them started as set, and the
    # memory statistics read them.
    tf.config.list_logical_devices("GPU")
    build = cuda_libraries.tensorflow_build()
    built_for, cudnn = cuda_libraries.tensorflow_cudnn(build)
    return Machine(build.version, build.build_info, gpus, built_for, cudnn,
                   tf.config.experimental.tensor_float_32_execution_enabled(), driver_version())


def session_config(num_gpus, num_cpu_towers):
    """The trainer's session options for `num_gpus` GPUs, taken as main.make_run_config
    takes them (gpu_devices.take_gpus), or for `num_cpu_towers` logical CPU devices where
    num_gpus is 0."""
    import tensorflow as tf  # lazy: keeps --help and flag errors fast
    from cifar10_estimator.machine import gpu_devices
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    gpu_devices.take_gpus(config, num_gpus)
    if num_gpus == 0:
        config.device_count["CPU"] = num_cpu_towers
    return config


def placements(run_metadata):
    """{op name: device} of the partition graphs a step's RunMetadata holds."""
    return {node.name: node.device for graph in run_metadata.partition_graphs
            for node in graph.node}


def train(layout, hparams, warmup_steps, steps, num_visible_gpus=0):
    """A TrainingRun of the trainer's model_fn on `layout`'s towers (model_fn.TowerLayout),
    on one synthetic batch of hparams.train_batch_size split over them; its session sees
    the check's num_visible_gpus GPUs, the same in every run of the process."""
    import tensorflow as tf  # lazy: keeps --help and flag errors fast
    from cifar10_estimator import input_fn, model_fn
    num_gpus = sum(_device_type(device) == "GPU" for device in layout.devices)
    gpus = ["GPU:%d" % index for index in range(num_gpus)]
    with tf.Graph().as_default() as graph:
        # The Estimator makes it before model_fn; the schedule reads it.
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = input_fn.make_synthetic_input_fn(
            layout.num_towers, hparams.train_batch_size)()
        train_op = model_fn.make_model_fn(layout, hparams)(
            features, labels, tf.estimator.ModeKeys.TRAIN, None).train_op
        requested = {op.name: (op.type, op.device) for op in graph.get_operations()}
        with tf.compat.v1.Session(
                config=session_config(num_visible_gpus, layout.num_towers)) as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            for gpu in gpus:
                tf.config.experimental.reset_memory_stats(gpu)
            # The first step says where each op ran; it is one of the warm-up steps.
            run_metadata = tf.compat.v1.RunMetadata()
            session.run(train_op, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                        run_metadata=run_metadata)
            for _ in range(warmup_steps - 1):
                session.run(train_op)
            start = time.perf_counter()
            for _ in range(steps):
                session.run(train_op)
            secs = time.perf_counter() - start
    placed = placements(run_metadata)
    return TrainingRun(
        layout.devices, hparams.train_batch_size * steps / secs,
        dict(collections.Counter(placed.values())), fallen_back_ops(requested, placed),
        {gpu: tf.config.experimental.get_memory_info(gpu)["peak"] for gpu in gpus})


def device_counts(num_devices):
    """The runs' numbers of towers: one, then all (just one where there is one)."""
    return [1] if num_devices == 1 else [1, num_devices]


def build_parser():
    return options_parser(
        GpuCheckOptions,
        description="What TensorFlow sees (GPUs, CUDA, cuDNN) and a few synthetic training "
                    "steps of the trainer's model on one GPU and on all: a report to paste "
                    "into a bug. Without a GPU it trains on logical CPU devices.")


def main(argv):
    options = parse(build_parser(), GpuCheckOptions, argv)
    quiet_tensorflow_logs("1", "ERROR")
    from cifar10_estimator import model_fn  # lazy: loads TensorFlow, once its logs are quiet
    from cifar10_estimator.training import mixed_precision
    # As the trainer does: fp32 is float32 throughout, tf32 asks for TF32 (the report's
    # TF32 line reads the switch after this).
    mixed_precision.apply_tensor_float_32(precision.policy(options.precision))
    machine = this_machine()
    on_gpus = bool(machine.gpus)
    batch = options.batch_size_per_tower or (
        job_hparams.DEFAULTS.train_batch_size if on_gpus else CPU_BATCH_SIZE_PER_TOWER)
    steps = options.steps or (GPU_STEPS if on_gpus else CPU_STEPS)
    layouts = [model_fn.TowerLayout.for_devices(count if on_gpus else 0, count)
               for count in device_counts(len(machine.gpus) or options.num_cpu_towers)]
    print("# GPU check of cifar10_estimator\n\n    %s\n" % " ".join(
        [invoked_program()] + list(argv)))
    print("\n".join(machine_lines(machine, options.num_cpu_towers)))
    print("\nTraining: the trainer's model_fn, ResNet-%d, %s, %s, variables on the CPU, "
          "synthetic batches of %d per tower; steps: %d warm-up, then %d timed.\n"
          % (options.num_layers, options.precision, layouts[0].data_format, batch,
             options.warmup_steps, steps), flush=True)
    runs = [train(layout, job_hparams.HParams(
        num_layers=options.num_layers, precision=options.precision,
        train_batch_size=batch * layout.num_towers), options.warmup_steps, steps,
        len(machine.gpus))
        for layout in layouts]
    print("\n".join(runs_lines(runs, on_gpus)), flush=True)


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
