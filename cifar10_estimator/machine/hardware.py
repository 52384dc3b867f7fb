"""What this machine has: its CPU (from /proc/cpuinfo), TensorFlow's oneDNN kernels, GPUs.

Probes only, no decisions: precision, the flag checks and the benchmarks read them.
/proc/cpuinfo is read without TensorFlow; the oneDNN and GPU probes load it.
"""

import os

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


def gpu_compute_capabilities(num_gpus):
    """(major, minor) compute capability of each of the first num_gpus GPUs."""
    import tensorflow as tf  # lazy: keeps the trainer's flag errors fast
    gpus = tf.config.list_physical_devices("GPU")[:num_gpus]
    return [tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0))
            for gpu in gpus]
