"""The CPU's peak FLOP rates, fp32 and bf16: derived, not measured.

cores x clock x FP32 FLOPs per cycle per core, where FLOPs per cycle follow from the
widest vector ISA in /proc/cpuinfo's flags and assume two vector FMA pipes per core (true
of Intel since Haswell and AMD since Zen 2):
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
FP32 peak, not twice it. That is an assumption, labelled as such in the derivation;
what was measured agrees with it: on an Intel Xeon (cpu family 6, model 207) oneDNN's
avx512_core_bf16 convolutions run forward about as fast as fp32 and backward slower
(docs/precision.md). AMX (amx_bf16) multiplies tiles: 1024 bf16 FLOPs per cycle per core (Intel's
figure).
The clock is cpufreq's maximum where the kernel exposes it, else the `cpu MHz` that
/proc/cpuinfo reports (on a VM, the host's nominal clock).
The trainer's closing summary sets the rate its steps reached against the peak of the
precision it trained in; the benchmarks report both peaks with the machine.
"""

import dataclasses
import os
import typing

from cifar10_estimator.machine import hardware

CPUFREQ_MAX_PATH = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"

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


@dataclasses.dataclass(frozen=True)
class CpuPeak:
    """The cores, clock and FLOPs per cycle a CPU's peaks are derived from.

    Attributes:
      cores: physical cores this process may run on.
      clock_mhz: the clock, or None where it is not known (then there is no peak).
      clock_source: where the clock was read.
      vector_isa: the widest vector instructions the FP32 figure follows.
      fp32_flops_per_cycle: FP32 FLOPs per cycle per core.
      bf16_flops_per_cycle: bf16 FLOPs per cycle per core, None without bf16 instructions.
      bf16_instructions: which instructions give them, or why there are none.
    """

    cores: int
    clock_mhz: typing.Optional[float]
    clock_source: str
    vector_isa: str
    fp32_flops_per_cycle: int
    bf16_flops_per_cycle: typing.Optional[int]
    bf16_instructions: str

    def gflops(self, compute_dtype):
        """The peak in GFLOP/s of `compute_dtype` ('float32' or 'bfloat16'), or None."""
        flops_per_cycle = self._flops_per_cycle(compute_dtype)
        if not (self.clock_mhz and flops_per_cycle):
            return None
        return self.cores * self.clock_mhz * flops_per_cycle / 1000.0

    def derivation(self, compute_dtype):
        """How gflops(compute_dtype) is derived, its clock named, or why there is none."""
        flops_per_cycle = self._flops_per_cycle(compute_dtype)
        if not flops_per_cycle:
            return self.bf16_instructions
        if not self.clock_mhz:
            return "clock unknown"
        if compute_dtype == "float32":
            return "%d cores x %.0f MHz x %d FP32 FLOPs/cycle (%s, two FMA pipes assumed)" % (
                self.cores, self.clock_mhz, flops_per_cycle, self.vector_isa)
        return "%d cores x %.0f MHz x %d bf16 FLOPs/cycle (%s)" % (
            self.cores, self.clock_mhz, flops_per_cycle, self.bf16_instructions)

    def _flops_per_cycle(self, compute_dtype):
        if compute_dtype == "float32":
            return self.fp32_flops_per_cycle
        if compute_dtype == "bfloat16":
            return self.bf16_flops_per_cycle
        return None


def of_processors(processors):
    """The CpuPeak of /proc/cpuinfo's processors (hardware.read_cpuinfo's list)."""
    first = processors[0] if processors else {}
    flags = hardware.flags_of(first)
    vendor = first.get("vendor_id", "")
    fp32_flops, isa = fp32_flops_per_cycle(flags, vendor, first.get("cpu family", ""))
    bf16_flops, bf16_instructions = bf16_flops_per_cycle(flags, fp32_flops, vendor)
    clock_mhz, clock_source = _clock_mhz(processors)
    return CpuPeak(cores=_usable_cores(processors), clock_mhz=clock_mhz,
                   clock_source=clock_source, vector_isa=isa,
                   fp32_flops_per_cycle=fp32_flops, bf16_flops_per_cycle=bf16_flops,
                   bf16_instructions=bf16_instructions)


def this_cpu():
    """The CpuPeak of the CPU this process runs on."""
    return of_processors(hardware.read_cpuinfo())
