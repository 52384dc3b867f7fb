"""python -m tools.step_rates: steps of several sizes, alternated.

No speed is asserted: the figures depend on the machine and its load. What is checked is
that each row's figures follow from its timings and the trainer's FLOP count.
"""

import re

import pytest

from cli_helpers import assert_one_line_error, run_module

from cifar10_estimator import cifar10_model
from cifar10_estimator.machine import cpu_peak
from cifar10_estimator.training import muon as muon_update

MODULE = "tools.step_rates"
RANGE = re.compile(r"^([0-9]+) \(([0-9]+)-([0-9]+)\)$")


@pytest.mark.slow
def test_each_size_gets_a_row_whose_gflops_are_its_rate_times_the_trainers_count():
    result = run_module(MODULE, ["--num-layers", "8", "--image-sizes", "16", "32",
                                 "--batch-sizes", "8", "--steps", "2", "--rounds", "3",
                                 "--muon-learning-rates", "0", "0.06"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "(cpu family " in lines[0] and "GFLOP/s in float32" in lines[0]
    assert lines[1] == ("ResNet-8, fp32, the sprint recipe's update; 3 rounds of 2 steps a "
                        "size, alternated")
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[4:]]
    assert [(int(row[0]), int(row[1]), row[2]) for row in cells] == [
        (side, 8, muon) for side in (16, 32) for muon in ("-", "0.06")]
    peak = cpu_peak.this_cpu().gflops("float32")
    for side, batch, muon, step_ms, rates, mflop, gflops, share in cells:
        median, low, high = (int(rate) for rate in RANGE.match(rates).groups())
        assert low <= median <= high
        # The step's time and the examples a second are one measurement (rounded).
        assert int(batch) * 1000 / float(step_ms) == pytest.approx(median, rel=0.05, abs=2)
        flops = cifar10_model.training_flops_per_example(8, int(side))
        if muon != "-":
            # Each step's orthogonalisations, shared over its examples, as the trainer
            # counts them.
            flops += muon_update.step_flops(cifar10_model.kernel_shapes(8)) / int(batch)
        assert mflop == "%.1f" % (flops / 1e6)
        assert float(gflops) == pytest.approx(median * flops / 1e9, rel=0.01, abs=1)
        if peak:
            assert float(share.rstrip(" %")) == pytest.approx(
                100 * float(gflops) / peak, abs=1)
        else:
            assert share == "-"


@pytest.mark.parametrize("flags, named", [(["--steps", "0"], "--steps"),
                                          (["--image-sizes", "40"], "--image-sizes"),
                                          (["--batch-sizes", "0"], "--batch-sizes"),
                                          (["--muon-learning-rates", "-1"],
                                           "--muon-learning-rates")])
def test_a_bad_flag_is_one_line(flags, named):
    assert_one_line_error(run_module(MODULE, flags), 2, named)
