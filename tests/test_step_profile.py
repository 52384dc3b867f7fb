"""python -m tools.step_profile: kernel time by op type, for real.

No speed is asserted: the figures depend on the machine and its load.
"""

import re

import pytest

from cli_helpers import assert_one_line_error, run_module

MODULE = "tools.step_profile"
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
                                 "--top", "1000", "--recipe", "quick", "--image-size", "16",
                                 "--convolutions"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ResNet-8, fp32, channels_last, batch 8, 16 pixels, the quick "
                               "recipe's update: 2 traced steps")
    type_rows = [ROW.match(line).groups() for line in lines[3:lines.index("")]]
    op_types = {op_type for op_type, _, _ in type_rows}
    # The area resize of a --low-resolution phase (matrix products: training/area_resize;
    # oneDNN's kernel is _MklEinsum); the quick recipe's cosine rate and its smoothed
    # labels' dense cross entropy (the tutorial's is the sparse one).
    assert any(op_type.endswith("Einsum") for op_type in op_types), op_types
    assert {"Cos", "SoftmaxCrossEntropyWithLogits"} <= op_types

    # --convolutions: ResNet-8's 7 convolutions in graph order, as the 16-pixel step ran them.
    convolution_lines = lines[lines.index("") + 3:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in convolution_lines]
    assert [row[0] for row in cells] == [
        "conv2d", "stage/residual_v1/conv2d", "stage/residual_v1/conv2d_1",
        "stage_1/residual_v1/conv2d", "stage_1/residual_v1/conv2d_1",
        "stage_2/residual_v1/conv2d", "stage_2/residual_v1/conv2d_1", "all"]
    assert [row[1] for row in cells[:-1]] == (["8x16x16x16"] * 3 + ["8x8x8x32"] * 2
                                              + ["8x4x4x64"] * 2)
    # 2 FLOPs per multiply-add: the first layer's 3x3x3 kernel for each of 8x16x16x16
    # outputs; the first of stage 1 a 3x3x16 kernel for 8x8x8x32.
    assert cells[0][2] == "%.1f" % (2 * 8 * 16 * 16 * 16 * 27 / 1e6)
    assert cells[3][2] == "%.1f" % (2 * 8 * 8 * 8 * 32 * 9 * 16 / 1e6)
    # The images need no gradient: the first layer alone has no input-gradient kernel.
    assert cells[0][5] == "-"
    assert all(cell != "-" for row in cells[1:] for cell in row[3:])
    # Both gradients' time runs from the first one's start to the last one's end: at least
    # the longer of the two (each rounded to 0.01 ms). It can exceed their sum when one
    # waits for a core, so that is no bound.
    for row in cells[1:-1]:
        input_ms, filter_ms, both_ms = (float(cell) for cell in row[5:8])
        assert max(input_ms, filter_ms) - 0.01 <= both_ms
    # The layers' kernels are the op-type table's convolution kernels, by direction.
    milliseconds = {op_type: float(ms) for op_type, ms, _ in type_rows}
    for column, kind in ((3, "Conv2D"), (5, "Conv2DBackpropInput"),
                         (6, "Conv2DBackpropFilter")):
        by_type = sum(ms for op_type, ms in milliseconds.items() if op_type.endswith(kind))
        assert float(cells[-1][column]) == pytest.approx(by_type, abs=0.02)


@pytest.mark.parametrize("flags, named", [(["--steps", "0"], "--steps"),
                                          (["--image-size", "7"], "--image-size"),
                                          (["--recipe", "fastest"], "--recipe")])
def test_a_bad_flag_is_one_line(flags, named):
    assert_one_line_error(run_module(MODULE, flags), 2, named)


@pytest.mark.slow
def test_a_muon_rate_makes_the_profiled_step_update_the_kernels_by_muon():
    import tensorflow as tf
    from tools import step_profile
    from cifar10_estimator.training import muon
    options = step_profile.StepProfileOptions(num_layers=8, batch_size=4,
                                              muon_learning_rate=0.06)
    with tf.Graph().as_default():
        session, train_op = step_profile.training_session(options)
        with session:
            session.run(train_op)
            names = [variable.op.name for variable in tf.compat.v1.global_variables()]
    kernels = [name for name in names if name.endswith("/kernel")
               and "conv2d" in name]
    # ResNet-8's 7 convolution kernels, each with its Muon momentum.
    assert len(kernels) == 7
    assert {kernel + "/" + muon.MOMENTUM_NAME for kernel in kernels} <= set(names)
    assert step_profile.update_text("quick", 0.06) == (
        "the quick recipe's update, the kernels' by Muon at 0.06")


@pytest.mark.parametrize("given, expected", [(None, "recipe"), (0.0, 0.0), (0.03, 0.03)])
def test_the_profiled_step_updates_as_the_recipe_does_unless_a_muon_rate_is_given(given,
                                                                                 expected):
    from tools import step_profile
    from cifar10_estimator.settings import recipes
    options = step_profile.StepProfileOptions(recipe="sprint", muon_learning_rate=given)
    if expected == "recipe":
        expected = recipes.RECIPES["sprint"]["muon_learning_rate"]
    assert step_profile.hparams_of(options).muon_learning_rate == expected
