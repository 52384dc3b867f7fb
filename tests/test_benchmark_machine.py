"""How the benchmark derives a CPU's FP32 peak from /proc/cpuinfo."""

import pytest

from cifar10_estimator import benchmark_machine

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
    flops, isa = benchmark_machine.fp32_flops_per_cycle(flags, vendor, family)
    assert flops == expected, isa


def test_cpuinfo_is_read_per_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\n"
                       "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    processors = benchmark_machine._read_cpuinfo(str(cpuinfo))
    assert [cpu["processor"] for cpu in processors] == ["0", "1"]
    assert processors[0]["cpu family"] == "25"
