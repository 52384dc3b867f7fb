"""How fast the trainer's evaluation runs in float32 and in the training precision.

    python -m cifar10_estimator.benchmarks.evaluation --job-dir JOB --data-dir DATA
        [--subset validation] [--rounds 2] [--batch-size 500]

Evaluates the latest checkpoint of a job that trained in a mixed precision (bf16 on the
CPU) with the trainer's own evaluation graph, as hparams.json describes it (its depth,
averaged weights and test-time views), once in float32 (the default) and once in the
training precision (--eval-in-training-precision), the two taking turns for --rounds
rounds, the one first in a round alternating (alternating_rounds). Each turn is one whole
evaluation of the subset: graph, restore and every batch. It prints each turn's time and
accuracy, float32's first in each round, and the speed ratio of each round.
"""

import dataclasses
import statistics
import time

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import option, options_parser, parse, positive_int
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.errors import UsageError
from cifar10_estimator.machine import alternating_rounds
from cifar10_estimator.serving import evaluate
from cifar10_estimator.serving import options as shared
from cifar10_estimator.settings import precision


@dataclasses.dataclass(frozen=True)
class EvaluationBenchmarkOptions:
    """The command line: the job, its data, and how much to time."""

    job_dir: str = shared.job_dir(required=True)
    data_dir: str = shared.data_dir(required=True)
    subset: str = option("validation", "Which examples to evaluate.",
                         choices=["eval", "validation"])
    rounds: int = option(2, "Turns of each precision.", type=positive_int)
    batch_size: int = option(
        500, "Examples per batch (the budget recipe's --eval-batch-size).",
        type=positive_int)


def build_parser():
    return options_parser(
        EvaluationBenchmarkOptions,
        description="Time the trainer's evaluation of a checkpoint in float32 and in the "
                    "precision it trained in, taking turns.")


def _evaluation_ways(hparams):
    """[(name, hparams)]: float32, then the training precision."""
    if not precision.policy(hparams.precision).is_mixed:
        raise UsageError("the job trained in %s, so its evaluation is float32 either way; "
                         "pass a job trained with --precision bf16 (or auto where it took "
                         "bf16)" % hparams.precision)
    return [("float32", dataclasses.replace(hparams, eval_in_training_precision=False)),
            (hparams.precision, dataclasses.replace(hparams, eval_in_training_precision=True))]


def main(argv):
    args = parse(build_parser(), EvaluationBenchmarkOptions, argv)
    quiet_tensorflow_logs("3", "ERROR")
    hparams = job_hparams.load(args.job_dir)
    ways = _evaluation_ways(hparams)
    checkpoint = evaluate.resolve_checkpoint(args.job_dir)
    views = (1 + 4 * bool(hparams.eval_shifts)) * (1 + hparams.eval_flips)
    print("%s, ResNet-%d, %d views an image, subset %s, batch %d"
          % (checkpoint, hparams.num_layers, views, args.subset, args.batch_size))

    def evaluation(way):
        def timed():
            start = time.perf_counter()
            predicted, labels = evaluate.predict_subset(
                checkpoint, way, args.data_dir, args.subset, args.batch_size,
                evaluation_graph=True)
            return time.perf_counter() - start, predicted, labels
        return timed

    def report_round(round_index, measured):
        for name, (seconds, predicted, labels) in measured.items():
            print("round %d: %-7s %7.2f s, %5.0f images/sec, accuracy %.4f (%d/%d)"
                  % (round_index + 1, name, seconds, len(labels) / seconds,
                     (predicted == labels).mean(), (predicted == labels).sum(), len(labels)))

    results = alternating_rounds.measure({name: evaluation(way) for name, way in ways},
                                         args.rounds, report_round=report_round)
    float32, mixed = (results[name].figures(lambda turn: turn[0]) for name, _ in ways)
    ratios = [float32_seconds / mixed_seconds
              for float32_seconds, mixed_seconds in zip(float32, mixed)]
    print("%s evaluation at %.2fx the speed of float32 (median of %d rounds: %s)"
          % (ways[1][0], statistics.median(ratios), len(ratios),
             ", ".join("%.2f" % ratio for ratio in ratios)))


def console_main():
    raise SystemExit(run_command(main))


if __name__ == "__main__":
    console_main()
