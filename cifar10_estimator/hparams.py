"""The training job's hyper-parameters, each declared once, and job-dir/hparams.json.

Each field of HParams that is an option (cli.options.option) is a trainer flag: its default,
type or check, help and --help group are written here, once, and the trainer's parser
(flags.build_parser), hparams.json, the recipes and the manual's flag table read them;
the depth's rule (num_units_per_stage) is here too, for flags.validate and the model.
The other fields are derived: the trainer fills them in from the data and the cluster
(flags.resolve). Where the network runs is no hyper-parameter: the devices decide it
(model_fn.TowerLayout). Each run that trains a job adds the values it used to
job-dir/hparams.json, with the layout its network computed in and when and from which
step it started; the runs before it stay, and a run that trains nothing (refused, or of
a finished job) writes nothing. The newest run's values rebuild the job's checkpoints
later (the evaluate command reads them).
"""

import argparse
import dataclasses
import json
import numbers
import os
import time
import typing

from cifar10_estimator import files
from cifar10_estimator.cli.options import (below_one, between_zero_and_one, flag_of,
                                           non_negative_float, non_negative_int, option,
                                           option_fields, positive_float, positive_int)
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.settings import precision
from cifar10_estimator.settings import recipes
from cifar10_estimator.settings import schedule

HPARAMS_FILENAME = "hparams.json"
HPARAMS_FORMAT = "cifar10_estimator.hparams/2"
# The format of the file of one run, which earlier versions wrote: read as that run.
SINGLE_RUN_FORMAT = "cifar10_estimator.hparams/1"

# Which trainable variables weight decay pulls towards 0 (training.losses.decayed_variables).
WEIGHT_DECAY_SCOPES = ("all", "kernels")
# Smallest --low-resolution: the last stage, at a quarter of the side, still sees 2x2.
MIN_LOW_RESOLUTION = 8


def num_units_per_stage(num_layers):
    """n of a ResNet-(6n+2): residual units in each of the three stages (--num-layers'
    check, and what cifar10_model builds).

    Raises:
      ValueError: num_layers is not 6n + 2 with n >= 1.
    """
    if not isinstance(num_layers, numbers.Integral) or num_layers < 8 or (num_layers - 2) % 6 != 0:
        raise ValueError("num_layers must be 6n+2 for a whole n >= 1 (8, 14, 20, 32, 44, 56, "
                         "110, ...), got %r" % (num_layers,))
    return (num_layers - 2) // 6


def resnet_depth(text):
    """argparse type of the benchmarks' and the GPU check's depth options: a ResNet depth
    the trainer builds (num_units_per_stage)."""
    try:
        depth = int(text)
        num_units_per_stage(depth)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))
    return depth


def _recipes_help():
    return ("A named set of the flags below; flags given on the command line override it. "
            + "; ".join("%s: %s" % (name, recipes.as_flags(name) or "the tutorial's defaults")
                        for name in recipes.RECIPES))


@dataclasses.dataclass(frozen=True)
class HParams:
    """Hyper-parameters of the model and its optimisation (the tutorial's defaults).

    train_batch_size is the batch of one worker over all its towers; the
    learning-rate schedule counts epochs in examples_per_global_step.
    """

    # The --recipe the other values started from, before the flags given.
    recipe: str = option(
        "tutorial", _recipes_help(), choices=sorted(recipes.RECIPES))
    # One of precision.PRECISIONS once resolved: hparams.json records what auto took.
    precision: str = option(
        "fp32", "What training computes in. fp32: float32 throughout (the original), TF32 "
                "off on GPUs from Ampere on, where TensorFlow would use it. tf32: float32 "
                "with TF32 matrix multiplies and convolutions, for GPUs from Ampere on "
                "(compute capability 8.0). bf16: "
                "mixed bfloat16, for CPUs with bfloat16 instructions (avx512_bf16, amx_bf16) "
                "and GPUs from Ampere on. fp16: mixed float16 with dynamic loss scaling, for "
                "GPUs. Variables stay float32; exports compute in float32, and so does "
                "evaluation unless --eval-in-training-precision. "
                "auto: on the CPU, bf16 where this machine serves it and trains faster in "
                "it than in fp32 (measured once per machine, a few seconds), else fp32; on "
                "GPUs, tf32 where every one has it, else fp32. The plan line and hparams.json "
                "say which it took.",
        group="devices", choices=precision.PRECISIONS + (precision.AUTO,))

    # The network.
    num_layers: int = option(
        44, "ResNet depth, 6n+2 (20, 32, 44, 56, 110, ...).", group="model", type=int)
    batch_norm_decay: float = option(
        0.997, "Decay of the batch-norm moving averages.", group="model", type=float)
    batch_norm_epsilon: float = option(
        1e-5, "Epsilon of batch norm.", group="model", type=positive_float)
    zero_init_residual: bool = option(
        False, "Start the scale (gamma) of each residual unit's last batch norm at 0, so "
               "every unit starts as the identity (Goyal et al. 2017); the original starts "
               "it at 1.",
        group="model", action="store_true")
    patch_pca_init: bool = option(
        False, "Start the first convolution's 16 filters as the 8 leading principal "
               "directions of the training images' 3x3 patches and their negatives, so "
               "that the batch norm after it whitens the patches (after Jordan 2024's "
               "whitening initialisation); the original starts them at random.",
        group="model", action="store_true")

    # The run's length and the learning rate over it (settings.schedule reads them).
    train_steps: typing.Optional[int] = option(
        None, "Global step at which training stops (default: the tutorial's %d). The "
              "learning rate drops at epochs %s whatever this is, unless "
              "--learning-rate-drops is given."
              % (schedule.TUTORIAL_TRAIN_STEPS,
                 ", ".join(str(epoch) for epoch in schedule.TUTORIAL_DROP_EPOCHS)),
        group="schedule", exclusive="run length", type=positive_int)
    train_epochs: typing.Optional[float] = option(
        None, "Train E epochs of the training set (at the global batch) and place the "
              "learning-rate drops in proportion to the run (see --learning-rate-drops). "
              "Use this for runs shorter than the tutorial's 256 epochs.",
        group="schedule", exclusive="run length", type=positive_float, metavar="E")
    learning_rate: float = option(
        0.1, "Initial learning rate; x%s from epochs %s (with --train-epochs: see "
             "--learning-rate-drops)." % (
                 ", x".join("%g" % factor for factor in schedule.TUTORIAL_DROP_FACTORS[1:]),
                 ", ".join(str(epoch) for epoch in schedule.TUTORIAL_DROP_EPOCHS)),
        group="schedule", type=positive_float)
    learning_rate_scaling: str = option(
        "none", "none: --learning-rate as given, whatever the global batch (the original). "
                "linear: --learning-rate x global batch / %d, the global batch being "
                "--train-batch-size x workers with --sync (Goyal et al. 2017)."
                % schedule.REFERENCE_BATCH_SIZE,
        group="schedule", choices=schedule.LEARNING_RATE_SCALINGS)
    learning_rate_drops: typing.Optional[str] = option(
        None, "Place the rate's drops in proportion to the run. paper: /10 at 50%% and "
              "75%% of it (He et al. 2016: --train-steps 64000 --learning-rate-drops paper "
              "is the paper's schedule); tutorial: /10 at 32%% and 48%% (the tutorial's "
              "epochs 82 and 123 of 256). Unset: paper with --train-epochs; with "
              "--train-steps, the tutorial's drops at fixed epochs.",
        group="schedule", choices=sorted(schedule.PROPORTIONAL_DROPS))
    learning_rate_schedule: str = option(
        "piecewise", "Shape of the rate over the run. piecewise: the drops above (the "
                     "original). cosine: a half cosine from the base rate to 0 at the last "
                     "step. linear: a straight line to 0 at the last step. Both work with "
                     "--train-steps or --train-epochs.",
        group="schedule", choices=schedule.SHAPES)
    warmup_epochs: float = option(
        0.0, "Raise the rate linearly from about 0 to the base rate over the first W "
             "epochs, then follow the schedule (for large global batches with "
             "--learning-rate-scaling linear).",
        group="schedule", type=non_negative_float, metavar="W")

    # What each step computes and how it updates the weights.
    train_batch_size: int = option(
        128, "Batch of one worker, split evenly over its towers.",
        group="optimisation", type=positive_int)
    momentum: float = option(
        0.9, "Momentum of the optimizer.", group="optimisation", type=float)
    nesterov: bool = option(
        False, "Nesterov momentum (the original uses plain momentum).",
        group="optimisation", action="store_true")
    weight_decay: float = option(
        2e-4, "L2 weight decay factor: weight decay x the sum of tf.nn.l2_loss (half the "
              "squared norm) of the decayed variables (--weight-decay-scope) is added to "
              "the loss, i.e. weight decay x w is added to each gradient: the paper's "
              "convention, in which He et al. 2016 used 1e-4.",
        group="optimisation", type=float)
    weight_decay_scope: str = option(
        "all", "all: decay every trainable variable (the original). kernels: only the "
               "convolution and dense kernels; batch norm's gamma and beta and the dense "
               "bias are not decayed.",
        group="optimisation", choices=WEIGHT_DECAY_SCOPES)
    label_smoothing: float = option(
        0.0, "Train towards 1 - F on the label and F spread evenly over the 10 classes. "
             "The evaluation loss stays plain cross entropy.",
        group="optimisation", type=non_negative_float, metavar="F")
    label_smoothing_decay: bool = option(
        False, "With --label-smoothing F: the factor falls linearly from F at the first "
               "step to 0 at the last, instead of staying F.",
        group="optimisation", action="store_true")
    train_max_shift: int = option(
        cifar10_facts.MAX_SHIFT,
        "Training crops move each image by up to P pixels along each axis (uniform over "
        "-P..P; 0..%d). %d is the original's pad-4 crop; fewer suit short runs (Jordan 2024 "
        "uses 2)." % (cifar10_facts.MAX_SHIFT, cifar10_facts.MAX_SHIFT),
        group="optimisation", type=non_negative_int, metavar="P")
    alternating_flips: bool = option(
        False, "Mirror each training image in every other epoch, starting with probability "
               "1/2 in its first (Jordan 2024's alternating flip), instead of with "
               "probability 1/2 in every epoch (the original).",
        group="optimisation", action="store_true")
    low_resolution_epochs: float = option(
        0.0, "Train the first E epochs on the crops shrunk to --low-resolution pixels a "
             "side (area resize), then the rest at 32 (progressive resizing): the early "
             "steps cost less, and the network, convolutional up to its global average "
             "pool, is the same. 0: every step at 32 (the original).",
        group="optimisation", type=non_negative_float, metavar="E")
    low_resolution: int = option(
        24, "Side in pixels of the training images of --low-resolution-epochs "
            "(%d..%d)." % (MIN_LOW_RESOLUTION, cifar10_facts.HEIGHT - 1),
        group="optimisation", type=int, metavar="S")
    lower_resolution_epochs: float = option(
        0.0, "Before the --low-resolution epochs, train E epochs on the crops shrunk "
             "further, to --lower-resolution pixels a side: a third phase, the cheapest "
             "(e.g. 16, then 24, then 32 pixels). 0: none (the original).",
        group="optimisation", type=non_negative_float, metavar="E")
    lower_resolution: int = option(
        16, "Side in pixels of the training images of --lower-resolution-epochs "
            "(%d..%d)." % (MIN_LOW_RESOLUTION, cifar10_facts.HEIGHT - 1),
        group="optimisation", type=int, metavar="S")
    shift_learning_rate_factor: float = option(
        1.0, "Batch norm's shift (beta) variables learn at F times the learning rate (F x "
             "their gradient, weight decay included).",
        group="optimisation", type=positive_float, metavar="F")
    moving_average_decay: typing.Optional[float] = option(
        None, "Keep an exponential moving average of the trainable weights (decay D, "
              "ramped up over the first steps as min(D, (1+step)/(10+step))) next to them, "
              "and evaluate, export and predict with it; checkpoints hold both. Batch-norm "
              "statistics are already moving averages (--batch-norm-decay) and stay as "
              "trained. E.g. 0.999; unset, the trained weights are used.",
        group="optimisation", type=between_zero_and_one, metavar="D")
    lookahead_steps: int = option(
        0, "Lookahead (Zhang et al. 2019): keep slow copies of the weights; after every "
           "K steps and after the last, move them --lookahead-alpha of the way to the "
           "trained weights and continue training from them. Checkpoints hold both. 0: "
           "off.",
        group="optimisation", type=non_negative_int, metavar="K")
    lookahead_alpha: float = option(
        0.5, "With --lookahead-steps: the fraction of the way the slow weights move at "
             "each synchronisation.",
        group="optimisation", type=between_zero_and_one, metavar="A")
    muon_learning_rate: float = option(
        0.0, "Update the convolution kernels by Muon (Jordan et al. 2024) at rate R "
             "instead of by the momentum optimizer: their momentum made orthogonal, their "
             "norm held (training/muon.py). R follows the rate's schedule; every other "
             "variable keeps --learning-rate. Checkpoints hold the momenta. 0: off.",
        group="optimisation", type=non_negative_float, metavar="R")
    muon_momentum: float = option(
        0.6, "With --muon-learning-rate: the momentum of the kernels' Muon updates "
             "(Nesterov's).", group="optimisation", type=below_one, metavar="M")
    skip_learned: float = option(
        0.0, "Each step leaves out each example it has learned (its last training loss "
             "below the mean of all examples' last losses) with probability R, and trains "
             "the rest, the learned ones that stay weighing for those left out; the last "
             "eighth of the steps trains every example (InfoBatch, Qin et al. 2024). The "
             "epochs stay, the compute falls. 0: off.",
        group="optimisation", type=below_one, metavar="R")
    seed: typing.Optional[int] = option(
        None, "Graph-level random seed: the initial weights, the order of the training "
              "data and its augmentation follow N (recorded in hparams.json). In a cluster "
              "each trainer adds its rank, so workers still draw different batches. "
              "Unset: every run draws anew, as the original.",
        group="optimisation", type=non_negative_int, metavar="N")
    deterministic: bool = option(
        False, "TensorFlow's op determinism, in fp32 (TF32 off): with --seed, two runs of "
               "the same command end with bitwise the same weights, a run stopped and "
               "resumed included. Needs --seed; --precision auto then takes fp32. Some ops "
               "run slower.",
        group="optimisation", action="store_true")

    # Test-time views: what evaluation, prediction and exports compute; training is
    # unaffected.
    eval_flips: bool = option(
        False, "Evaluation, exports and predictions average the class probabilities of "
               "each image and its left-right mirror (twice the inference work; the "
               "evaluation loss stays that of the images alone).",
        group="checkpoints and evaluation", action="store_true")
    eval_shifts: int = option(
        0, "Evaluation, exports and predictions also average the class probabilities of "
           "each image shifted by P pixels right, left, down and up (zero fill); with "
           "--eval-flips, of their mirrors too (5x the inference work, 10x with flips). "
           "0: none.",
        group="checkpoints and evaluation", type=non_negative_int, metavar="P")
    eval_in_training_precision: bool = option(
        False, "Evaluation computes in the precision training took (--precision) instead "
               "of float32: faster where training's precision is (measured speeds: "
               "docs/precision.md), and its accuracy can differ from float32's by a few "
               "images in ten thousand. "
               "Exports and predictions stay float32.",
        group="checkpoints and evaluation", action="store_true")

    sync: bool = option(
        False, "Distributed only: synchronous updates with SyncReplicasOptimizer.",
        group="cluster", action="store_true")

    # Derived, no flag: flags.resolve fills them in from the data and the cluster.
    num_train_examples: int = cifar10_facts.OFFICIAL_NUM_EXAMPLES["train"]
    num_workers: int = 1

    @property
    def examples_per_global_step(self):
        """Examples behind one global step: the global batch of every worker with --sync.

        Without --sync each worker's update is a global step of its own batch (the
        original counted batch x workers here too, so its rate fell W times too soon
        in epochs of data with W asynchronous workers).
        """
        return self.train_batch_size * (self.num_workers if self.sync else 1)


DEFAULTS = HParams()


class ConfigFromHParams:
    """Base of the config a layer takes whole: cifar10_model.ModelConfig (the network),
    cifar10.AugmentationConfig (the training crops) and model_fn.OptimisationConfig (the
    loss and the update).

    A subclass is a frozen dataclass of HParams fields, each under its HParams name and
    with its HParams default (DEFAULTS.name), declared in the layer that reads it; the
    run builds it once with from_hparams and each layer hands it down whole. A new
    hyper-parameter is its option here, a field of its layer's config, its use, its
    test and the manual's flag table, and nothing between.
    """

    @classmethod
    def from_hparams(cls, hparams):
        """The config of `hparams`: each field the value of the HParams field of its name."""
        return cls(**{field.name: getattr(hparams, field.name)
                      for field in dataclasses.fields(cls)})


def record(hparams, data_format):
    """What hparams.json and TensorBoard's HParams dashboard record of a job: its HParams'
    values, and the layout its network computed in (model_fn.TowerLayout.data_format),
    under the name it had when it was an HParams field."""
    return dict(dataclasses.asdict(hparams), data_format=data_format)


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """A run that trained a job, as job-dir/hparams.json keeps it.

    Attributes:
      hparams: the HParams it trained with.
      data_format: the layout its network computed in, or None where not recorded.
      start_time: when it started, in seconds since the epoch, or None (a file of the
        earlier format, SINGLE_RUN_FORMAT, kept no time: its own time is the run's).
      start_step: the global step it started from, or None (the earlier format).
    """

    hparams: HParams
    data_format: typing.Optional[str]
    start_time: typing.Optional[float]
    start_step: typing.Optional[int]


def record_run(job_dir, hparams, data_format, start_step):
    """Add a run that trains the job, with `hparams` and `data_format` from global step
    start_step on, to job-dir/hparams.json after the runs it holds.

    Raises:
      Cifar10EstimatorError: the file is there but not ours.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    tf.io.gfile.makedirs(job_dir)
    path = os.path.join(job_dir, HPARAMS_FILENAME)
    runs = _read_runs(job_dir) if files.for_path(path).exists(path) else []
    runs.append({"hparams": record(hparams, data_format), "start_time": time.time(),
                 "start_step": start_step})
    files.write_json(path, {"format": HPARAMS_FORMAT, "runs": runs})


def load(job_dir):
    """The HParams the job's newest run trained with (job-dir/hparams.json).

    Raises:
      Cifar10EstimatorError: the file is missing or not ours.
    """
    return load_record(job_dir)[0]


def load_record(job_dir):
    """(HParams, data_format) of the job's newest run in job-dir/hparams.json: the
    hyper-parameters its newest checkpoints were trained with and the layout its network
    computed in (None where not recorded).

    Raises:
      Cifar10EstimatorError: the file is missing or not ours.
    """
    newest = load_runs(job_dir)[-1]
    return newest.hparams, newest.data_format


def load_runs(job_dir):
    """The TrainingRun of each run that trained the job, oldest first (job-dir/hparams.json).

    Raises:
      Cifar10EstimatorError: the file is missing or not ours.
    """
    known = {field.name for field in dataclasses.fields(HParams)}
    runs = _read_runs(job_dir)
    try:
        return [TrainingRun(
            hparams=HParams(**{name: run["hparams"][name] for name in known
                               if name in run["hparams"]}),
            data_format=run["hparams"].get("data_format"), start_time=run["start_time"],
            start_step=run["start_step"]) for run in runs]
    except (KeyError, TypeError, AttributeError) as error:
        raise Cifar10EstimatorError("cannot read %s (%s)" % (
            os.path.join(job_dir, HPARAMS_FILENAME), error))


def _read_runs(job_dir):
    """The runs job-dir/hparams.json holds, as written: [{hparams: record's values,
    start_time, start_step}], oldest first; a file of SINGLE_RUN_FORMAT is one run.

    Raises:
      Cifar10EstimatorError: the file is missing or not ours.
    """
    file_system = files.for_path(job_dir)
    if not file_system.isdir(job_dir):
        raise Cifar10EstimatorError("job directory %s does not exist" % job_dir)
    path = os.path.join(job_dir, HPARAMS_FILENAME)
    if not file_system.exists(path):
        raise Cifar10EstimatorError(
            "%s is missing: it is written when training starts; pass the --job-dir that "
            "python -m cifar10_estimator.main trained in" % path)
    try:
        with file_system.open(path) as stream:
            content = json.load(stream)
        if content["format"] == SINGLE_RUN_FORMAT:
            return [{"hparams": dict(content["hparams"]), "start_time": None,
                     "start_step": None}]
        if content["format"] != HPARAMS_FORMAT:
            raise ValueError("format %r, expected %r" % (content["format"], HPARAMS_FORMAT))
        if not content["runs"]:
            raise ValueError("no run")
        return list(content["runs"])
    except (ValueError, KeyError, TypeError, AttributeError) + file_system.errors as error:
        raise Cifar10EstimatorError("cannot read %s (%s)" % (path, error))


def changed_flags(previous, hparams, data_format):
    """'--flag OLD -> NEW' of each option (and the layout) in which `hparams` and
    `data_format` differ from the TrainingRun `previous`, in field order."""
    before = record(previous.hparams, previous.data_format)
    after = record(hparams, data_format)
    flagged = [field.name for field in option_fields(HParams)] + ["data_format"]
    return ["%s %s -> %s" % (flag_of(name), _value_text(before[name]), _value_text(after[name]))
            for name in flagged if before[name] != after[name]]


def _value_text(value):
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "%g" % value if isinstance(value, float) else str(value)
