"""The host a benchmark runs on: its CPU and both peaks (derived by machine.cpu_peak, whose
rules tests/test_compute.py checks), /proc/cpuinfo, its processes' memory."""

import os
import queue
import subprocess
import sys
import time

import pytest

from cifar10_estimator.machine import hardware
from cifar10_estimator.benchmarks import host
from cifar10_estimator.benchmarks import training


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
    # Held 1 s: 20 of the parent's samples (each reads the child's peak so far), where one
    # after the allocation is enough.
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
