"""Model FLOPs per example, counted from the graph by TensorFlow's profiler (float_operation).

The profiler sums the `flops` statistic TensorFlow registers per op type (convolutions,
their gradients, matmuls, element-wise arithmetic) over every op of a graph with fully
defined shapes. Op types without a registered statistic (batch norm and its gradient,
ReLU and its gradient, padding, the optimizer's apply ops) count zero; they are listed
so the count's scope is explicit. Both graphs hold variable initializers, a few
hundred thousand FLOPs in total, which is negligible after dividing by the batch.
"""

import tensorflow as tf
from tensorflow.python.framework import ops

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import cifar10_model
from cifar10_estimator import model_fn
from cifar10_estimator import cifar10

# Op types that do per-element work on activations but have no registered FLOPs.
_UNCOUNTED_COMPUTE_OP_TYPES = (
    "FusedBatchNormV3", "FusedBatchNormGradV3", "Relu", "ReluGrad", "Pad",
    "SparseSoftmaxCrossEntropyWithLogits", "ResourceApplyMomentum")


def _graph_flops(graph):
    options = tf.compat.v1.profiler.ProfileOptionBuilder(
        tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    ).with_empty_output().build()
    return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops


def _uncounted_op_types(graph):
    uncounted = set()
    for op in graph.get_operations():
        if op.type not in _UNCOUNTED_COMPUTE_OP_TYPES:
            continue
        try:
            statistic = ops.get_stats_for_node_def(graph, op.node_def, "flops")
        except ValueError:
            statistic = None
        if statistic is None or statistic.value is None:
            uncounted.add(op.type)
    return sorted(uncounted)


def _image_batch(batch_size, side):
    return tf.compat.v1.placeholder(tf.float32, [batch_size, side, side, cifar10.DEPTH])


def count_model_flops(num_layers, batch_size, data_format="channels_last",
                      image_side=cifar10.HEIGHT):
    """FLOPs per example of the ResNet's inference forward pass and of one training step,
    on images of image_side pixels a side.

    Returns:
      dict with forward_flops_per_example, train_step_flops_per_example (see
      count_training_step), trainable_parameters and uncounted_op_types.
    """
    with tf.Graph().as_default() as forward_graph:
        model = cifar10_model.ResNetCifar10.from_config(
            cifar10_model.ModelConfig(num_layers=num_layers), False, data_format)
        model.forward_pass(_image_batch(batch_size, image_side),
                           input_data_format="channels_last")
        forward_flops = _graph_flops(forward_graph)
    training_step = count_training_step(num_layers, batch_size, data_format, image_side)
    return {
        "num_layers": num_layers,
        "forward_flops_per_example": forward_flops / batch_size,
        **training_step,
    }


def count_training_step(num_layers, batch_size, data_format="channels_last",
                        image_side=cifar10.HEIGHT):
    """FLOPs per example of one training step on images of image_side pixels a side.

    The training step is the package's own model_fn graph (one tower): forward, loss with
    weight decay, gradients, momentum update, summaries. The trainer counts its runs'
    compute from the network's shapes instead (cifar10_model.training_flops_per_example),
    which a test checks against this count.

    Returns:
      dict with train_step_flops_per_example, trainable_parameters and uncounted_op_types.
    """
    with tf.Graph().as_default() as train_graph:
        hparams = job_hparams.HParams(num_layers=num_layers, train_batch_size=batch_size)
        build_model = model_fn.make_model_fn(
            model_fn.TowerLayout.for_devices(0, data_format=data_format), hparams)
        labels = tf.compat.v1.placeholder(tf.int32, [batch_size])
        build_model([_image_batch(batch_size, image_side)], [labels],
                    tf.estimator.ModeKeys.TRAIN, None)
        trainable_parameters = sum(variable.shape.num_elements()
                                   for variable in tf.compat.v1.trainable_variables())
        return {
            "train_step_flops_per_example": _graph_flops(train_graph) / batch_size,
            "trainable_parameters": trainable_parameters,
            "uncounted_op_types": _uncounted_op_types(train_graph),
        }
