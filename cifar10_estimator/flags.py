"""The trainer's flags: the parser, every check of them, and the values derived from them.

    python -m cifar10_estimator.main --data-dir DATA --job-dir JOB --num-gpus 0

Flags keep the original tutorial's names and defaults; the hyper-parameters take theirs
from hparams.DEFAULTS. The trainer (main) and the local cluster launcher both parse and
check with this module, which imports no TensorFlow: the checks that need it (the GPUs,
oneDNN, the depth) load it themselves, so a malformed flag fails at once.
"""

import argparse

from cifar10_estimator import cifar10
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.training import precision
from cifar10_estimator.training import recipes
from cifar10_estimator import report
from cifar10_estimator.training import schedule
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator import cli
from cifar10_estimator.cli import (ArgumentParser, between_zero_and_one, non_negative_float,
                                   non_negative_int, parse_bool, positive_float, positive_int)
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError

DEFAULTS = job_hparams.DEFAULTS
# --eval-shifts: the furthest test-time shift, in pixels, of a 32x32 image.
MAX_EVAL_SHIFT = 8


class _HParamFlags:
    """Adds flags to an argument group, recording those that are HParams fields."""

    def __init__(self, parser):
        self.destinations = []
        parser.hparam_destinations = self.destinations

    def add(self, group, *names, **kwargs):
        action = group.add_argument(*names, **kwargs)
        self.destinations.append(action.dest)
        return action


def build_parser():
    """The trainer's ArgumentParser; its `hparam_destinations` lists the HParams flags."""
    parser = ArgumentParser(
        description="Train a ResNet on CIFAR-10 with tf.estimator.train_and_evaluate: "
                    "one tower per GPU (or per logical CPU device), gradients averaged.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hparam = _HParamFlags(parser).add
    hparam(parser, "--recipe", choices=sorted(recipes.RECIPES), default=DEFAULTS.recipe,
           help="A named set of the flags below; flags given on the command line override "
                "it. %s" % "; ".join("%s: %s" % (name, recipes.as_flags(name) or
                                               "the tutorial's defaults")
                                     for name in recipes.RECIPES))
    data = parser.add_argument_group("data and output")
    data.add_argument("--data-dir", help="Directory with train/eval TFRecords written by "
                      "python -m cifar10_estimator.generate_tfrecords. "
                      "Not needed with --use-synthetic-data.")
    data.add_argument("--job-dir", required=True,
                      help="Directory for checkpoints, TensorBoard events and eval results "
                           "(job-dir/eval). Rerunning with the same job-dir resumes.")
    data.add_argument("--use-synthetic-data", action="store_true",
                      help="Train on one constant random batch held in memory instead of "
                           "TFRecords: no data files, no decoding; the throughput ceiling. "
                           "Evaluation then runs a single batch.")
    data.add_argument("--use-distortion-for-training", type=parse_bool, default=True,
                      metavar="BOOL", help="Pad, random-crop and flip training images "
                                           "(true/false).")

    devices = parser.add_argument_group("devices")
    devices.add_argument("--num-gpus", type=non_negative_int, default=1,
                         help="GPUs to use, one tower each; 0 trains on the CPU.")
    devices.add_argument("--num-cpu-towers", type=positive_int, default=1, metavar="K",
                         help="With --num-gpus 0: K towers on K logical CPU devices "
                              "(the multi-tower code path on any machine).")
    devices.add_argument("--variable-strategy", choices=["CPU", "GPU"], default="CPU",
                         help="Where variables live: CPU, or spread over the GPUs by size.")
    devices.add_argument("--data-format", choices=["channels_first", "channels_last"],
                         default=None, help="Layout inside the model; default channels_first "
                                            "on GPUs, channels_last on the CPU.")
    hparam(devices, "--precision", choices=precision.PRECISIONS + (precision.AUTO,),
           default=DEFAULTS.precision,
           help="What training computes in. fp32: float32 throughout (the original). bf16: "
                "mixed bfloat16, for CPUs with bfloat16 instructions (avx512_bf16, amx_bf16) "
                "and GPUs from Ampere on. fp16: mixed float16 with dynamic loss scaling, for "
                "GPUs. Variables stay float32; evaluation and exports compute in float32. "
                "auto: on the CPU, bf16 where this machine serves it and trains faster in "
                "it than in fp32 (measured once per machine, a few seconds), else fp32; on "
                "GPUs, fp32. The log and hparams.json say which it took.")
    devices.add_argument("--num-intra-threads", type=non_negative_int, default=0,
                         help="Threads inside one op; 0 lets TensorFlow choose.")
    devices.add_argument("--num-inter-threads", type=non_negative_int, default=0,
                         help="Ops run in parallel; 0 lets TensorFlow choose.")
    devices.add_argument("--log-device-placement", action="store_true",
                         help="Log the device of every op.")

    model = parser.add_argument_group("model and optimisation")
    hparam(model, "--num-layers", type=int, default=DEFAULTS.num_layers,
           help="ResNet depth, 6n+2 (20, 32, 44, 56, 110, ...).")
    length = model.add_mutually_exclusive_group()
    hparam(length, "--train-steps", type=positive_int, default=DEFAULTS.train_steps,
           help="Global step at which training stops (default: the tutorial's %d). The "
                "learning rate drops at epochs %s whatever this is, unless "
                "--learning-rate-drops is given."
                % (schedule.TUTORIAL_TRAIN_STEPS,
                   ", ".join(str(epoch) for epoch in schedule.TUTORIAL_DROP_EPOCHS)))
    hparam(length, "--train-epochs", type=positive_float, default=DEFAULTS.train_epochs,
           metavar="E",
           help="Train E epochs of the training set (at the global batch) and place the "
                "learning-rate drops in proportion to the run (see --learning-rate-drops). "
                "Use this for runs shorter than the tutorial's 256 epochs.")
    hparam(model, "--learning-rate-drops", choices=sorted(schedule.PROPORTIONAL_DROPS),
           default=DEFAULTS.learning_rate_drops,
           help="Place the rate's drops in proportion to the run. paper: /10 at 50%% and "
                "75%% of it (He et al. 2016: --train-steps 64000 --learning-rate-drops paper "
                "is the paper's schedule); tutorial: /10 at 32%% and 48%% (the tutorial's "
                "epochs 82 and 123 of 256). Unset: paper with --train-epochs; with "
                "--train-steps, the tutorial's drops at fixed epochs.")
    hparam(model, "--learning-rate-schedule", choices=schedule.SHAPES,
           default=DEFAULTS.learning_rate_schedule,
           help="Shape of the rate over the run. piecewise: the drops above (the original). "
                "cosine: a half cosine from the base rate to 0 at the last step. linear: a "
                "straight line to 0 at the last step. Both work with --train-steps or "
                "--train-epochs.")
    hparam(model, "--warmup-epochs", type=non_negative_float, default=DEFAULTS.warmup_epochs,
           metavar="W",
           help="Raise the rate linearly from about 0 to the base rate over the first W "
                "epochs, then follow the schedule (for large global batches with "
                "--learning-rate-scaling linear).")
    hparam(model, "--train-batch-size", type=positive_int, default=DEFAULTS.train_batch_size,
           help="Batch of one worker, split evenly over its towers.")
    model.add_argument("--eval-batch-size", type=positive_int, default=100,
                       help="Eval batch, split over the towers; must divide the validation "
                            "and test sets.")
    hparam(model, "--momentum", type=float, default=DEFAULTS.momentum,
           help="Momentum of the optimizer.")
    hparam(model, "--nesterov", action="store_true",
           help="Nesterov momentum (the original uses plain momentum).")
    hparam(model, "--weight-decay", type=float, default=DEFAULTS.weight_decay,
           help="L2 weight decay factor: weight decay x the sum of tf.nn.l2_loss (half the "
                "squared norm) of the decayed variables (--weight-decay-scope) is added to "
                "the loss, i.e. weight decay x w is added to each gradient: the paper's "
                "convention, in which He et al. 2016 used 1e-4.")
    hparam(model, "--weight-decay-scope", choices=job_hparams.WEIGHT_DECAY_SCOPES,
           default=DEFAULTS.weight_decay_scope,
           help="all: decay every trainable variable (the original). kernels: only the "
                "convolution and dense kernels; batch norm's gamma and beta and the dense "
                "bias are not decayed.")
    hparam(model, "--seed", type=non_negative_int, default=DEFAULTS.seed, metavar="N",
           help="Graph-level random seed: the initial weights, the order of the training "
                "data and its augmentation follow N (recorded in hparams.json). In a cluster "
                "each trainer adds its rank, so workers still draw different batches. "
                "Unset: every run draws anew, as the original.")
    hparam(model, "--label-smoothing", type=non_negative_float,
           default=DEFAULTS.label_smoothing, metavar="F",
           help="Train towards 1 - F on the label and F spread evenly over the 10 classes. "
                "The evaluation loss stays plain cross entropy.")
    hparam(model, "--zero-init-residual", action="store_true",
           help="Start the scale (gamma) of each residual unit's last batch norm at 0, so "
                "every unit starts as the identity (Goyal et al. 2017); the original starts "
                "it at 1.")
    hparam(model, "--shift-learning-rate-factor", type=positive_float,
           default=DEFAULTS.shift_learning_rate_factor, metavar="F",
           help="Batch norm's shift (beta) variables learn at F times the learning rate (F x "
                "their gradient, weight decay included).")
    hparam(model, "--learning-rate", type=positive_float, default=DEFAULTS.learning_rate,
           help="Initial learning rate; x%s from epochs %s (with --train-epochs: see "
                "--learning-rate-drops)." % (
                    ", x".join("%g" % factor for factor in schedule.TUTORIAL_DROP_FACTORS[1:]),
                    ", ".join(str(epoch) for epoch in schedule.TUTORIAL_DROP_EPOCHS)))
    hparam(model, "--learning-rate-scaling", choices=schedule.LEARNING_RATE_SCALINGS,
           default=DEFAULTS.learning_rate_scaling,
           help="none: --learning-rate as given, whatever the global batch (the original). "
                "linear: --learning-rate x global batch / %d, the global batch being "
                "--train-batch-size x workers with --sync (Goyal et al. 2017)."
                % schedule.REFERENCE_BATCH_SIZE)
    hparam(model, "--batch-norm-decay", type=float, default=DEFAULTS.batch_norm_decay,
           help="Decay of the batch-norm moving averages.")
    hparam(model, "--moving-average-decay", type=between_zero_and_one,
           default=DEFAULTS.moving_average_decay, metavar="D",
           help="Keep an exponential moving average of the trainable weights (decay D, "
                "ramped up over the first steps as min(D, (1+step)/(10+step))) next to them, "
                "and evaluate, export and predict with it; checkpoints hold both. Batch-norm "
                "statistics are already moving averages (--batch-norm-decay) and stay as "
                "trained. E.g. 0.999; unset, the trained weights are used.")
    hparam(model, "--batch-norm-epsilon", type=positive_float,
           default=DEFAULTS.batch_norm_epsilon, help="Epsilon of batch norm.")
    hparam(model, "--sync", action="store_true",
           help="Distributed only: synchronous updates with SyncReplicasOptimizer.")

    evaluation = parser.add_argument_group("checkpoints and evaluation")
    evaluation.add_argument("--save-checkpoints-steps", type=positive_int, default=None,
                            metavar="N",
                            help="Checkpoint every N steps (default: every 600 seconds). "
                                 "A checkpoint is always written at the last step.")
    evaluation.add_argument("--eval-every-secs", type=positive_int, default=600, metavar="S",
                            help="Evaluate a new checkpoint at most every S seconds; the final "
                                 "checkpoint is always evaluated, as soon as it is written.")
    evaluation.add_argument(
        "--eval-subset", choices=["validation", "eval"], default="validation",
        help="What the evaluations during training use. validation (into "
             "job-dir/eval_validation/) picks export/best; eval is the test set, as the "
             "original did: then no best export is kept, since choosing a model on test data "
             "makes its test accuracy optimistic. Either way the final checkpoint is "
             "evaluated once on the test set (job-dir/eval_test/, job-dir/%s)."
             % report.TEST_RESULTS_FILENAME)
    hparam(evaluation, "--eval-flips", action="store_true",
           help="Evaluation, exports and predictions average the class probabilities of each "
                "image and its left-right mirror (twice the inference work; the evaluation "
                "loss stays that of the images alone).")
    hparam(evaluation, "--eval-shifts", type=non_negative_int, default=DEFAULTS.eval_shifts,
           metavar="P",
           help="Evaluation, exports and predictions also average the class probabilities "
                "of each image shifted by P pixels right, left, down and up (zero fill); "
                "with --eval-flips, of their mirrors too (5x the inference work, 10x with "
                "flips). 0: none.")

    distributed = parser.add_argument_group(
        "cluster", "With TF_CONFIG set, this command runs as the ps, chief, worker or evaluator "
                   "task it names (see cifar10_estimator/distributed/cluster.py).")
    distributed.add_argument("--ps-timeout-secs", type=positive_int, default=600, metavar="S",
                             help="Chief and workers exit with an error once a parameter server "
                                  "has been unreachable for S seconds, at start or during "
                                  "training (TensorFlow alone would wait forever).")
    return parser


def validate(args, task=None):
    """Check flags, their combinations, the machine and the data files. Raises UsageError.

    Args:
      args: the parsed flags.
      task: the cluster.ClusterTask this process runs, if any. A ps task needs
        neither the GPUs nor the data, so only the flags themselves are checked.
    """
    quiet_tensorflow_logs()
    from cifar10_estimator import cifar10_model
    from cifar10_estimator.machine import hardware
    builds_towers = task is None or task.builds_towers
    try:
        cifar10_model.num_units_per_stage(args.num_layers)
    except ValueError as error:
        raise UsageError("--num-layers: %s" % error)
    if args.num_gpus > 0 and builds_towers:
        _check_gpus_present(args.num_gpus, hardware.num_gpus_visible())
    if args.label_smoothing >= 1:
        raise UsageError("--label-smoothing %g leaves the label no more weight than the other "
                         "classes; use a value below 1, e.g. 0.1" % args.label_smoothing)
    if args.eval_shifts > MAX_EVAL_SHIFT:
        raise UsageError("--eval-shifts %d moves the images too far; use at most %d pixels "
                         "(training crops move them by up to 4)"
                         % (args.eval_shifts, MAX_EVAL_SHIFT))
    if args.num_gpus > 0 and args.num_cpu_towers != 1:
        raise UsageError("--num-cpu-towers applies only with --num-gpus 0")
    if args.num_gpus == 0 and args.variable_strategy == "GPU":
        raise UsageError("--variable-strategy GPU needs GPUs; with --num-gpus 0 use "
                         "--variable-strategy CPU")
    if (args.num_gpus == 0 and args.data_format == "channels_first"
            and not hardware.onednn_enabled()):
        raise UsageError("--data-format channels_first on the CPU needs TensorFlow's oneDNN "
                         "kernels, which are off here: set TF_ENABLE_ONEDNN_OPTS=1, or use "
                         "channels_last (TensorFlow's other CPU kernels are channels_last only)")
    if builds_towers:
        _check_precision_served(precision.POLICIES.get(args.precision), args.num_gpus)
    num_towers = args.num_gpus or args.num_cpu_towers
    for flag in ("train-batch-size", "eval-batch-size"):
        batch_size = getattr(args, flag.replace("-", "_"))
        if batch_size % num_towers != 0:
            raise UsageError("--%s %d must be divisible by the number of towers (%d)"
                             % (flag, batch_size, num_towers))
    if not args.use_synthetic_data and builds_towers:
        _check_data_dir(args.data_dir)
        for subset in dict.fromkeys([periodic_eval_subset(args), "eval"]):
            eval_steps(args, subset)


def quiet_tensorflow_logs():
    """The trainer's log is TensorFlow's Python INFO lines; keep C++ warnings and errors."""
    cli.quiet_tensorflow_logs("1", "INFO")


def _check_gpus_present(num_gpus, available):
    if num_gpus > available:
        raise UsageError("--num-gpus %d asked, but %d GPU%s visible to TensorFlow; use "
                         "--num-gpus %d (0 trains on the CPU)"
                         % (num_gpus, available, " is" if available == 1 else "s are", available))


def _check_precision_served(precision_policy, num_gpus):
    if precision_policy is None or not precision_policy.is_mixed:
        return
    from cifar10_estimator.machine import hardware
    reason = precision.unsupported_reason(
        precision_policy, num_gpus, hardware.cpu_flags(), hardware.onednn_enabled(),
        hardware.gpu_compute_capabilities(num_gpus))
    if reason:
        raise UsageError(reason)


def _check_data_dir(data_dir):
    if not data_dir:
        raise UsageError("--data-dir is required (or pass --use-synthetic-data); write the "
                         "TFRecords with: " + tfrecord_format.generate_command("DIR"))
    try:
        cifar10.check_tfrecords_exist(data_dir, ["train", "eval"])
    except Cifar10EstimatorError as error:
        raise UsageError(str(error))


def periodic_eval_subset(args):
    """The subset evaluated during training: --eval-subset, or the test set ('eval') when
    the data has no validation set (converted with --validation-examples 0)."""
    if (args.eval_subset == "validation" and not args.use_synthetic_data
            and not tfrecord_format.has_subset(args.data_dir, "validation")):
        return "eval"
    return args.eval_subset


def subsets_read(args, task=None):
    """The TFRecord subsets this process reads: training's, if it trains, and the evaluated
    ones, if it evaluates (alone, as a master, or as the evaluator task)."""
    if args.use_synthetic_data:
        return []
    subsets = []
    if task is None or task.is_trainer:
        subsets.append("train")
    if task is None or task.evaluates:
        subsets += [periodic_eval_subset(args), "eval"]
    return list(dict.fromkeys(subsets))


def eval_steps(args, subset):
    """Steps that evaluate each example of `subset` once (one batch with synthetic data)."""
    if args.use_synthetic_data:
        return 1
    count = tfrecord_format.num_examples(subset, args.data_dir)
    if count % args.eval_batch_size != 0:
        raise UsageError("--eval-batch-size %d does not divide the %d %s examples; every "
                         "example is evaluated exactly once, so pick a divisor of %d"
                         % (args.eval_batch_size, count, subset, count))
    return count // args.eval_batch_size


def data_format(args):
    """--data-format, or the layout of the devices: channels_first on GPUs, else last."""
    return args.data_format or ("channels_first" if args.num_gpus else "channels_last")


def hparams_of(parser, args, task=None):
    """The run's HParams: the hyper-parameter flags, and what the data and cluster say.

    Args:
      parser: the parser that parsed args (it knows which flags are hyper-parameters).
      args: the validated flags.
      task: the cluster.ClusterTask this process runs, or None.
    """
    return job_hparams.HParams.from_flags(
        {name: getattr(args, name) for name in parser.hparam_destinations},
        data_format=data_format(args),
        num_workers=task.num_trainers if task else 1,
        num_train_examples=tfrecord_format.num_examples(
            "train", None if args.use_synthetic_data else args.data_dir))


def parse(argv):
    """(parser, args) of the trainer's command line, --recipe applied; a malformed flag
    raises UsageError."""
    parser = build_parser()
    given = parser.parse_args(argv)
    return parser, with_recipe(parser, given, _given_destinations(argv))


def with_recipe(parser, args, given_destinations):
    """A copy of args with the values of its --recipe where the user gave no flag.

    A recipe's value also yields to a flag the user gave that excludes it (the recipe's
    --train-epochs to a given --train-steps).
    """
    excluded = set(given_destinations)
    for group in parser._mutually_exclusive_groups:
        group_destinations = {action.dest for action in group._group_actions}
        if group_destinations & excluded:
            excluded |= group_destinations
    values = vars(args).copy()
    values.update((destination, value)
                  for destination, value in recipes.RECIPES[args.recipe].items()
                  if destination not in excluded)
    return argparse.Namespace(**values)


def _given_destinations(argv):
    """The destinations of the flags present on the command line."""
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    return set(vars(probe.parse_args(argv)))
