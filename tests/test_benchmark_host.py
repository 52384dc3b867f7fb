"""How the benchmark derives a CPU's FP32 and bf16 peaks from /proc/cpuinfo."""

import os
import queue
import subprocess
import sys
import time

import pytest

from cifar10_estimator.machine import hardware
from cifar10_estimator.benchmarks import host
from cifar10_estimator.benchmarks import training

AVX512 = {"sse2", "avx", "avx2", "fma", "avx512f"}
AVX2 = {"sse2", "avx", "avx2", "fma"}


@pytest.mark.parametrize("flags, vendor, family, expected", [
    (AVX512, "GenuineIntel", "6", 64),   # Skylake-SP and later: two 512-bit FMA pipes
    (AVX512, "AuthenticAMD", "25", 32),  # Zen 4: 512-bit instructions on 256-bit pipes
    (AVX512, "AuthenticAMD", "26", 64),  # Zen 5 server: full-width pipes
    (AVX2, "AuthenticAMD", "25", 32),    # Zen 3
    (AVX2, "GenuineIntel", "6", 32),
    ({"sse2", "avx"}, "GenuineIntel", "6", 16),
    ({"sse2"}, "", "", 8),
    (set(), "", "", 2),
])
def test_fp32_flops_per_cycle_follow_the_vector_units(flags, vendor, family, expected):
    flops, isa = host.fp32_flops_per_cycle(flags, vendor, family)
    assert flops == expected, isa


@pytest.mark.parametrize("flags, fp32_flops, vendor, expected", [
    (AVX512 | {"avx512_bf16"}, 32, "AuthenticAMD", 64),   # Zen 4: on the half-width FMA pipes
    (AVX512 | {"avx512_bf16"}, 64, "AuthenticAMD", 128),  # Zen 5
    (AVX512 | {"avx512_bf16"}, 64, "GenuineIntel", 64),   # Xeon without AMX: not 2x
    (AVX512 | {"avx512_bf16", "amx_bf16"}, 64, "GenuineIntel", 1024),
    (AVX512, 64, "GenuineIntel", None),
])
def test_bf16_flops_per_cycle_follow_the_vendors_dot_product_units(flags, fp32_flops, vendor,
                                                                    expected):
    flops, instructions = host.bf16_flops_per_cycle(flags, fp32_flops, vendor)
    assert flops == expected, instructions


def test_the_machine_names_its_cpu_family_and_both_peaks():
    described = host.describe_machine()
    assert described["cpu_family"] != "unknown"
    assert described["cpu_family"] in host.cpu_identity(described)
    if described["bf16_peak_gflops"]:
        assert described["bf16_peak_gflops"] == pytest.approx(
            described["fp32_peak_gflops"] * described["bf16_flops_per_cycle_per_core"]
            / described["fp32_flops_per_cycle_per_core"])


def test_cpuinfo_is_read_per_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\n"
                       "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    processors = hardware.read_cpuinfo(str(cpuinfo))
    assert [cpu["processor"] for cpu in processors] == ["0", "1"]
    assert processors[0]["cpu family"] == "25"


def _finish(argv, tmp_path):
    """Run argv as a benchmark child to its end; returns (status, CPU secs, peak RSS MB)."""
    child = training._Child(0, argv, dict(os.environ), str(tmp_path / "log"),
                                      queue.Queue())
    while child.sample_memory():
        time.sleep(training.MEMORY_SAMPLE_SECS)
    return child.finish()


def test_a_childs_peak_memory_is_its_own(tmp_path):
    holds_300_mb = "import time; data = b'x' * (300 << 20); time.sleep(1)"
    status, _, peak_mb = _finish([sys.executable, "-c", holds_300_mb], tmp_path)
    assert status == 0
    assert 300 < peak_mb < 400
    # A big parent: wait4's ru_maxrss would report the parent's resident size for the
    # child too, as exec records the peak of the address space it replaces.
    parent_ballast = b"y" * (600 << 20)
    status, _, peak_mb = _finish([sys.executable, "-c", "import time; time.sleep(1)"], tmp_path)
    assert status == 0
    assert peak_mb < 100, (peak_mb, len(parent_ballast))


def test_has_exited_leaves_the_status_to_collect(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    while not host.has_exited(process.pid):
        time.sleep(0.01)
    assert host.has_exited(process.pid)
    assert host.peak_rss_mb(process.pid) is None  # an exited child has no memory
    _, status, _ = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    process.returncode = 3
