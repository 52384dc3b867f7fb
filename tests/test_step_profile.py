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
    assert lines[0].startswith("ResNet-8, fp32, channels_last, batch 8, 32 pixels, the "
                               "tutorial recipe's update: 2 traced steps")
    rows = [ROW.match(line).groups() for line in lines[3:]]
    assert len(rows) == 5 and rows[-1][0].startswith("(")
    milliseconds = [float(ms) for _, ms, _ in rows]
    assert milliseconds[:4] == sorted(milliseconds[:4], reverse=True)
    assert sum(float(share) for _, _, share in rows) == pytest.approx(100, abs=0.3)
    # The convolutions and their gradients are a training step's kernels, by any name.
    assert any("Conv2D" in op_type for op_type, _, _ in rows[:4])


@pytest.mark.slow
def test_a_recipes_step_on_smaller_images_resizes_them_and_makes_the_recipes_update():
    result = run_module(MODULE, ["--num-layers", "8", "--batch-size", "8", "--steps", "2",
                                 "--top", "1000", "--recipe", "quick", "--image-size", "16"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ResNet-8, fp32, channels_last, batch 8, 16 pixels, the quick "
                               "recipe's update: 2 traced steps")
    op_types = {ROW.match(line).group(1) for line in lines[3:]}
    # The area resize of a --low-resolution phase; the quick recipe's cosine rate and its
    # smoothed labels' dense cross entropy (the tutorial's is the sparse one).
    assert {"ResizeArea", "Cos", "SoftmaxCrossEntropyWithLogits"} <= op_types


@pytest.mark.parametrize("flags, named", [(["--steps", "0"], "--steps"),
                                          (["--image-size", "7"], "--image-size"),
                                          (["--recipe", "fastest"], "--recipe")])
def test_a_bad_flag_is_one_line(flags, named):
    assert_one_line_error(run_module(MODULE, flags), 2, named)
