"""What a user would pick instead: the same ResNet trained with Keras `model.fit` (TF2).

`keras_resnet` mirrors cifar10_model.ResNetCifar10 layer for layer (3x3 conv, three
stages of conv-bn-relu-conv-bn units with option-A shortcuts, global average pooling,
a dense layer with the original's 11 outputs), so its trainable parameters equal ours.
The loss is the same: sparse cross entropy plus weight_decay x sum of l2_loss over all
trainable variables, minimised by SGD with momentum on the same piecewise-constant
learning rate. The data are the same too: Cifar10DataSet's tf.data batches, read from
the same TFRecords with the same augmentation. Run as a child process of the benchmark
(which mutes TensorFlow's C++ INFO lines in its environment), so eager Keras never shares
a process with the graph-mode Estimator:

    python -m cifar10_estimator.benchmarks.keras_peer --data-dir DIR --num-layers 20 \
        --batch-size 128 --steps 130

Every 10 steps it prints the trainer's ExamplesPerSecondHook line, so both are timed
by the same parser (benchmark_training); at the end one line `BENCHMARK_RESULT {json}`
with the trainable parameter count. `--precision bf16` trains under Keras's
`mixed_bfloat16` policy (float32 variables, bfloat16 computation), the counterpart of
the trainer's --precision bf16.
"""

import argparse
import dataclasses
import json
import sys
import time

import numpy as np
import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator import cifar10_model
from cifar10_estimator.cli.options import add_options, option, option_fields, parse
from cifar10_estimator.hparams import DEFAULTS, HParams
from cifar10_estimator.settings import schedule as run_schedule

RESULT_PREFIX = "BENCHMARK_RESULT "
# The trainer's --precision values Keras has a policy for.
KERAS_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}


def keras_resnet(num_layers, batch_norm_decay=DEFAULTS.batch_norm_decay,
                 batch_norm_epsilon=DEFAULTS.batch_norm_epsilon):
    """A Keras functional ResNet-(6n+2) equal to ResNetCifar10 in channels_last.

    Raises:
      ValueError: num_layers is not 6n + 2.
    """
    layers = tf.keras.layers
    num_units = cifar10_model.num_units_per_stage(num_layers)
    def conv(x, filters, stride):
        padding = "same"
        if stride > 1:  # explicit symmetric padding, as model_base._conv
            x = layers.ZeroPadding2D(1)(x)
            padding = "valid"
        return layers.Conv2D(filters, 3, stride, padding=padding, use_bias=False,
                             kernel_initializer=tf.keras.initializers.VarianceScaling(
                                 scale=2.0, mode="fan_in", distribution="truncated_normal"))(x)

    def batch_norm(x):
        return layers.BatchNormalization(momentum=batch_norm_decay, epsilon=batch_norm_epsilon)(x)

    def option_a_shortcut(x, in_filter, out_filter, stride):
        if stride != 1:
            x = layers.AveragePooling2D(stride, stride, padding="same")(x)
        if out_filter != in_filter:
            pad_begin = (out_filter - in_filter) // 2
            pad_end = out_filter - in_filter - pad_begin
            x = layers.Lambda(lambda t: tf.pad(t, [[0, 0], [0, 0], [0, 0],
                                                   [pad_begin, pad_end]]))(x)
        return x

    images = tf.keras.Input([32, 32, 3])
    x = layers.Rescaling(1.0 / 128, offset=-1.0)(images)
    x = layers.ReLU()(batch_norm(conv(x, cifar10_model.STAGE_FILTERS[0], 1)))
    in_filter = cifar10_model.STAGE_FILTERS[0]
    for out_filter, stage_stride in zip(cifar10_model.STAGE_FILTERS, cifar10_model.STAGE_STRIDES):
        for unit in range(num_units):
            stride = stage_stride if unit == 0 else 1
            shortcut = option_a_shortcut(x, in_filter, out_filter, stride)
            y = layers.ReLU()(batch_norm(conv(x, out_filter, stride)))
            y = batch_norm(conv(y, out_filter, 1))
            x = layers.ReLU()(layers.Add()([y, shortcut]))
            in_filter = out_filter
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(cifar10_model.ORIGINAL_NUM_CLASSES)(x)
    # float32 logits under a mixed policy, as the trainer's towers return them.
    logits = layers.Activation("linear", dtype="float32")(logits)
    return tf.keras.Model(images, logits, name="resnet%d" % num_layers)


def _class_accuracy(labels, logits):
    """Accuracy over CIFAR-10's 10 classes, as the Estimator counts it."""
    return tf.keras.metrics.sparse_categorical_accuracy(labels, cifar10_model.class_logits(logits))


def compile_like_the_estimator(model, weight_decay, momentum, learning_rate, batch_size,
                               num_train_examples):
    """Compile with the Estimator's loss, weight decay, optimizer and learning-rate schedule."""
    model.add_loss(lambda: weight_decay * tf.add_n(
        [tf.nn.l2_loss(variable) for variable in model.trainable_weights]))
    boundaries, factors = run_schedule.drops(HParams(
        learning_rate=learning_rate, train_batch_size=batch_size,
        num_train_examples=num_train_examples))
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay(
        boundaries, [learning_rate * factor for factor in factors])
    model.compile(
        optimizer=tf.keras.optimizers.SGD(schedule, momentum=momentum),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[_class_accuracy])


def _throughput_logger(batch_size, every_n_steps):
    class ThroughputLogger(tf.keras.callbacks.Callback):
        """Prints ExamplesPerSecondHook's line every every_n_steps batches.

        As the hook does, the clock starts at the end of the first batch and the step
        count (S) counts the batches since then.
        """

        def __init__(self):
            super().__init__()
            self._start = self._last = None
            self._steps = 0

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self._start is None:
                self._start = self._last = now
                return
            self._steps += 1
            if self._steps % every_n_steps == 0:
                print("Average examples/sec: %g (%g), step = %d" % (
                    batch_size * self._steps / (now - self._start),
                    batch_size * every_n_steps / (now - self._last), self._steps), flush=True)
                self._last = now

    return ThroughputLogger()


def train_with_fit(data_dir, num_layers, batch_size, num_steps, log_every_n_steps=10,
                   weight_decay=DEFAULTS.weight_decay, momentum=DEFAULTS.momentum,
                   learning_rate=DEFAULTS.learning_rate, precision="fp32"):
    """Train num_steps batches with model.fit, logging throughput like the trainer's hook.

    precision: a key of KERAS_POLICIES, the Keras dtype policy the model is built under.

    Returns:
      dict with trainable_parameters, input and tensorflow_version.
    """
    data_set = cifar10.Cifar10DataSet(data_dir, "train", use_distortion=True)
    tf.keras.mixed_precision.set_global_policy(KERAS_POLICIES[precision])
    model = keras_resnet(num_layers)
    compile_like_the_estimator(model, weight_decay, momentum, learning_rate, batch_size,
                               data_set.num_examples_per_epoch())
    model.fit(data_set.make_dataset(batch_size), epochs=1, steps_per_epoch=num_steps,
              callbacks=[_throughput_logger(batch_size, log_every_n_steps)], verbose=0)
    return {
        "trainable_parameters": int(sum(np.prod(weight.shape)
                                        for weight in model.trainable_weights)),
        "input": "Cifar10DataSet tf.data from the TFRecords",
        "keras_policy": KERAS_POLICIES[precision],
        "tensorflow_version": tf.__version__,
    }


@dataclasses.dataclass(frozen=True)
class KerasPeerOptions:
    """The command line the benchmark gives this child process."""

    data_dir: str = option(None, None, required=True)
    num_layers: int = option(20, None, type=int)
    batch_size: int = option(128, None, type=int)
    steps: int = option(130, None, type=int)
    precision: str = option("fp32", None, choices=sorted(KERAS_POLICIES))


def build_parser():
    # argparse's own parser: a child process of the benchmark exits on a bad flag.
    parser = argparse.ArgumentParser(
        description="Steady-state examples/sec of the ResNet under Keras model.fit.")
    add_options(parser, option_fields(KerasPeerOptions))
    return parser


def main(argv):
    args = parse(build_parser(), KerasPeerOptions, argv)
    result = train_with_fit(args.data_dir, args.num_layers, args.batch_size, args.steps,
                            precision=args.precision)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
