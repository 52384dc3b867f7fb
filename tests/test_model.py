"""ResNet building blocks and the CIFAR-10 network: shapes, sizes, data formats, training."""

import functools
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10_model, model_base
from cifar10_estimator.cli.child_process import child_environment

BATCH_NORM_DECAY = 0.9
BATCH_NORM_EPSILON = 1e-5

# He et al. 2016, Table 6: parameters of the CIFAR-10 ResNets, in millions.
PAPER_MILLIONS_OF_PARAMETERS = [
    (20, 0.27), (32, 0.46), (44, 0.66), (56, 0.85),
    pytest.param(110, 1.7, marks=pytest.mark.slow),
]


def random_images(num_images, seed=0):
    """NHWC float images with pixel values 0..255, as the data set yields them."""
    return np.random.RandomState(seed).uniform(0, 255, (num_images, 32, 32, 3)).astype(np.float32)


def make_model(num_layers=8, is_training=True, data_format="channels_last", **kwargs):
    return cifar10_model.ResNetCifar10(num_layers, is_training, BATCH_NORM_DECAY,
                                       BATCH_NORM_EPSILON, data_format=data_format, **kwargs)


def test_a_network_from_its_config_is_the_one_of_the_tutorials_arguments():
    config = cifar10_model.ModelConfig(num_layers=14, batch_norm_decay=BATCH_NORM_DECAY,
                                       batch_norm_epsilon=BATCH_NORM_EPSILON,
                                       zero_init_residual=True)
    from_config = cifar10_model.ResNetCifar10.from_config(config, True, "channels_last",
                                                          num_classes=10)
    tutorials = make_model(14, num_classes=10, zero_init_residual=True)
    assert from_config.config == tutorials.config == config
    assert (from_config.num_units_per_stage, from_config.num_classes,
            from_config.data_format) == (2, 10, "channels_last")
    shapes = []
    for model in (from_config, tutorials):
        with tf.Graph().as_default():
            model.forward_pass(tf.zeros([1, 32, 32, 3]))
            shapes.append([(variable.op.name, variable.shape.as_list())
                           for variable in tf.compat.v1.global_variables()])
    assert shapes[0] == shapes[1] and len(shapes[0]) > 20
    with pytest.raises(ValueError, match="data_format"):
        cifar10_model.ResNetCifar10.from_config(config, True, "NHWC")


def _nchw_probes():
    """(op type, fetch) pairs exercising each NCHW kernel the model uses, forward and backward."""
    x = tf.ones([1, 2, 4, 4])
    kernel = tf.ones([3, 3, 2, 2])
    convolved = tf.nn.conv2d(x, kernel, 1, "SAME", data_format="NCHW")
    pooled = tf.nn.avg_pool2d(x, 2, 2, "SAME", data_format="NCHW")
    normalized, _, _ = tf.compat.v1.nn.fused_batch_norm(x, tf.ones([2]), tf.zeros([2]),
                                                        data_format="NCHW")
    return [
        ("Conv2D", convolved),
        ("Conv2DBackpropInput", tf.gradients(convolved, x)),
        ("Conv2DBackpropFilter", tf.gradients(convolved, kernel)),
        ("AvgPool", pooled),
        ("AvgPoolGrad", tf.gradients(pooled, x)),
        ("FusedBatchNormV3", normalized),
        ("FusedBatchNormGradV3", tf.gradients(normalized, x)),
    ]


@functools.lru_cache(maxsize=None)
def nchw_unsupported_reason():
    """Why this TensorFlow build cannot run the model in NCHW on CPU, or None if it can.

    Stock TensorFlow 2.15 CPU kernels of Conv2D (and its two gradients) and
    AvgPool (and its gradient) accept only NHWC; fused batch norm accepts both.
    With oneDNN kernels all of them run in NCHW; whether TensorFlow uses oneDNN
    by default depends on the CPU, TF_ENABLE_ONEDNN_OPTS=1 forces it.
    """
    failures = []
    graph = tf.Graph()
    with graph.as_default():
        probes = _nchw_probes()
        with tf.compat.v1.Session(graph=graph) as session:
            for op_type, fetch in probes:
                try:
                    session.run(fetch)
                except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
                    nhwc_lines = [line for line in error.message.splitlines() if "NHWC" in line]
                    failures.append("%s (%s)" % (op_type, (nhwc_lines or [error.message])[0]))
    if not failures:
        return None
    return ("channels_first (NCHW) does not run on this CPU build of TensorFlow; failing "
            "kernels: %s. Set TF_ENABLE_ONEDNN_OPTS=1 for oneDNN kernels, which support NCHW"
            % "; ".join(failures))


def skip_unless_runnable(data_format):
    if data_format == "channels_first" and nchw_unsupported_reason():
        pytest.skip(nchw_unsupported_reason())


def trainable_parameter_count():
    return sum(int(np.prod(variable.shape)) for variable in tf.compat.v1.trainable_variables())


@pytest.mark.parametrize("num_layers, paper_millions", PAPER_MILLIONS_OF_PARAMETERS)
def test_parameter_counts_match_the_resnet_paper(num_layers, paper_millions):
    with tf.Graph().as_default():
        make_model(num_layers).forward_pass(tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3]))
        count = trainable_parameter_count()
    # The paper rounds to two significant figures.
    assert float("%.2g" % (count / 1e6)) == paper_millions, count


@pytest.mark.parametrize("num_layers, units_per_stage", [(8, 1), (14, 2), (20, 3), (110, 18)])
def test_depth_6n_plus_2_gives_n_units_per_stage(num_layers, units_per_stage):
    assert make_model(num_layers).num_units_per_stage == units_per_stage


@pytest.mark.parametrize("num_layers", [0, 2, 7, 21, 22, 20.0, "20"])
def test_depth_other_than_6n_plus_2_is_rejected(num_layers):
    with pytest.raises(ValueError, match=r"6n\+2"):
        make_model(num_layers)


def test_unknown_data_format_is_rejected():
    with pytest.raises(ValueError, match="channels_first"):
        make_model(data_format="NHWC")


def test_base_class_leaves_forward_pass_to_subclasses():
    model = model_base.ResNet(True, "channels_last", BATCH_NORM_DECAY, BATCH_NORM_EPSILON)
    with pytest.raises(NotImplementedError):
        model.forward_pass(tf.zeros([1, 32, 32, 3]))


def residual_v1(model, x, in_filter, out_filter, stride):
    return model._residual_v1(x, 3, in_filter, out_filter, stride)


def residual_v2(model, x, in_filter, out_filter, stride):
    return model._residual_v2(x, in_filter, out_filter, stride)


def residual_v2_activated_first(model, x, in_filter, out_filter, stride):
    return model._residual_v2(x, in_filter, out_filter, stride, activate_before_residual=True)


def bottleneck_residual_v2(model, x, in_filter, out_filter, stride):
    return model._bottleneck_residual_v2(x, in_filter, out_filter, stride)


@pytest.mark.parametrize("data_format", model_base.DATA_FORMATS)
@pytest.mark.parametrize("in_filter, out_filter, stride", [
    (16, 16, 1), (16, 32, 2), (16, 32, 1), (16, 16, 2), (16, 24, 2)])
@pytest.mark.parametrize("block", [residual_v1, residual_v2, residual_v2_activated_first,
                                   bottleneck_residual_v2])
def test_residual_unit_output_shape(block, in_filter, out_filter, stride, data_format):
    nhwc_input = np.random.RandomState(1).normal(size=(2, 8, 8, in_filter)).astype(np.float32)
    size = 8 // stride
    if data_format == "channels_first":
        unit_input, expected_shape = nhwc_input.transpose(0, 3, 1, 2), (2, out_filter, size, size)
    else:
        unit_input, expected_shape = nhwc_input, (2, size, size, out_filter)
    graph = tf.Graph()
    with graph.as_default():
        model = model_base.ResNet(True, data_format, BATCH_NORM_DECAY, BATCH_NORM_EPSILON)
        output = block(model, tf.constant(unit_input), in_filter, out_filter, stride)
        assert tuple(output.shape) == expected_shape
        skip_unless_runnable(data_format)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert session.run(output).shape == expected_shape


def test_option_a_shortcut_adds_no_parameters():
    with tf.Graph().as_default():
        model = model_base.ResNet(True, "channels_last", BATCH_NORM_DECAY, BATCH_NORM_EPSILON)
        model._residual_v1(tf.zeros([1, 8, 8, 16]), 3, 16, 32, 2)
        count = trainable_parameter_count()
    two_convolutions = 3 * 3 * 16 * 32 + 3 * 3 * 32 * 32
    two_batch_norms = 2 * (32 + 32)
    assert count == two_convolutions + two_batch_norms


def test_option_a_shortcut_cannot_drop_channels():
    with tf.Graph().as_default():
        model = model_base.ResNet(True, "channels_last", BATCH_NORM_DECAY, BATCH_NORM_EPSILON)
        with pytest.raises(ValueError, match="cannot drop channels"):
            model._residual_v1(tf.zeros([1, 8, 8, 32]), 3, 32, 16, 1)


def run_logits(model, images, input_data_format="channels_last"):
    graph = tf.Graph()
    with graph.as_default():
        logits = model.forward_pass(tf.constant(images), input_data_format=input_data_format)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return session.run(logits)


@pytest.mark.parametrize("is_training", [True, False])
def test_forward_pass_gives_the_originals_11_logits_per_image(is_training):
    logits = run_logits(make_model(is_training=is_training), random_images(3))
    assert logits.shape == (3, 11)
    assert np.all(np.isfinite(logits))


def test_number_of_logits_is_configurable():
    assert run_logits(make_model(num_classes=10), random_images(2)).shape == (2, 10)


def test_nchw_input_gives_the_same_logits_as_nhwc_input():
    images = random_images(2)
    graph = tf.Graph()
    with graph.as_default():
        logits = []
        for input_data_format, model_input in [("channels_last", images),
                                               ("channels_first", images.transpose(0, 3, 1, 2))]:
            with tf.compat.v1.variable_scope("resnet", reuse=tf.compat.v1.AUTO_REUSE):
                model = make_model(is_training=False)
                logits.append(model.forward_pass(tf.constant(model_input), input_data_format))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            from_nhwc, from_nchw = session.run(logits)
    np.testing.assert_allclose(from_nchw, from_nhwc, rtol=1e-5, atol=1e-5)


def test_unknown_input_data_format_is_rejected():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="input_data_format"):
        make_model().forward_pass(tf.zeros([1, 32, 32, 3]), input_data_format="NCHW")


# The layout comparison below needs every ReLU input well away from 0: float32
# sums taken in another order (another layout, another CPU's kernels) differ by
# about 1e-6, and an input that close to 0 can land on the other side in one
# layout, flip its ReLU's derivative and move the kernel gradient by ~1e-3.
# Seed and image count give these weights a margin of about 2e-5 in both modes;
# the test checks the margin rather than trusting it.
LAYOUT_WEIGHTS_SEED = 111
LAYOUT_IMAGES = 2
RELU_INPUT_MARGIN = 1e-5


def random_channels_last_weights(seed=LAYOUT_WEIGHTS_SEED):
    """{variable name: value} for ResNet-8, all drawn from one seed.

    Kernels are He-normal; batch-norm values are far from their initial 1s and 0s.
    """
    rng = np.random.RandomState(seed)
    graph = tf.Graph()
    with graph.as_default():
        make_model().forward_pass(tf.zeros([1, 32, 32, 3]))
        shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()}
    weights = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("kernel"):
            fan_in = int(np.prod(shape[:-1]))
            value = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
        elif name.endswith(("moving_variance", "gamma")):
            value = rng.uniform(0.5, 2.0, shape)
        elif name.endswith(("moving_mean", "beta")):
            value = rng.normal(0, 0.5, shape)
        elif name.endswith("bias"):
            value = np.zeros(shape)
        else:
            raise AssertionError("no value for variable %s" % name)
        weights[name] = value.astype(np.float32)
    return weights


def logits_and_first_kernel_gradient(data_format, is_training, weights):
    """ResNet-8 logits of the layout test's images, d logits[:, 0] / d first conv kernel,
    and the smallest |input| of any ReLU."""
    graph = tf.Graph()
    with graph.as_default():
        model = make_model(is_training=is_training, data_format=data_format)
        logits = model.forward_pass(tf.constant(random_images(LAYOUT_IMAGES)))
        variables = tf.compat.v1.global_variables()
        gradient = tf.gradients(logits[:, 0], variables[0])[0]
        relu_inputs = [op.inputs[0] for op in graph.get_operations() if op.type == "Relu"]
        smallest = tf.reduce_min(tf.stack([tf.reduce_min(tf.abs(x)) for x in relu_inputs]))
        with tf.compat.v1.Session(graph=graph) as session:
            for variable in variables:
                # Kernels are HWIO and batch-norm vectors per channel in both
                # formats, so the same values serve both.
                variable.load(weights[variable.op.name], session)
            return session.run([logits, gradient, smallest])


MODES = {"training": True, "inference": False}


def run_in_fresh_process(data_format, weights, tmp_path):
    """Start logits_and_first_kernel_gradient in a new Python process, for both modes.

    Returns (process, output path). Each layout gets its own process because with
    oneDNN (TF 2.15) an AvgPool can return wrong values after the process ran
    another AvgPool of the same size in the other layout (its cached primitives
    ignore the layout). A trainer builds one format per process, training and
    evaluation alike, so it does not meet this; neither do the two modes here.
    """
    weights_path = tmp_path / "weights.npz"
    output_path = tmp_path / ("outputs_%s.npz" % data_format)
    if not weights_path.exists():
        np.savez(weights_path, **weights)
    # oneDNN kernels run NCHW convolution and pooling on the CPU; the stock ones do not.
    environment = child_environment({"TF_ENABLE_ONEDNN_OPTS": "1"})
    process = subprocess.Popen(
        [sys.executable, __file__, data_format, str(weights_path), str(output_path)],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return process, output_path


def _main(data_format, weights_path, output_path):
    with np.load(weights_path) as stored:
        weights = {name: stored[name] for name in stored.files}
    outputs = {}
    for mode, is_training in MODES.items():
        logits, gradient, smallest_relu_input = logits_and_first_kernel_gradient(
            data_format, is_training, weights)
        outputs.update({mode + "/logits": logits, mode + "/gradient": gradient,
                        mode + "/smallest_relu_input": smallest_relu_input})
    np.savez(output_path, **outputs)


@pytest.mark.slow
def test_channels_first_and_channels_last_agree_for_the_same_weights(tmp_path):
    weights = random_channels_last_weights()
    runs = {data_format: run_in_fresh_process(data_format, weights, tmp_path)
            for data_format in model_base.DATA_FORMATS}
    outputs = {}
    for data_format, (process, output_path) in runs.items():
        _, errors = process.communicate(timeout=300)
        assert process.returncode == 0, errors.decode(errors="replace")[-3000:]
        with np.load(output_path) as stored:
            outputs[data_format] = {name: stored[name] for name in stored.files}
    for mode in MODES:  # batch statistics (training) and moving statistics (inference)
        nhwc, nchw = [{name: output[mode + "/" + name]
                       for name in ("logits", "gradient", "smallest_relu_input")}
                      for output in (outputs["channels_last"], outputs["channels_first"])]
        assert nhwc["logits"].shape == (LAYOUT_IMAGES, 11)
        for data_format, output in (("channels_last", nhwc), ("channels_first", nchw)):
            assert output["smallest_relu_input"] > RELU_INPUT_MARGIN, (
                "a ReLU input in %s (%s) is within %g of 0, where the layouts may take its "
                "kink differently; choose another LAYOUT_WEIGHTS_SEED"
                % (data_format, mode, RELU_INPUT_MARGIN))
        np.testing.assert_allclose(nchw["logits"], nhwc["logits"], rtol=1e-4, atol=1e-4,
                                   err_msg=mode)
        np.testing.assert_allclose(nchw["gradient"], nhwc["gradient"], rtol=1e-4, atol=1e-5,
                                   err_msg=mode)


def test_training_mode_puts_moving_average_updates_in_update_ops():
    with tf.Graph().as_default():
        make_model(is_training=True).forward_pass(tf.zeros([2, 32, 32, 3]))
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    # ResNet-8: the stem and two per unit, three units; a mean and a variance each.
    assert len(update_ops) == 2 * (1 + 2 * 3)


def test_inference_mode_has_no_update_ops():
    with tf.Graph().as_default():
        make_model(is_training=False).forward_pass(tf.zeros([2, 32, 32, 3]))
        assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) == []


def test_channels_last_training_step_on_cpu_updates_weights_and_moving_statistics():
    graph = tf.Graph()
    with graph.as_default():
        logits = make_model(is_training=True).forward_pass(tf.constant(random_images(4)))
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels=tf.constant([0, 1, 2, 3]), logits=logits)
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
            train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        watched = [by_name[name] for name in ("conv2d/kernel", "BatchNorm/moving_mean",
                                              "BatchNorm/moving_variance", "dense/kernel")]
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(watched)
            loss_value, _ = session.run([loss, train_op])
            after = session.run(watched)
    assert np.isfinite(loss_value)
    for variable, old, new in zip(watched, before, after):
        assert not np.allclose(old, new), variable.op.name


def test_towers_share_variables_named_like_the_originals_checkpoints():
    with tf.Graph().as_default():
        for tower in range(2):
            with tf.compat.v1.variable_scope("resnet", reuse=bool(tower)), \
                    tf.name_scope("tower_%d" % tower):
                make_model().forward_pass(tf.zeros([2, 32, 32, 3]))
            if tower == 0:
                first_tower_variables = tf.compat.v1.global_variables()
        assert tf.compat.v1.global_variables() == first_tower_variables
        shapes = {v.op.name: tuple(v.shape) for v in first_tower_variables}
    assert shapes["resnet/conv2d/kernel"] == (3, 3, 3, 16)
    assert shapes["resnet/BatchNorm/gamma"] == (16,)
    assert shapes["resnet/BatchNorm_6/moving_variance"] == (64,)
    assert shapes["resnet/dense/kernel"] == (64, 11)


if __name__ == "__main__":
    _main(*sys.argv[1:])


@pytest.mark.parametrize("zero_init_residual", [False, True])
def test_zero_init_residual_starts_each_units_last_scale_at_zero_and_no_other(zero_init_residual):
    with tf.Graph().as_default():
        make_model(8, zero_init_residual=zero_init_residual).forward_pass(
            tf.constant(random_images(2)))
        gammas = [v for v in tf.compat.v1.global_variables() if v.op.name.endswith("/gamma")]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = {v.op.name: session.run(v) for v in gammas}
    # ResNet-8: the first convolution's batch norm, then 3 units of two batch norms each;
    # the second of each unit is the last before its addition.
    names = sorted(values, key=lambda name: int(name.rsplit("BatchNorm_", 1)[-1].split("/")[0])
                   if "BatchNorm_" in name else 0)
    assert len(names) == 7
    last_in_unit = set(names[2::2])
    for name in names:
        expected = 0.0 if zero_init_residual and name in last_in_unit else 1.0
        assert np.all(values[name] == expected), name
