"""python -m cifar10_estimator.benchmarks.step_profile: kernel time by op type, for real.

No speed is asserted: the figures depend on the machine and its load.
"""

import re

import pytest

from cli_helpers import assert_one_line_error, run_module

MODULE = "cifar10_estimator.benchmarks.step_profile"
ROW = re.compile(r"^\| (\S.*?) \| ([0-9.]+) \| ([0-9.]+) % \|$")


@pytest.mark.slow
def test_the_table_ranks_the_traced_steps_op_types_and_their_shares_sum_to_all():
    result = run_module(MODULE, ["--num-layers", "8", "--batch-size", "8", "--steps", "2",
                                 "--top", "4"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ResNet-8, fp32, channels_last, batch 8: 2 traced steps")
    rows = [ROW.match(line).groups() for line in lines[3:]]
    assert len(rows) == 5 and rows[-1][0].startswith("(")
    milliseconds = [float(ms) for _, ms, _ in rows]
    assert milliseconds[:4] == sorted(milliseconds[:4], reverse=True)
    assert sum(float(share) for _, _, share in rows) == pytest.approx(100, abs=0.3)
    # The convolutions and their gradients are a training step's kernels, by any name.
    assert any("Conv2D" in op_type for op_type, _, _ in rows[:4])


def test_a_bad_flag_is_one_line():
    assert_one_line_error(run_module(MODULE, ["--steps", "0"]), 2, "--steps")
