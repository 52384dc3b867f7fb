"""Where a training step's time goes, by op type, from TensorFlow's own step statistics.

    python -m cifar10_estimator.benchmarks.step_profile [--num-layers 20] [--precision bf16]
        [--batch-size 64] [--steps 20]

Builds the trainer's training graph (model_fn, one tower, a constant in-memory batch so
the input pipeline is out of the picture), runs warm-up steps, then traces `--steps`
steps with RunOptions.FULL_TRACE and sums each kernel's time by op type as the runtime
names it (oneDNN's rewritten kernels keep their own names, e.g. _MklNativeFusedBatchNormV3).
Ops run in parallel on the CPU's threads, so the table's shares are of the summed kernel
time, not of the step's wall time, which is printed beside it. Tracing slows a step a
little; compare shares, and time whole runs with the benchmark suite.
"""

import collections
import dataclasses
import re
import statistics
import time

from cifar10_estimator import cli

# The op type in a step statistic's timeline label: "name = OpType(inputs)".
_TIMELINE_OP_TYPE = re.compile(r"=\s*([A-Za-z0-9_]+)\(")


@dataclasses.dataclass(frozen=True)
class StepProfileOptions:
    """The command line: the model, the step and how much of it to show."""

    num_layers: int = cli.option(20, None, type=cli.positive_int)
    precision: str = cli.option("fp32", None, choices=("fp32", "bf16"))
    batch_size: int = cli.option(64, None, type=cli.positive_int)
    data_format: str = cli.option("channels_last", "Layout inside the model.",
                                  choices=("channels_last", "channels_first"))
    steps: int = cli.option(20, "Traced steps, after as many untraced warm-up steps.",
                            type=cli.positive_int)
    top: int = cli.option(15, "Op types to list; the rest are summed in one row.",
                          type=cli.positive_int)


def build_parser():
    parser = cli.ArgumentParser(
        description="Trace training steps of the ResNet and print the kernel time by op "
                    "type, from TensorFlow's step statistics.")
    cli.add_options(parser, cli.option_fields(StepProfileOptions))
    return parser


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


def _training_session(args):
    import tensorflow as tf  # lazy: keeps step_profile's --help and flag errors fast
    from cifar10_estimator import hparams as job_hparams
    from cifar10_estimator import input_fn, model_fn
    hparams = job_hparams.HParams(
        num_layers=args.num_layers, train_batch_size=args.batch_size, precision=args.precision,
        train_steps=1000000, num_train_examples=45000)
    layout = model_fn.TowerLayout.for_devices(0, data_format=args.data_format)
    images, labels = input_fn.make_synthetic_input_fn(1, args.batch_size)()
    spec = model_fn.make_model_fn(layout, hparams)(
        images, labels, tf.estimator.ModeKeys.TRAIN, None)
    session = tf.compat.v1.Session()
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
    return session, spec.train_op


def main(argv):
    args = cli.parse(build_parser(), StepProfileOptions, argv)
    cli.quiet_tensorflow_logs("3", "ERROR")
    import tensorflow as tf  # lazy: keeps step_profile's --help and flag errors fast
    with tf.Graph().as_default():
        session, train_op = _training_session(args)
        for _ in range(args.steps):
            session.run(train_op)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        totals, wall_secs = collections.Counter(), []
        for _ in range(args.steps):
            metadata = tf.compat.v1.RunMetadata()
            start = time.perf_counter()
            session.run(train_op, options=options, run_metadata=metadata)
            wall_secs.append(time.perf_counter() - start)
            totals.update(kernel_micros_by_op_type(metadata.step_stats))
    summed = sum(totals.values())
    print("ResNet-%d, %s, %s, batch %d: %d traced steps, median wall %.1f ms a step, "
          "kernel time summed over threads %.1f ms a step"
          % (args.num_layers, args.precision, args.data_format, args.batch_size, args.steps,
             1000 * statistics.median(wall_secs), summed / 1000 / args.steps))
    print("| op type | ms a step | share of kernel time |")
    print("|---|---|---|")
    ranked = totals.most_common()
    for op_type, micros in ranked[:args.top]:
        print("| %s | %.2f | %.1f %% |" % (op_type, micros / 1000 / args.steps,
                                          100 * micros / summed))
    rest = sum(micros for _, micros in ranked[args.top:])
    if rest:
        print("| (%d other op types) | %.2f | %.1f %% |" % (
            len(ranked) - args.top, rest / 1000 / args.steps, 100 * rest / summed))


def console_main():
    raise SystemExit(cli.run_command(main))


if __name__ == "__main__":
    console_main()
