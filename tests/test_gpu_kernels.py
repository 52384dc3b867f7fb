"""Every op a GPU tower runs has a GPU kernel: checked without a GPU.

TensorFlow 2.15's Linux wheel registers its CUDA kernels whether or not the machine has a
GPU, so the training and evaluation graphs of a two-GPU run can be built here and each op
placed on a GPU looked up in that registry for its types. An op with no GPU kernel would
be moved to the CPU by soft placement on a GPU box, silently, with a copy each way per
tower per step.
"""

import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

from cifar10_estimator import flags
from cifar10_estimator import input_fn
from cifar10_estimator import model_fn
from cifar10_estimator.settings import recipes

NUM_GPUS = 2
BATCH_SIZE = 4
# A kernel registered for DEFAULT serves any device (int32 ops kept in host memory).
KERNEL_DEVICES = ("GPU", "DEFAULT")


def _kernels(op_type, cache={}):
    if op_type not in cache:
        cache[op_type] = [kernel for kernel in
                          kernels.get_registered_kernels_for_op(op_type).kernel
                          if kernel.device_type in KERNEL_DEVICES]
    return cache[op_type]


def _attr_types(node, name):
    """The dtype enums the attr `name` of a NodeDef holds (one, or a list's)."""
    value = node.attr[name]
    return list(value.list.type) if value.HasField("list") else [value.type]


def _kernel_serves(kernel, node):
    return all(set(_attr_types(node, constraint.name)) <= set(constraint.allowed_values.list.type)
               for constraint in kernel.constraint)


def _describe(node):
    types = sorted("%s=%s" % (attr, tf.as_dtype(node.attr[attr].type).name)
                   for attr in ("T", "dtype", "SrcT", "DstT")
                   if attr in node.attr and node.attr[attr].type)
    return "%s(%s) %s" % (node.op, ", ".join(types), node.name)


def _on_gpu(device, default):
    return tf.DeviceSpec.from_string(device or default).device_type == "GPU"


def _called_functions(node):
    """The names of the functions `node` runs (tf.cond's and tf.while_loop's branches)."""
    return [value.func.name for value in node.attr.values() if value.HasField("func")]


def _nodes_without_gpu_kernel(nodes, default_device, library, seen):
    missing = []
    for node in nodes:
        if not _on_gpu(node.device, default_device):
            continue
        if not any(_kernel_serves(kernel, node) for kernel in _kernels(node.op)):
            missing.append(_describe(node))
        for name in _called_functions(node):
            if name in library and name not in seen:
                seen.add(name)
                # A function's ops run on its caller's device unless placed otherwise.
                missing += _nodes_without_gpu_kernel(
                    library[name].node_def, node.device or default_device, library, seen)
    return missing


def ops_without_gpu_kernel(graph):
    """The ops of `graph` placed on a GPU, those of the functions they call included,
    that no GPU kernel serves, described."""
    graph_def = graph.as_graph_def()
    library = {function.signature.name: function for function in graph_def.library.function}
    return sorted(_nodes_without_gpu_kernel(graph_def.node, "", library, set()))


def run_graph(mode, argv, variable_strategy="CPU", data_format=None):
    """The graph of the real model_fn in `mode` for the trainer flags `argv` on two GPUs."""
    hparams = flags.parse(argv + ["--num-gpus", str(NUM_GPUS), "--job-dir", "unused"]).hparams
    layout = model_fn.TowerLayout.for_devices(
        NUM_GPUS, variable_strategy=variable_strategy, data_format=data_format)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with tf.device("/cpu:0"):
            images = tf.random.uniform([BATCH_SIZE, 32, 32, 3], maxval=255.0)
            labels = tf.random.uniform([BATCH_SIZE], maxval=10, dtype=tf.int32)
            indices = tf.range(BATCH_SIZE, dtype=tf.int64)
            image_shards, label_shards = input_fn.split_batch_into_towers(
                images, labels, NUM_GPUS)
            if mode == tf.estimator.ModeKeys.TRAIN and hparams.skip_learned:
                image_shards = [{"images": shard, "example_indices": index_shard}
                                for shard, index_shard in
                                zip(image_shards, tf.split(indices, NUM_GPUS))]
        model_fn.make_model_fn(layout, hparams)(image_shards, label_shards, mode, None)
    return graph


# The network's depth repeats the same ops: ResNet-8 keeps the graphs small.
SMALL = ["--num-layers", "8", "--train-batch-size", str(BATCH_SIZE)]
MODES = [tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", sorted(recipes.RECIPES))
def test_every_recipes_tower_ops_have_gpu_kernels(recipe, mode):
    graph = run_graph(mode, ["--recipe", recipe, "--precision", "fp32"] + SMALL)
    assert ops_without_gpu_kernel(graph) == []


# The sprint recipe updates its kernels by Muon; "fp16 without muon" keeps the momentum
# optimizer's own update of them under the loss scale covered.
OPTIONS = {
    "fp16": ["--recipe", "sprint", "--precision", "fp16"],
    "bf16": ["--recipe", "sprint", "--precision", "bf16"],
    "fp16 without muon": ["--recipe", "sprint", "--precision", "fp16", "--muon-learning-rate",
                          "0"],
    "skipped examples": ["--recipe", "quick", "--precision", "fp32", "--skip-learned", "0.2"],
    "lookahead": ["--precision", "fp32", "--lookahead-steps", "5"],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_option_that_changes_a_towers_ops_keeps_gpu_kernels(option, mode):
    graph = run_graph(mode, OPTIONS[option] + SMALL)
    assert ops_without_gpu_kernel(graph) == []


@pytest.mark.parametrize("data_format", ["channels_first", "channels_last"])
@pytest.mark.parametrize("variable_strategy", ["CPU", "GPU"])
def test_both_layouts_and_variable_strategies_keep_gpu_kernels(variable_strategy, data_format):
    for mode in MODES:
        graph = run_graph(mode, ["--recipe", "sprint", "--precision", "fp16"] + SMALL,
                          variable_strategy, data_format)
        assert ops_without_gpu_kernel(graph) == []


def test_the_check_finds_an_op_without_a_gpu_kernel():
    graph = tf.Graph()
    with graph.as_default(), tf.device("/gpu:0"):
        images = tf.zeros([1, 32, 32, 3])
        tf.image.resize(images, [24, 24], method="area")
        tf.image.resize(images, [24, 24], method="bilinear")
    missing = ops_without_gpu_kernel(graph)
    assert len(missing) == 1 and missing[0].startswith("ResizeArea(T=float32)"), missing
