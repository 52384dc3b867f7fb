"""Where a training step's time goes, by op type, from TensorFlow's own step statistics.

    python -m tools.step_profile [--num-layers 20] [--precision bf16]
        [--batch-size 64] [--steps 20] [--recipe quick] [--image-size 16] [--convolutions]
        [--muon-learning-rate 0.06]

Builds the trainer's training graph (model_fn, one tower, a constant in-memory batch so
the input pipeline is out of the picture), runs warm-up steps, then traces `--steps`
steps with RunOptions.FULL_TRACE and sums each kernel's time by op type as the runtime
names it (oneDNN's rewritten kernels keep their own names, e.g. _MklNativeFusedBatchNormV3).
Ops run in parallel on the CPU's threads, so the table's shares are of the summed kernel
time, not of the step's wall time, which is printed beside it, with the median wall time
of the untraced warm-up steps' second half (tracing slows a step). Compare shares, and
time whole runs with the benchmark suite.

--convolutions adds a table of each convolution layer's kernels (the forward pass, the
gradient of its input, the gradient of its filters): their time a step, and the GFLOP/s
of the forward kernel and of the two gradients over the time they took together (they
run at once), from the layer's shapes as the traced step ran them, so a layer that runs
far below the others' rate stands out.

--recipe takes a recipe's update (its weight averages, momentum, smoothing, weight decay,
batch norm's shift rate), the depth, batch and precision staying this command's flags;
--image-size S trains on the images area-resized to S pixels, as a --low-resolution
phase of the trainer does; --muon-learning-rate R updates the kernels by Muon, as the
trainer's flag does (0, the default, leaves Muon out whatever the recipe's rate).
"""

import argparse
import collections
import dataclasses
import math
import re
import statistics
import time

from cifar10_estimator import flags as trainer_flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.markdown import markdown_table
from cifar10_estimator.cli.options import (non_negative_float, option, options_parser, parse,
                                           positive_int)
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.settings import recipes

IMAGE_SIDE = cifar10_facts.HEIGHT
# Steps the profiled graph trains for: more than any profile runs, so the rate schedule
# stays near its start and a low-resolution phase lasts throughout.
_PROFILED_RUN_STEPS = 1000000
_NUM_TRAIN_EXAMPLES = 45000


def image_side(text):
    """argparse type: a side the trainer can train at, --low-resolution's range or 32."""
    side = positive_int(text)
    if not job_hparams.MIN_LOW_RESOLUTION <= side <= IMAGE_SIDE:
        raise argparse.ArgumentTypeError("expected %d..%d pixels, got %r" % (
            job_hparams.MIN_LOW_RESOLUTION, IMAGE_SIDE, text))
    return side

# The op type in a step statistic's timeline label: "name = OpType(inputs)".
_TIMELINE_OP_TYPE = re.compile(r"=\s*([A-Za-z0-9_]+)\(")


@dataclasses.dataclass(frozen=True)
class StepProfileOptions:
    """The command line: the model, the step and how much of it to show."""

    num_layers: int = option(20, None, type=positive_int)
    precision: str = option("fp32", None, choices=("fp32", "bf16"))
    batch_size: int = option(64, None, type=positive_int)
    data_format: str = option("channels_last", "Layout inside the model.",
                              choices=("channels_last", "channels_first"))
    steps: int = option(20, "Traced steps, after as many untraced warm-up steps.",
                        type=positive_int)
    top: int = option(15, "Op types to list; the rest are summed in one row.",
                      type=positive_int)
    recipe: str = option("tutorial", "The recipe whose update the step makes (the "
                                         "depth, batch and precision are the flags above).",
                         choices=sorted(recipes.RECIPES))
    convolutions: bool = option(False, "Also list each convolution layer's forward, "
                                           "input-gradient and filter-gradient kernels "
                                           "and the GFLOP/s they achieve.",
                                action="store_true")
    image_size: int = option(IMAGE_SIDE, "Side of the trained images: below %d, a "
                                             "--low-resolution phase's." % IMAGE_SIDE,
                             type=image_side)
    muon_learning_rate: float = option(None, "The trainer's --muon-learning-rate: above "
                                                 "0, the step updates the kernels by Muon "
                                                 "(default: the recipe's).",
                                       type=non_negative_float, metavar="R")


def build_parser():
    return options_parser(
        StepProfileOptions,
        description="Trace training steps of the ResNet and print the kernel time by op "
                    "type, from TensorFlow's step statistics.")


def op_type_of(node_stats):
    """The op type a step statistic's node ran as, from its timeline label."""
    match = _TIMELINE_OP_TYPE.search(node_stats.timeline_label)
    return match.group(1) if match else node_stats.node_name.split(":")[0]


def kernel_micros_by_op_type(step_stats):
    """{op type: summed kernel microseconds} over every device of one traced step."""
    totals = collections.Counter()
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            if node.node_name in ("_SOURCE", "_SINK"):
                continue
            totals[op_type_of(node)] += node.all_end_rel_micros
    return totals


# A convolution's gradient kernels are named after the forward op they differentiate:
# "SCOPE/gradients/FORWARD_grad/Conv2DBackpropInput" (or ...Filter).
_CONVOLUTION_GRADIENT = re.compile(
    r"gradients/(?P<forward>.+)_grad/Conv2DBackprop(?P<direction>Input|Filter)$")
# The tower's scopes in front of a layer's name: "resnet/tower_0/".
_TOWER_SCOPE = re.compile(r"^.*?tower_\d+/")


@dataclasses.dataclass
class ConvolutionLayer:
    """One convolution of the step: its output's shape as it ran and, summed over the
    traced steps, the microseconds of its kernels ("forward", "input gradient", "filter
    gradient") and of "both gradients": from the first of its gradient kernels' starts to
    the last one's end in each step. The runtime runs the two gradients at once, each on a
    share of the cores, so each one's time alone overstates what the layer's backward
    pass costs."""

    output_shape: tuple = ()
    micros: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def add_convolution_kernels(step_stats, layers):
    """Add one traced step's convolution kernels to layers {forward op name:
    ConvolutionLayer}: forward ops by their op type, gradients by their names."""
    gradient_spans = {}
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            gradient = _CONVOLUTION_GRADIENT.search(node.node_name)
            if gradient:
                name = gradient.group("forward")
                layers.setdefault(name, ConvolutionLayer()).micros[
                    "%s gradient" % gradient.group("direction").lower()] += \
                    node.all_end_rel_micros
                first, last = gradient_spans.get(name, (node.all_start_micros, 0))
                gradient_spans[name] = (
                    min(first, node.all_start_micros),
                    max(last, node.all_start_micros + node.all_end_rel_micros))
            elif op_type_of(node).endswith("Conv2D"):
                layer = layers.setdefault(node.node_name, ConvolutionLayer())
                layer.micros["forward"] += node.all_end_rel_micros
                if node.output:
                    layer.output_shape = tuple(
                        dim.size for dim in node.output[0].tensor_description.shape.dim)
    for name, (first, last) in gradient_spans.items():
        layers[name].micros["both gradients"] += last - first


def convolution_flops(output_shape, kernel_shape):
    """Floating-point operations of one convolution (2 per multiply-add): each output
    element sums kernel height x width x input channels products. Each of its gradients
    does as many."""
    kernel_height, kernel_width, input_channels = kernel_shape[:3]
    return 2 * math.prod(output_shape) * kernel_height * kernel_width * input_channels


def _print_convolutions(graph, layers, steps):
    """The --convolutions table: a row per layer in graph order, then all layers'. Rates
    are of the forward kernel, and of both gradients over the time they took together."""
    order = {op.name: index for index, op in enumerate(graph.get_operations())}
    rows = []
    sums = collections.Counter()
    for name in sorted(layers, key=lambda name: order.get(name, len(order))):
        layer = layers[name]
        kernel_shape = graph.get_operation_by_name(name).inputs[1].shape.as_list()
        flops = convolution_flops(layer.output_shape, kernel_shape)
        gradient_flops = flops * sum(
            1 for direction in ("input gradient", "filter gradient") if layer.micros[direction])
        micros = {kind: layer.micros[kind] / steps for kind in (
            "forward", "input gradient", "filter gradient", "both gradients")}
        sums.update(micros)
        sums.update({"forward flops": flops, "gradient flops": gradient_flops})
        rows.append([_TOWER_SCOPE.sub("", name).rsplit("/", 1)[0],
                     "x".join(str(size) for size in layer.output_shape), "%.1f" % (flops / 1e6)]
                    + _timing_cells(micros, flops, gradient_flops))
    rows.append(["all", "", "%.1f" % (sums["forward flops"] / 1e6)] + _timing_cells(
        sums, sums["forward flops"], sums["gradient flops"]))
    print()
    print(markdown_table(
        ["convolution", "output", "MFLOP a kernel", "forward ms", "forward GFLOP/s",
         "input gradient ms", "filter gradient ms", "both gradients ms", "gradients GFLOP/s"],
        rows))


def _timing_cells(micros, forward_flops, gradient_flops):
    """The table's cells from "forward ms" on: milliseconds and GFLOP/s ("-": no kernel)."""
    def milliseconds(kind):
        return "%.2f" % (micros[kind] / 1000) if micros[kind] else "-"

    def rate(flops, kind):
        return "%.0f" % (flops / micros[kind] / 1000) if micros[kind] else "-"

    return [milliseconds("forward"), rate(forward_flops, "forward"),
            milliseconds("input gradient"), milliseconds("filter gradient"),
            milliseconds("both gradients"), rate(gradient_flops, "both gradients")]


def hparams_of(args):
    """The HParams of the profiled step, from the trainer's own parser: the recipe applied
    under this command's depth, batch, precision and Muon rate, a run far longer than the
    profile, and the one image phase asked for."""
    phase = ["--lower-resolution-epochs", "0", "--low-resolution-epochs", "0"]
    if args.image_size < IMAGE_SIDE:
        epochs = _PROFILED_RUN_STEPS // 2 // (_NUM_TRAIN_EXAMPLES // args.batch_size)
        phase[-1:] = [str(epochs), "--low-resolution", str(args.image_size)]
    settings = trainer_flags.parse(
        ["--job-dir", "unused", "--recipe", args.recipe, "--num-layers", str(args.num_layers),
         "--train-batch-size", str(args.batch_size), "--precision", args.precision,
         "--train-steps", str(_PROFILED_RUN_STEPS)] + phase
        + ([] if args.muon_learning_rate is None
           else ["--muon-learning-rate", str(args.muon_learning_rate)]))
    return dataclasses.replace(settings.hparams, num_train_examples=_NUM_TRAIN_EXAMPLES)


def update_text(recipe, muon_learning_rate):
    """How the step's update is named in the benchmarks' lines: "the quick recipe's update",
    with ", the kernels' by Muon at R" where R is above 0."""
    text = "the %s recipe's update" % recipe
    return text + (", the kernels' by Muon at %g" % muon_learning_rate
                   if muon_learning_rate else "")


def training_session(args):
    """(session, train_op) of one training step as StepProfileOptions `args` describe it,
    built in the default graph: the trainer's model_fn on a constant in-memory batch."""
    import tensorflow as tf  # lazy: keeps step_profile's --help and flag errors fast
    from cifar10_estimator import input_fn, model_fn
    hparams = hparams_of(args)
    layout = model_fn.TowerLayout.for_devices(0, data_format=args.data_format)
    # The Estimator makes it before model_fn; the resolution phases read it.
    tf.compat.v1.train.get_or_create_global_step()
    images, labels = input_fn.make_synthetic_input_fn(1, args.batch_size)()
    spec = model_fn.make_model_fn(layout, hparams)(
        images, labels, tf.estimator.ModeKeys.TRAIN, None)
    session = tf.compat.v1.Session()
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
    return session, spec.train_op


def main(argv):
    args = parse(build_parser(), StepProfileOptions, argv)
    quiet_tensorflow_logs("3", "ERROR")
    import tensorflow as tf  # lazy: keeps step_profile's --help and flag errors fast
    with tf.Graph().as_default():
        session, train_op = training_session(args)
        untraced_secs = []
        for _ in range(args.steps):
            start = time.perf_counter()
            session.run(train_op)
            untraced_secs.append(time.perf_counter() - start)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        totals, wall_secs, layers = collections.Counter(), [], {}
        for _ in range(args.steps):
            metadata = tf.compat.v1.RunMetadata()
            start = time.perf_counter()
            session.run(train_op, options=options, run_metadata=metadata)
            wall_secs.append(time.perf_counter() - start)
            totals.update(kernel_micros_by_op_type(metadata.step_stats))
            add_convolution_kernels(metadata.step_stats, layers)
        graph = session.graph
    summed = sum(totals.values())
    print("ResNet-%d, %s, %s, batch %d, %d pixels, %s: %d traced "
          "steps, median wall %.1f ms a step (untraced %.1f), kernel time summed over "
          "threads %.1f ms a step"
          % (args.num_layers, args.precision, args.data_format, args.batch_size,
             args.image_size, update_text(args.recipe, hparams_of(args).muon_learning_rate),
             args.steps,
             1000 * statistics.median(wall_secs),
             1000 * statistics.median(untraced_secs[len(untraced_secs) // 2:]),
             summed / 1000 / args.steps))
    ranked = totals.most_common()
    rows = [[op_type, "%.2f" % (micros / 1000 / args.steps), "%.1f %%" % (100 * micros / summed)]
            for op_type, micros in ranked[:args.top]]
    rest = sum(micros for _, micros in ranked[args.top:])
    if rest:
        rows.append(["(%d other op types)" % (len(ranked) - args.top),
                     "%.2f" % (rest / 1000 / args.steps), "%.1f %%" % (100 * rest / summed)])
    print(markdown_table(["op type", "ms a step", "share of kernel time"], rows))
    if args.convolutions:
        _print_convolutions(graph, layers, args.steps)


def console_main():
    raise SystemExit(run_command(main))


if __name__ == "__main__":
    console_main()
