"""How much of the CPU's peak a training step reaches, per image size and batch size.

    python -m tools.step_rates [--num-layers 14] [--precision fp32]
        [--recipe sprint] [--image-sizes 16 24 32] [--batch-sizes 64 128] [--steps 20]
        [--rounds 3] [--muon-learning-rates 0 0.06]

Builds one training step per (image size, batch size) as step_profile builds it (the
trainer's model_fn, one tower, a constant in-memory batch, the recipe's update), all in one
process, warms each up, then times `--steps` untraced steps of each in alternating rounds
(machine/alternating_rounds), so the machine's load and clock drift fall on all alike.
Each row: the median over the rounds of a step's wall time, the examples a second, the
GFLOP/s that makes with the trainer's count of a training example's FLOPs at that size
(cifar10_model.training_flops_per_example, the figure the trainer's summary uses) and its
share of the CPU's peak in the step's compute precision (machine/cpu_peak, the clock
named). The rounds' spread is printed beside each: read a difference smaller than it as
none. --muon-learning-rates times each size's step with the kernels updated by Muon at
each rate (0: without Muon, whatever the recipe's rate), its orthogonalisations counted
in the FLOPs as the trainer counts them (compute_accounting.update_flops_per_example).
"""

import dataclasses
import statistics
import time

from cifar10_estimator import cifar10_model
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.markdown import markdown_table
from cifar10_estimator.cli.options import (non_negative_float, option, options_parser, parse,
                                           positive_int)
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.machine import alternating_rounds
from cifar10_estimator.settings import precision as precisions
from cifar10_estimator.settings import recipes

from tools import step_profile


@dataclasses.dataclass(frozen=True)
class StepRatesOptions:
    """The command line: the step, the sizes to compare and how long to time each."""

    num_layers: int = option(14, None, type=positive_int)
    precision: str = option("fp32", None, choices=("fp32", "bf16"))
    recipe: str = option("sprint", "The recipe whose update the steps make.",
                         choices=sorted(recipes.RECIPES))
    image_sizes: list = option([16, 24, 32], "Sides of the trained images.", nargs="+",
                               type=step_profile.image_side, metavar="SIDE")
    batch_sizes: list = option([64, 128], None, nargs="+", type=positive_int,
                               metavar="BATCH")
    steps: int = option(20, "Timed steps of each size a round, after as many "
                                "warm-up steps.", type=positive_int)
    rounds: int = option(3, "Rounds; each times every size once.",
                         type=positive_int)
    muon_learning_rates: list = option([None], "Muon rates to time each step with, as "
                                                   "the trainer's --muon-learning-rate (0: "
                                                   "without; default: the recipe's).", nargs="+",
                                       type=non_negative_float, metavar="R")


def build_parser():
    return options_parser(
        StepRatesOptions,
        description="Time training steps at several image and batch sizes in alternating "
                    "rounds and print their GFLOP/s and share of the CPU's peak.")


def _timed_steps(session, train_op, steps):
    """A function timing `steps` steps: it returns the seconds they took."""
    def time_them():
        start = time.perf_counter()
        for _ in range(steps):
            session.run(train_op)
        return time.perf_counter() - start
    return time_them


def _profiles(args):
    """[StepProfileOptions] of each step to time: every size, batch and Muon rate."""
    return [step_profile.StepProfileOptions(
                num_layers=args.num_layers, precision=args.precision, batch_size=batch_size,
                recipe=args.recipe, image_size=side, muon_learning_rate=rate)
            for side in args.image_sizes for batch_size in args.batch_sizes
            for rate in args.muon_learning_rates]


def _contenders(args):
    """{StepProfileOptions: timing function}, each step built in its own graph and warmed
    up."""
    import tensorflow as tf  # lazy: keeps --help and flag errors fast
    contenders = {}
    for profile in _profiles(args):
        with tf.Graph().as_default():
            session, train_op = step_profile.training_session(profile)
        timing = _timed_steps(session, train_op, args.steps)
        timing()
        contenders[profile] = timing
    return contenders


def rows(args, results, peak_gflops):
    """The table's rows from {StepProfileOptions: Contender of seconds a round}."""
    from cifar10_estimator import compute_accounting  # lazy: it loads TensorFlow
    table = []
    for profile, contender in results.items():
        side, batch_size = profile.image_size, profile.batch_size
        examples_per_sec = [args.steps * batch_size / secs for secs in contender.measurements]
        hparams = step_profile.hparams_of(profile)
        muon_rate = hparams.muon_learning_rate
        flops = (cifar10_model.training_flops_per_example(args.num_layers, side)
                 + compute_accounting.update_flops_per_example(hparams))
        gflops = statistics.median(examples_per_sec) * flops / 1e9
        table.append([
            side, batch_size, "%g" % muon_rate if muon_rate else "-",
            "%.1f" % (1000 * contender.median() / args.steps),
            "%.0f (%.0f-%.0f)" % (statistics.median(examples_per_sec), min(examples_per_sec),
                                  max(examples_per_sec)),
            "%.1f" % (flops / 1e6), "%.0f" % gflops,
            "%.0f %%" % (100 * gflops / peak_gflops) if peak_gflops else "-"])
    return table


def main(argv):
    args = parse(build_parser(), StepRatesOptions, argv)
    quiet_tensorflow_logs("3", "ERROR")
    from cifar10_estimator.benchmarks import host  # lazy: it loads TensorFlow
    compute_dtype = precisions.policy(args.precision).compute_dtype
    machine = host.describe_machine()
    peak_gflops = machine["%s_peak_gflops" % args.precision]
    print("%s; peak %s GFLOP/s in %s: %s" % (
        host.cpu_identity(machine), "%.0f" % peak_gflops if peak_gflops else "unknown",
        compute_dtype, machine["%s_peak_derivation" % args.precision]))
    print("ResNet-%d, %s, the %s recipe's update; %d rounds of %d steps a size, alternated"
          % (args.num_layers, args.precision, args.recipe, args.rounds, args.steps))
    results = alternating_rounds.measure(_contenders(args), args.rounds)
    print(markdown_table(
        ["image side", "batch", "Muon rate", "ms a step", "examples/sec (rounds' range)",
         "MFLOP an example", "GFLOP/s", "share of peak"],
        rows(args, results, peak_gflops)))


def console_main():
    raise SystemExit(run_command(main))


if __name__ == "__main__":
    console_main()
