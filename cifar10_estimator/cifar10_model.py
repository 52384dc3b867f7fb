"""ResNetCifar10: the CIFAR-10 ResNet of He et al. 2016 (section 4.2) from the blocks."""

import tensorflow as tf

from cifar10_estimator import model_base
from cifar10_estimator import cifar10
from cifar10_estimator.hparams import num_units_per_stage
# What ResNetCifar10.from_config takes, here with the network.
from cifar10_estimator.model_base import ModelConfig  # noqa: F401

# The tutorial's network has 11 outputs for CIFAR-10's 10 classes. That was a
# quirk, kept so checkpoints of the original (dense/kernel of shape [64, 11])
# load unchanged: the 11th logit is never a label, so softmax cross-entropy only
# ever pushes it down. Whatever reads classes off the logits goes through
# class_logits, which leaves it out.
ORIGINAL_NUM_CLASSES = 11

STAGE_FILTERS = (16, 32, 64)
STAGE_STRIDES = (1, 2, 2)
KERNEL_SIZE = 3
# The first convolution's kernel [3, 3, 3, 16] under the network's variable scope, named
# as the tutorial's checkpoints name it (--patch-pca-init gives it its starting value).
FIRST_CONV_KERNEL = "conv2d/kernel"


class ResNetCifar10(model_base.ResNet):
    """ResNet-(6n+2) for 32x32 images: a 3x3 conv, three stages of n basic units, a classifier."""

    def __init__(self, num_layers, is_training, batch_norm_decay, batch_norm_epsilon,
                 data_format="channels_first", num_classes=ORIGINAL_NUM_CLASSES,
                 zero_init_residual=False):
        """The tutorial's constructor; the trainer's is
        ResNetCifar10.from_config(ModelConfig, is_training, data_format).

        Args:
          num_layers: depth 6n + 2 with n >= 1 (20, 32, 44, 56 and 110 in the paper).
          is_training, batch_norm_decay, batch_norm_epsilon, data_format,
            zero_init_residual: see model_base.ResNet.
          num_classes: number of logits; the original's 11 by default (see
            ORIGINAL_NUM_CLASSES).

        Raises:
          ValueError: num_layers is not 6n + 2, or data_format is unknown.
        """
        self._set_up(ModelConfig(num_layers=num_layers, batch_norm_decay=batch_norm_decay,
                                 batch_norm_epsilon=batch_norm_epsilon,
                                 zero_init_residual=zero_init_residual),
                     is_training, data_format, num_classes)

    def _set_up(self, config, is_training, data_format, num_classes=ORIGINAL_NUM_CLASSES):
        super()._set_up(config, is_training, data_format)
        self.num_units_per_stage = num_units_per_stage(config.num_layers)
        self.num_classes = num_classes

    def forward_pass(self, x, input_data_format="channels_last"):
        """Logits [batch, num_classes] of the images x (float pixel values 0..255).

        Args:
          x: 4-D float tensor of images, laid out as input_data_format says.
          input_data_format: 'channels_last' (NHWC, what the data set yields) or
            'channels_first'; x is transposed when it differs from the model's.
        """
        if input_data_format not in model_base.DATA_FORMATS:
            raise ValueError("input_data_format must be 'channels_first' or 'channels_last', "
                             "got %r" % (input_data_format,))
        if input_data_format != self._data_format:
            to_model_order = [0, 3, 1, 2] if input_data_format == "channels_last" else [0, 2, 3, 1]
            x = tf.transpose(x, to_model_order)

        x = x / 128 - 1
        x = self._conv(x, KERNEL_SIZE, STAGE_FILTERS[0], 1)
        x = self._batch_norm(x)
        x = self._relu(x)

        in_filter = STAGE_FILTERS[0]
        for out_filter, stride in zip(STAGE_FILTERS, STAGE_STRIDES):
            with tf.name_scope("stage"):
                for unit in range(self.num_units_per_stage):
                    unit_stride = stride if unit == 0 else 1
                    x = self._residual_v1(x, KERNEL_SIZE, in_filter, out_filter, unit_stride)
                    in_filter = out_filter

        x = self._global_avg_pool(x)
        return self._fully_connected(x, self.num_classes)


def training_flops_per_example(num_layers, side):
    """FLOPs of training ResNet-num_layers on one side x side image, as TensorFlow's
    profiler counts the training graph (benchmarks/flops.py, which tests/test_compute.py
    checks this against): 2 a multiply-add, each convolution's forward pass and its two
    gradients, and the classifier's three matrix products.

    A gradient counts as TensorFlow's statistic counts it: the convolution's input pixels
    over its stride squared, times kernel x channels, so a strided convolution's (whose
    input model_base pads) a little more than its forward pass. The first convolution's
    input gradient counts too: the graph holds it, though no step runs it. Left out, as
    under 0.5 % (most on the smallest images): the element-wise ops (the shortcuts'
    additions and pooling, the loss); batch norm, ReLU and the update have no statistic
    there and count nothing either.
    """
    flops = 0
    for in_filter, out_filter, stride in _convolutions(num_layers):
        forward, gradient, side = _convolution_flops(side, in_filter, out_filter, stride)
        flops += forward + 2 * gradient
    return flops + 3 * 2 * STAGE_FILTERS[-1] * ORIGINAL_NUM_CLASSES


def num_layers_of(variable_shapes):
    """The depth of the ResNet whose variables `variable_shapes` ({name: shape}, e.g. a
    checkpoint's) are: its weight layers, each convolution and the classifier a kernel
    (VAR/kernel; their optimizer slots and averages are named VAR/kernel/...)."""
    return sum(1 for name, shape in variable_shapes.items()
               if name.rsplit("/", 1)[-1] == "kernel" and len(shape) in (2, 4))


def kernel_shapes(num_layers):
    """[height, width, in, out] of each convolution kernel of ResNet-num_layers."""
    return [(KERNEL_SIZE, KERNEL_SIZE, in_filter, out_filter)
            for in_filter, out_filter, _ in _convolutions(num_layers)]


def _convolutions(num_layers):
    """(input channels, output channels, stride) of each convolution, in order."""
    convolutions = [(cifar10.DEPTH, STAGE_FILTERS[0], 1)]
    in_filter = STAGE_FILTERS[0]
    for out_filter, stride in zip(STAGE_FILTERS, STAGE_STRIDES):
        for unit in range(num_units_per_stage(num_layers)):
            convolutions += [(in_filter, out_filter, stride if unit == 0 else 1),
                             (out_filter, out_filter, 1)]
            in_filter = out_filter
    return convolutions


def _convolution_flops(side, in_filter, out_filter, stride):
    """(forward FLOPs, each gradient's, the output's side) of a convolution of the network
    on a side x side input."""
    out_side = -(-side // stride)
    padded_side = side + KERNEL_SIZE - 1 if stride > 1 else side
    per_pixel = 2 * KERNEL_SIZE ** 2 * in_filter * out_filter
    return out_side ** 2 * per_pixel, padded_side ** 2 * per_pixel / stride ** 2, out_side


def class_logits(logits):
    """The logits [N, 10] of CIFAR-10's classes: the network's, without the original's 11th."""
    return logits[:, :cifar10.NUM_CLASSES]
