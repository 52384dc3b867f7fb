"""The host a benchmark runs on: CPU model, cores, clock, and its FP32 and bf16 peaks
(derived in machine/cpu_peak.py, as the trainer's closing summary derives the one it
trained in), its load, and its processes' CPU time and memory.
"""

import datetime
import os
import platform
import resource
import time

import tensorflow as tf

from cifar10_estimator.machine import cpu_peak
from cifar10_estimator.machine import hardware

# Environment variables that change TensorFlow's CPU speed, recorded with the results.
_PERFORMANCE_VARIABLE_PREFIXES = ("TF_", "OMP_", "KMP_", "MALLOC_", "ONEDNN_", "DNNL_")


def cpu_identity(machine):
    """'model name (cpu family F, model M)': the CPU every figure was measured on."""
    return "%s (cpu family %s, model %s)" % (machine["cpu_model"], machine["cpu_family"],
                                             machine["cpu_model_number"])


def describe_machine():
    """Dict describing this machine, with its derived FP32 and bf16 peaks (None if unknown)."""
    processors = hardware.read_cpuinfo()
    first = processors[0] if processors else {}
    peak = cpu_peak.of_processors(processors)
    return {
        "cpu_model": first.get("model name", platform.processor() or "unknown"),
        "cpu_family": first.get("cpu family", "unknown"),
        "cpu_model_number": first.get("model", "unknown"),
        "logical_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "physical_cores": peak.cores,
        "clock_mhz": peak.clock_mhz,
        "clock_source": peak.clock_source,
        "vector_isa": peak.vector_isa,
        "fp32_flops_per_cycle_per_core": peak.fp32_flops_per_cycle,
        "fp32_peak_gflops": peak.gflops("float32"),
        "fp32_peak_derivation": peak.derivation("float32"),
        "bf16_flops_per_cycle_per_core": peak.bf16_flops_per_cycle,
        "bf16_peak_gflops": peak.gflops("bfloat16"),
        "bf16_peak_derivation": peak.derivation("bfloat16"),
        "memory_gib": _memory_gib(),
        "tensorflow_version": tf.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "performance_environment": {
            name: value for name, value in sorted(os.environ.items())
            if name.startswith(_PERFORMANCE_VARIABLE_PREFIXES)},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _memory_gib():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / float(1 << 30)
    except (ValueError, OSError, AttributeError):
        return None


def load_average():
    """The 1-, 5- and 15-minute load averages, or None where the OS has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def cpu_busy_secs():
    """CPU seconds all processors have been busy since boot (None without /proc/stat)."""
    try:
        with open("/proc/stat") as stream:
            fields = [int(value) for value in stream.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / float(os.sysconf("SC_CLK_TCK"))


def process_cpu_secs(pid):
    """CPU seconds (user + system, all threads) process pid has used so far, or None."""
    try:
        with open("/proc/%d/stat" % pid) as stream:
            # Fields after the parenthesised command name; utime and stime are 14 and 15.
            fields = stream.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_mb(pid):
    """Peak resident memory (VmHWM) of live process pid in MB, or None if unreadable.

    Unlike the ru_maxrss that wait4 returns, it does not include what the parent had
    resident when it started the child: exec records the old address space's peak.
    """
    try:
        with open("/proc/%d/status" % pid) as stream:
            for line in stream:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def has_exited(pid):
    """Whether child pid has exited, without reaping it (its status stays for wait4)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _own_cpu_secs():
    """CPU seconds of this process and of its children that were waited for."""
    return sum(usage.ru_utime + usage.ru_stime for usage in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


class BackgroundCpuMeter:
    """CPU time other processes (and the hypervisor's steal) take while we work.

    Started on creation; `share()` is that time since then as a fraction of all cores.
    Our own time counts this process and the children it has waited for.
    """

    def __init__(self):
        self._busy_secs = cpu_busy_secs()
        self._own_secs = _own_cpu_secs()
        self._start = time.perf_counter()

    def share(self):
        """Fraction of all cores' time used by others since the start, or None if unknown."""
        busy_secs = cpu_busy_secs()
        if busy_secs is None or self._busy_secs is None:
            return None
        others = (busy_secs - self._busy_secs) - (_own_cpu_secs() - self._own_secs)
        wall = time.perf_counter() - self._start
        return max(0.0, others) / (wall * (os.cpu_count() or 1))
