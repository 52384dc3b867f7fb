"""The host a benchmark runs on: CPU model, cores, clock, and its FP32 and bf16 peaks.

The peak is derived, not measured: cores x clock x FP32 FLOPs per cycle per core, where
FLOPs per cycle follow from the widest vector ISA in /proc/cpuinfo's flags and assume
two vector FMA pipes per core (true of Intel since Haswell and AMD since Zen 2):
  avx512f           2 pipes x 16 lanes x 2 (multiply + add) = 64
  avx2 and fma      2 pipes x  8 lanes x 2                  = 32
  avx               8-lane add + 8-lane multiply            = 16
  sse2              4-lane add + 4-lane multiply            =  8
except on AMD Zen 4 (cpu family 25 with avx512f), which runs each 512-bit instruction
as two halves on its two 256-bit FMA pipes: 32, as with AVX2.
The bf16 peak: AVX512_BF16's dot product (vdpbf16ps) does two bfloat16 multiply-adds per
32-bit lane where an FMA does one float32. On AMD (Zen 4, Zen 5) it issues on the same
pipes as the FMAs: twice the FP32 peak. On Intel cores without AMX it is taken as one
512-bit dot product per cycle (one port, where FP32 FMAs have two on server cores): the
FP32 peak, not twice it. That is an assumption, labelled as such in the machine record;
what was measured agrees with it: on an Intel Xeon (cpu family 6, model 207) oneDNN's
avx512_core_bf16 convolutions run forward about as fast as fp32 and backward slower
(docs/precision.md). AMX (amx_bf16) multiplies tiles: 1024 bf16 FLOPs per cycle per core (Intel's
figure).
The clock is cpufreq's maximum where the kernel exposes it, else the `cpu MHz` that
/proc/cpuinfo reports (on a VM, the host's nominal clock).
"""

import datetime
import os
import platform
import resource
import time

import tensorflow as tf

from cifar10_estimator.machine import hardware

CPUFREQ_MAX_PATH = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"

# Environment variables that change TensorFlow's CPU speed, recorded with the results.
_PERFORMANCE_VARIABLE_PREFIXES = ("TF_", "OMP_", "KMP_", "MALLOC_", "ONEDNN_", "DNNL_")

# (required flags, FP32 FLOPs per cycle per core, name), widest first.
_ISA_FLOPS_PER_CYCLE = (
    (("avx512f", "fma"), 64, "AVX-512 with FMA"),
    (("avx2", "fma"), 32, "AVX2 with FMA"),
    (("avx",), 16, "AVX"),
    (("sse2",), 8, "SSE2"),
)
# (vendor_id, cpu family) of AMD Zen 3 and Zen 4; only Zen 4 has AVX-512, half-width.
_ZEN4 = ("AuthenticAMD", "25")
AMX_BF16_FLOPS_PER_CYCLE = 1024


def _clock_mhz(processors):
    try:
        with open(CPUFREQ_MAX_PATH) as stream:
            return int(stream.read()) / 1000.0, "cpufreq maximum"
    except (OSError, ValueError):
        pass
    clocks = [float(cpu["cpu MHz"]) for cpu in processors if "cpu MHz" in cpu]
    if clocks:
        return max(clocks), "cpu MHz in /proc/cpuinfo"
    return None, "unknown"


def _usable_cores(processors):
    """Physical cores this process may run on: distinct (package, core) pairs in its affinity."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores = set()
    for index, cpu in enumerate(processors):
        logical_id = int(cpu.get("processor", index))
        if allowed is not None and logical_id not in allowed:
            continue
        cores.add((cpu.get("physical id", "0"), cpu.get("core id", str(logical_id))))
    if cores:
        return len(cores)
    return len(allowed) if allowed else (os.cpu_count() or 1)


def fp32_flops_per_cycle(flags, vendor="", family=""):
    """(FP32 FLOPs per cycle per core, ISA name) from cpuinfo's flags, vendor_id, cpu family."""
    for required, flops, name in _ISA_FLOPS_PER_CYCLE:
        if all(flag in flags for flag in required):
            if name.startswith("AVX-512") and (vendor, family) == _ZEN4:
                return flops // 2, name + " on 256-bit pipes (AMD Zen 4)"
            return flops, name
    return 2, "scalar"


def bf16_flops_per_cycle(flags, fp32_flops, vendor=""):
    """(bf16 FLOPs per cycle per core, instructions), or (None, reason) without bf16 ones."""
    if "amx_bf16" in flags:
        return AMX_BF16_FLOPS_PER_CYCLE, "AMX tiles"
    if "avx512_bf16" not in flags:
        return None, "no bfloat16 instructions"
    if vendor == "GenuineIntel":
        return fp32_flops, ("AVX512_BF16 dot products without AMX, assumed one per cycle on "
                            "one port: the FP32 FMA rate")
    return 2 * fp32_flops, "AVX512_BF16 dot products on the FMA pipes, 2x the FP32 FMA rate"


def cpu_identity(machine):
    """'model name (cpu family F, model M)': the CPU every figure was measured on."""
    return "%s (cpu family %s, model %s)" % (machine["cpu_model"], machine["cpu_family"],
                                             machine["cpu_model_number"])


def describe_machine():
    """Dict describing this machine, with its derived FP32 and bf16 peaks (None if unknown)."""
    processors = hardware.read_cpuinfo()
    first = processors[0] if processors else {}
    flags = hardware.flags_of(first)
    flops_per_cycle, isa = fp32_flops_per_cycle(
        flags, first.get("vendor_id", ""), first.get("cpu family", ""))
    clock_mhz, clock_source = _clock_mhz(processors)
    cores = _usable_cores(processors)
    peak = cores * clock_mhz * 1e6 * flops_per_cycle if clock_mhz else None
    bf16_flops, bf16_instructions = bf16_flops_per_cycle(flags, flops_per_cycle,
                                                         first.get("vendor_id", ""))
    bf16_peak = cores * clock_mhz * 1e6 * bf16_flops if clock_mhz and bf16_flops else None
    return {
        "cpu_model": first.get("model name", platform.processor() or "unknown"),
        "cpu_family": first.get("cpu family", "unknown"),
        "cpu_model_number": first.get("model", "unknown"),
        "logical_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "physical_cores": cores,
        "clock_mhz": clock_mhz,
        "clock_source": clock_source,
        "vector_isa": isa,
        "fp32_flops_per_cycle_per_core": flops_per_cycle,
        "fp32_peak_gflops": peak / 1e9 if peak else None,
        "fp32_peak_derivation": (
            "%d cores x %.0f MHz x %d FP32 FLOPs/cycle (%s, two FMA pipes assumed)"
            % (cores, clock_mhz, flops_per_cycle, isa) if clock_mhz else "clock unknown"),
        "bf16_flops_per_cycle_per_core": bf16_flops,
        "bf16_peak_gflops": bf16_peak / 1e9 if bf16_peak else None,
        "bf16_peak_derivation": (
            "%d cores x %.0f MHz x %d bf16 FLOPs/cycle (%s)"
            % (cores, clock_mhz, bf16_flops, bf16_instructions) if bf16_peak
            else bf16_instructions if not bf16_flops else "clock unknown"),
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
