"""What this machine has: its CPU (from /proc/cpuinfo), TensorFlow's oneDNN kernels, GPUs.

Probes only, no decisions: precision, the flag checks and the benchmarks read them.
/proc/cpuinfo and the NVIDIA driver's list are read without TensorFlow; the oneDNN and GPU
probes load it.
"""

import os
import re
import subprocess
import sys

CPUINFO_PATH = "/proc/cpuinfo"


def read_cpuinfo(path=CPUINFO_PATH):
    """List of dicts, one per logical CPU, of /proc/cpuinfo's `key : value` lines."""
    processors, current = [], {}
    try:
        with open(path) as stream:
            for line in stream:
                if not line.strip():
                    if current:
                        processors.append(current)
                    current = {}
                    continue
                key, _, value = line.partition(":")
                current[key.strip()] = value.strip()
    except OSError:
        return []
    if current:
        processors.append(current)
    return processors


def first_cpu(path=CPUINFO_PATH):
    """The first CPU's /proc/cpuinfo fields (empty where there is no cpuinfo)."""
    processors = read_cpuinfo(path)
    return processors[0] if processors else {}


def flags_of(processor):
    """A CPU's flags (a dict of read_cpuinfo's), as a set."""
    return set(processor.get("flags", "").split())


def cpu_flags(path=CPUINFO_PATH):
    """The first CPU's /proc/cpuinfo flags, as a set (empty where there is no cpuinfo)."""
    return flags_of(first_cpu(path))


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels, the only ones with NCHW convolution
    and pooling and with fast bfloat16. It does by default on some CPUs;
    TF_ENABLE_ONEDNN_OPTS=1/0 decides."""
    try:
        # lazy: keeps the trainer's flag errors fast
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a private API: fall back to the user's setting
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1"


def num_gpus_visible():
    """GPUs TensorFlow sees."""
    import tensorflow as tf  # lazy: keeps the trainer's flag errors fast
    return len(tf.config.list_physical_devices("GPU"))


def cudnn_wheel_version():
    """The version of the cuDNN wheel TensorFlow's `and-cuda` extra brings, or None."""
    from importlib import metadata
    try:
        return metadata.version("nvidia-cudnn-cu12")
    except metadata.PackageNotFoundError:
        return None


def gpu_compute_capabilities(num_gpus):
    """(major, minor) compute capability of each of the first num_gpus GPUs."""
    import tensorflow as tf  # lazy: keeps the trainer's flag errors fast
    gpus = tf.config.list_physical_devices("GPU")[:num_gpus]
    return [tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0))
            for gpu in gpus]


# A line of `nvidia-smi -L`: "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5e2f...)".
NVIDIA_SMI_GPU = re.compile(r"^GPU (\d+): (.*) \(UUID: ([^)]+)\)$")


def driver_gpus():
    """The GPUs the NVIDIA driver lists (`nvidia-smi -L`), as CUDA_VISIBLE_DEVICES leaves
    them to CUDA: "GPU i: name" each, in CUDA's order; none without a driver.

    CUDA_VISIBLE_DEVICES names GPUs by index or by (a prefix of) their UUID, and CUDA stops
    at the first entry that names none. scripts/venv.sh's driver_gpus reads it the same way
    (tests/test_gpus.py compares the two).
    """
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, universal_newlines=True,
                                 timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = [match.groups() for match in map(NVIDIA_SMI_GPU.match, listing.splitlines())
            if match]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen = []
        for entry in (entry.strip() for entry in visible.split(",")):
            named = [gpu for gpu in gpus if entry and entry in (gpu[0], gpu[2][:len(entry)])]
            if not named:
                break
            chosen.append(named[0])
        gpus = chosen
    return ["GPU %s: %s" % (index, name) for index, name, _ in gpus]


def visible_gpu_entries():
    """The CUDA_VISIBLE_DEVICES entries naming the GPUs this process may use, in CUDA's
    order, to give a child process some of them: this process's own entries, else the
    indices 0..M-1 of the M GPUs the driver lists (driver_gpus), or where no driver
    lists any (a container without nvidia-smi), of those TensorFlow sees."""
    count = len(driver_gpus()) or num_gpus_visible()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(index) for index in range(count)]
    return [entry.strip() for entry in visible.split(",")][:count]


# Where TensorFlow 2.15 says how loading its GPU libraries went: its library loader names
# each library it could not open (at VLOG level 1, which TF_CPP_VMODULE turns on; "Cannot
# dlopen some GPU libraries" names none), the others what it concluded ("Could not find
# cuda drivers on your machine, GPU will not be used.").
GPU_LIBRARY_SOURCES = ("dso_loader", "cudart_stub", "cuda_diagnostics", "cuda_driver",
                       "gpu_device")
TENSORFLOW_CPP_LOG_LINE = re.compile(r"^\S+ \S+: [IWEF] \S*?(\w+)\.cc:\d+\] (.*)$")


def gpu_library_messages():
    """What TensorFlow says about loading its GPU libraries: the first sentence of each
    message, once each, in order.

    Asked of a new interpreter that lists the GPUs with all of TensorFlow's C++ lines on
    (a running trainer has muted its INFO lines for good). TensorRT's libraries, which
    TensorFlow loads only for TF-TRT, are left out.
    """
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="dso_loader=1")
    try:
        stderr = subprocess.run(
            [sys.executable, "-c",
             "import tensorflow as tf; tf.config.list_physical_devices('GPU')"],
            env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            universal_newlines=True, timeout=300).stderr
    except (OSError, subprocess.SubprocessError):
        return []
    messages = []
    for match in map(TENSORFLOW_CPP_LOG_LINE.match, stderr.splitlines()):
        if (not match or match.group(1) not in GPU_LIBRARY_SOURCES
                or "libnvinfer" in match.group(2)):
            continue
        message = match.group(2).split(". ")[0]
        if message != match.group(2):
            message += "."
        if message not in messages:
            messages.append(message)
    return messages
