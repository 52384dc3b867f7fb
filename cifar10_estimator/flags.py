"""The trainer's options: the run's Settings, the parser built from them, and their checks.

    python -m cifar10_estimator.main --data-dir DATA --job-dir JOB --num-gpus 0

Each option is declared once, as a field (cli.options.option) with its default, type or check,
help and --help group: the hyper-parameters in hparams.HParams (recorded in
hparams.json), the other options of a run in Settings below. The parser, the recipes
and the manual's flag table (`python -m cifar10_estimator.flags --markdown`) all read
those declarations. Flags keep the original tutorial's names and defaults.

The trainer (main) and the local cluster launcher both parse and check with this
module, which imports no TensorFlow: only the probes of the machine (its GPUs, oneDNN)
and --precision auto's measurement load it, so a malformed flag or a missing data
directory fails at once.
"""

import argparse
import dataclasses
import logging
import sys
import typing

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import report
from cifar10_estimator.cli import markdown, options, tensorflow_logs
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import (ArgumentParser, add_options, flag_of, non_negative_int,
                                           option, parse_bool, parse_options, positive_int)
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.run import console
from cifar10_estimator.run import evaluation_dirs
from cifar10_estimator.settings import precision
from cifar10_estimator.settings import recipes
from cifar10_estimator.settings import schedule

# --eval-shifts: the furthest test-time shift, in pixels, of a 32x32 image.
MAX_EVAL_SHIFT = 8
# How long a cluster's evaluator may take over the final checkpoint once training ended:
# an evaluation under way, then the final one, its exports and the test evaluation. The
# chief's --evaluator-wait-secs and the local launcher's --evaluator-grace-secs.
FINAL_EVALUATION_SECS = 600

# The argument groups of --help, in order: (title, description). An option names its
# group by the title.
GROUPS = (
    ("data and output", None),
    ("devices", None),
    ("model", None),
    ("schedule", "How long the run is and the learning rate over it."),
    ("optimisation", None),
    ("checkpoints and evaluation", None),
    ("cluster", "With TF_CONFIG set, this command runs as the ps, chief, worker or evaluator "
                "task it names (see cifar10_estimator/distributed/cluster.py)."),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """A training run's settings: its HParams and the trainer's other options.

    parse makes them from the command line; resolve then fills in what the data, the
    devices, the cluster and the machine decide. Nothing changes them after that.
    """

    hparams: job_hparams.HParams = job_hparams.DEFAULTS

    data_dir: typing.Optional[str] = option(
        None, "Directory with train/eval TFRecords written by python -m "
              "cifar10_estimator.generate_tfrecords. Not needed with --use-synthetic-data.",
        group="data and output")
    job_dir: str = option(
        None, "Directory for checkpoints, TensorBoard events and evaluations: those during "
              "training in job-dir/%s/ (job-dir/%s/ on the test set, without a validation "
              "set or with --eval-subset eval), the final test evaluation in job-dir/%s/. "
              "Rerunning with the same job-dir resumes."
              % (evaluation_dirs.VALIDATION_DIR, evaluation_dirs.TEST_DURING_TRAINING_DIR,
                 evaluation_dirs.evaluation_dir(report.TEST_EVAL_NAME)),
        group="data and output", required=True)
    use_synthetic_data: bool = option(
        False, "Train on one constant random batch held in memory instead of TFRecords: no "
               "data files, no decoding; the throughput ceiling. Evaluation then runs a "
               "single batch.",
        group="data and output", action="store_true")
    use_distortion_for_training: bool = option(
        True, "Pad, random-crop and flip training images (true/false).",
        group="data and output", type=parse_bool, metavar="BOOL")
    verbose: bool = option(
        False, "Print TensorFlow's whole log on the console, as the tutorial did: the "
               "throughput every 10 steps, the loss, the network's shapes. Without it the "
               "console shows the plan, the progress, each evaluation, warnings and the "
               "summary; the whole log always goes to job-dir/train.log.",
        group="data and output", action="store_true")

    num_gpus: int = option(
        1, "GPUs to use, one tower each; 0 trains on the CPU.",
        group="devices", type=non_negative_int)
    num_cpu_towers: int = option(
        1, "With --num-gpus 0: K towers on K logical CPU devices (the multi-tower code "
           "path on any machine).",
        group="devices", type=positive_int, metavar="K")
    variable_strategy: str = option(
        "CPU", "Where variables live: CPU, or spread over the GPUs by size.",
        group="devices", choices=["CPU", "GPU"])
    data_format: typing.Optional[str] = option(
        None, "Layout inside the model; default channels_first on GPUs, channels_last on "
              "the CPU.",
        group="devices", choices=["channels_first", "channels_last"])
    num_intra_threads: int = option(
        0, "Threads inside one op; 0 lets TensorFlow choose.",
        group="devices", type=non_negative_int)
    num_inter_threads: int = option(
        0, "Ops run in parallel; 0 lets TensorFlow choose.",
        group="devices", type=non_negative_int)
    log_device_placement: bool = option(
        False, "Log the device of every op.", group="devices", action="store_true")

    save_checkpoints_steps: typing.Optional[int] = option(
        None, "Checkpoint every N steps (default: every 600 seconds). A checkpoint is "
              "always written at the last step.",
        group="checkpoints and evaluation", type=positive_int, metavar="N")
    eval_every_secs: int = option(
        600, "Evaluate a new checkpoint at most every S seconds; the final checkpoint is "
             "always evaluated, as soon as it is written.",
        group="checkpoints and evaluation", type=positive_int, metavar="S")
    eval_subset: str = option(
        "validation", "What the evaluations during training use. validation (into "
                      "job-dir/eval_validation/) picks export/best; eval is the test set, "
                      "as the original did: then no best export is kept, since choosing a "
                      "model on test data makes its test accuracy optimistic. Either way "
                      "the final checkpoint is evaluated once on the test set "
                      "(job-dir/eval_test/, job-dir/%s)." % report.TEST_RESULTS_FILENAME,
        group="checkpoints and evaluation", choices=["validation", "eval"])
    eval_batch_size: int = option(
        100, "Eval batch; must divide the validation and test sets. It is split over as "
             "many of the towers as it splits evenly over (100 on 3 GPUs: 2 of 50 each), "
             "so each example is evaluated exactly once.",
        group="checkpoints and evaluation", type=positive_int)

    ps_timeout_secs: int = option(
        600, "Chief and workers exit with an error once a parameter server has been "
             "unreachable for S seconds, at start or during training (TensorFlow alone "
             "would wait forever).",
        group="cluster", type=positive_int, metavar="S")
    evaluator_wait_secs: int = option(
        FINAL_EVALUATION_SECS,
        "A chief whose TF_CONFIG cluster lists an evaluator, as Kubeflow's training "
        "operator writes it, waits up to S seconds once training ended for the evaluator's "
        "final result (job-dir/%s) before it exits, so that the job's end does not cut "
        "the final evaluation off; 0 does not wait." % report.TEST_RESULTS_FILENAME,
        group="cluster", type=non_negative_int, metavar="S")

    @property
    def num_towers(self):
        """Towers of this worker: one per GPU, else one per logical CPU device."""
        return self.num_gpus or self.num_cpu_towers

    @property
    def num_eval_towers(self):
        """Towers an evaluation runs on: the most of num_towers that --eval-batch-size
        splits evenly over. 10000 test images have no factor 3 or 7, so no batch that
        divides them splits over 3, 6 or 7 towers; fewer towers keep each example
        evaluated once, with no batch padded and no metric masked."""
        return max(count for count in range(1, self.num_towers + 1)
                   if self.eval_batch_size % count == 0)


def option_fields():
    """Every trainer option's field: the hyper-parameters' and the other settings'."""
    return options.option_fields(Settings, job_hparams.HParams)


def _fields_in_help_order():
    order = [None] + [title for title, _ in GROUPS]
    return sorted(option_fields(), key=lambda field: order.index(field.metadata["group"]))


def build_parser():
    """The trainer's ArgumentParser, built from the options' declarations."""
    parser = ArgumentParser(
        description="Train a ResNet on CIFAR-10 with tf.estimator.train_and_evaluate: "
                    "one tower per GPU (or per logical CPU device), gradients averaged.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_options(parser, _fields_in_help_order(), GROUPS)
    return parser


def parse(argv):
    """The Settings of the trainer's command line, --recipe applied (HParams' derived
    fields and --precision auto are left to resolve); a malformed flag raises UsageError."""
    values, given = parse_options(build_parser(), option_fields(), argv)
    values.update(_recipe_values(values["recipe"], given))
    return Settings(
        hparams=job_hparams.HParams(**{field.name: values[field.name]
                                       for field in options.option_fields(job_hparams.HParams)}),
        **{field.name: values[field.name] for field in options.option_fields(Settings)})


def _recipe_values(recipe, given):
    """The values of `recipe` that no option given replaces.

    A recipe's value also yields to an option the user gave that excludes it (the recipe's
    --train-epochs to a given --train-steps).
    """
    excluded = {field.metadata["exclusive"] for field in option_fields()
                if field.name in given and field.metadata["exclusive"]}
    replaced = {field.name for field in option_fields()
                if field.name in given or field.metadata["exclusive"] in excluded}
    return {destination: value for destination, value in recipes.RECIPES[recipe].items()
            if destination not in replaced}


def quiet_tensorflow_logs():
    """The trainer's log is TensorFlow's Python INFO lines; keep C++ warnings and errors.

    Call it before validate, which loads TensorFlow where a check needs it.
    """
    tensorflow_logs.quiet_tensorflow_logs("1", "INFO")


def validate(settings, task=None):
    """Check the flags, their combinations, the machine and the data files.

    Args:
      settings: the parsed Settings.
      task: the cluster.ClusterTask this process runs, if any. A ps task needs
        neither the GPUs nor the data, so only the flags themselves are checked.

    Raises:
      UsageError: naming the flag at fault and the fix.
      Cifar10EstimatorError: where GPUs are asked for, the cuDNN TensorFlow would load
        is one it cannot run with (machine.cuda_libraries).
    """
    from cifar10_estimator.machine import cuda_libraries, hardware
    hparams = settings.hparams
    builds_towers = task is None or task.builds_towers
    try:
        job_hparams.num_units_per_stage(hparams.num_layers)
    except ValueError as error:
        raise UsageError("--num-layers: %s" % error)
    if settings.num_gpus > 0 and builds_towers:
        # First: a cuDNN TensorFlow cannot run with still lets it list the GPUs, and
        # would fail only at the first convolution.
        cuda_libraries.check_cudnn()
        check_gpus_present(settings.num_gpus)
    if hparams.label_smoothing >= 1:
        raise UsageError("--label-smoothing %g leaves the label no more weight than the other "
                         "classes; use a value below 1, e.g. 0.1" % hparams.label_smoothing)
    if hparams.train_max_shift > cifar10_facts.MAX_SHIFT:
        raise UsageError("--train-max-shift %d is more than the %d pixels the training "
                         "images are padded by; use 0..%d" % (
                             hparams.train_max_shift, cifar10_facts.MAX_SHIFT,
                             cifar10_facts.MAX_SHIFT))
    for side, _ in schedule.REDUCED_RESOLUTION_PHASES:
        _check_low_resolution_side(flag_of(side), getattr(hparams, side))
    if hparams.patch_pca_init and settings.use_synthetic_data:
        raise UsageError("--patch-pca-init starts the first convolution from the training "
                         "images' patches; --use-synthetic-data has none: drop one of them")
    if hparams.skip_learned and settings.use_synthetic_data:
        raise UsageError("--skip-learned keeps a loss per training example; "
                         "--use-synthetic-data repeats one random batch: drop one of them")
    if hparams.eval_shifts > MAX_EVAL_SHIFT:
        raise UsageError("--eval-shifts %d moves the images too far; use at most %d pixels "
                         "(training crops move them by up to 4)"
                         % (hparams.eval_shifts, MAX_EVAL_SHIFT))
    if settings.num_gpus > 0 and settings.num_cpu_towers != 1:
        raise UsageError("--num-cpu-towers applies only with --num-gpus 0")
    if settings.num_gpus == 0 and settings.variable_strategy == "GPU":
        raise UsageError("--variable-strategy GPU needs GPUs; with --num-gpus 0 use "
                         "--variable-strategy CPU")
    if (settings.num_gpus == 0 and settings.data_format == "channels_first"
            and not hardware.onednn_enabled()):
        raise UsageError("--data-format channels_first on the CPU needs TensorFlow's oneDNN "
                         "kernels, which are off here: set TF_ENABLE_ONEDNN_OPTS=1, or use "
                         "channels_last (TensorFlow's other CPU kernels are channels_last only)")
    _check_deterministic(hparams)
    trains = task is None or task.is_trainer
    if trains or (builds_towers and hparams.eval_in_training_precision):
        _check_precision_served(precision.POLICIES.get(hparams.precision), settings.num_gpus)
    if trains:
        _check_train_batch_splits(hparams, settings.num_towers)
    if not settings.use_synthetic_data and builds_towers:
        _check_data_dir(settings.data_dir)
        for subset in dict.fromkeys([periodic_eval_subset(settings), "eval"]):
            _check_eval_batch_size_divides(settings, subset)
    if builds_towers and schedule.reduced_resolution_settings(hparams):
        # Reads the data's size, so only when asked: without the flag a damaged data
        # directory is named by the data check, as before.
        _check_low_resolution_ends_before_the_run(
            dataclasses.replace(hparams, **_run_size(settings, task)))


def _check_train_batch_splits(hparams, num_towers):
    if hparams.train_batch_size % num_towers:
        raise UsageError("--train-batch-size %d does not split evenly over %d towers; use %s"
                         % (hparams.train_batch_size, num_towers,
                            train_batch_for_towers_text(hparams, num_towers)))


def train_batch_for_towers(batch_size, num_towers):
    """The multiple of num_towers nearest batch_size (the larger of two as near), at
    least one example a tower: what scripts/setup_and_run.sh trains on N GPUs."""
    return max(num_towers, (batch_size + num_towers // 2) // num_towers * num_towers)


def train_batch_for_towers_flags(hparams, num_towers):
    """The flags that train `hparams` on num_towers towers where its batch does not split
    over them: the nearest batch that does (train_batch_for_towers) and the learning rate
    scaled to it as --learning-rate-scaling linear scales it, by batch / 128 (already so
    with that option; the option itself for the batch of 128 it is meant for, unless
    --sync would scale it by the workers too; else the rate multiplied out)."""
    batch_size = train_batch_for_towers(hparams.train_batch_size, num_towers)
    flags = ["--train-batch-size", str(batch_size)]
    if hparams.learning_rate_scaling == "linear":
        return flags
    if hparams.train_batch_size == schedule.REFERENCE_BATCH_SIZE and not hparams.sync:
        return flags + ["--learning-rate-scaling", "linear"]
    return flags + ["--learning-rate", "%g" % (
        hparams.learning_rate * batch_size / hparams.train_batch_size)]


def train_batch_for_towers_text(hparams, num_towers):
    """train_batch_for_towers_flags for an error message, with the rate's arithmetic."""
    flags = train_batch_for_towers_flags(hparams, num_towers)
    batch_size = int(flags[1])
    rate = "the learning rate scaled to it"
    if hparams.learning_rate_scaling == "none":
        rate += " (%g x %d/%d)" % (hparams.learning_rate, batch_size,
                                   hparams.train_batch_size)
    return "%s, the nearest multiple of %d, with %s" % (" ".join(flags), num_towers, rate)


def _check_low_resolution_side(flag, side):
    if not job_hparams.MIN_LOW_RESOLUTION <= side < cifar10_facts.HEIGHT:
        raise UsageError("%s %d: use %d..%d pixels (the images are %d)" % (
            flag, side, job_hparams.MIN_LOW_RESOLUTION, cifar10_facts.HEIGHT - 1,
            cifar10_facts.HEIGHT))


def _check_low_resolution_ends_before_the_run(hparams):
    """hparams: with the run's data size and workers (see _run_size)."""
    end = schedule.last_step(hparams)
    if schedule.low_resolution_steps(hparams) >= end:
        given = " and ".join("%s %g" % (flag_of(epochs), getattr(hparams, epochs))
                             for _, epochs in schedule.REDUCED_RESOLUTION_PHASES
                             if getattr(hparams, epochs))
        raise UsageError("%s cover%s the whole run (%d steps, %.1f epochs): the last epochs "
                         "must train at %d pixels, the size it is evaluated at; use fewer" % (
                             given, "" if " and " in given else "s", end,
                             end / schedule.steps_per_epoch(hparams), cifar10_facts.HEIGHT))


def _check_deterministic(hparams):
    if not hparams.deterministic:
        return
    if hparams.seed is None:
        raise UsageError("--deterministic needs --seed N: without a seed every run draws "
                         "other starting weights and data")
    if hparams.precision not in ("fp32", precision.AUTO):
        raise UsageError("--deterministic runs in fp32; drop --precision %s or use "
                         "--precision fp32" % hparams.precision)


def check_gpus_present(num_gpus):
    """Raises UsageError unless TensorFlow sees num_gpus GPUs; where the NVIDIA driver lists
    more than TensorFlow sees, the error names them, what TensorFlow said about loading its
    GPU libraries, and the fix (scripts/setup_and_run.sh checks its install with it)."""
    from cifar10_estimator.machine import hardware
    available = hardware.num_gpus_visible()
    if num_gpus <= available:
        return
    asked = "--num-gpus %d asked, but %d GPU%s visible to TensorFlow" % (
        num_gpus, available, " is" if available == 1 else "s are")
    listed = hardware.driver_gpus()
    if len(listed) <= available:
        raise UsageError("%s; use --num-gpus %d (0 trains on the CPU)" % (asked, available))
    said = " ".join('"%s"' % message for message in hardware.gpu_library_messages())
    cudnn = hardware.cudnn_wheel_version()
    if cudnn:
        fix = ("TensorFlow's CUDA wheels are installed (nvidia-cudnn-cu12 %s), so check that "
               "the driver serves CUDA 12.2 (nvidia-smi shows its CUDA Version)" % cudnn)
    else:
        fix = ("TensorFlow 2.15 needs CUDA 12.2 and cuDNN 8.9: pip install -e '.[gpu]' "
               "brings them, or use the GPU image (docs/install.md#a-gpu-box)")
    raise UsageError("%s, and the NVIDIA driver lists %d (%s); TensorFlow said: %s; %s; "
                     "--num-gpus 0 trains on the CPU"
                     % (asked, len(listed), ", ".join(listed), said or "nothing", fix))


def _check_precision_served(precision_policy, num_gpus):
    if precision_policy is None or precision_policy.served_everywhere:
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
        tfrecord_format.check_tfrecords_exist(data_dir, ["train", "eval"])
    except Cifar10EstimatorError as error:
        raise UsageError(str(error))


def _check_eval_batch_size_divides(settings, subset):
    count = tfrecord_format.num_examples(subset, settings.data_dir)
    if count % settings.eval_batch_size != 0:
        raise UsageError("--eval-batch-size %d does not divide the %d %s examples; every "
                         "example is evaluated exactly once, so pick a divisor of %d"
                         % (settings.eval_batch_size, count, subset, count))


def resolve(settings, task=None):
    """The validated settings with what the data, the cluster and the machine decide:
    HParams' derived fields, and the precision --precision auto takes. (The layout inside
    the model is the devices': model_fn.TowerLayout.for_devices.) A process that
    evaluates on fewer towers than it trains on says so.

    Args:
      settings: Settings that validate accepted.
      task: the cluster.ClusterTask this process runs, or None.
    """
    if (task is None or task.evaluates) and settings.num_eval_towers < settings.num_towers:
        console.console_logger().info(
            "Evaluations run on %d of the %d towers, %d images each: --eval-batch-size %d "
            "splits evenly over no more of them, and so each example is evaluated once",
            settings.num_eval_towers, settings.num_towers,
            settings.eval_batch_size // settings.num_eval_towers, settings.eval_batch_size)
    return dataclasses.replace(settings, hparams=dataclasses.replace(
        settings.hparams, precision=_resolved_precision(settings, task),
        **_run_size(settings, task)))


def _run_size(settings, task):
    """The HParams fields the data and the cluster decide: what an epoch is in steps."""
    return dict(num_workers=task.num_trainers if task else 1,
                num_train_examples=tfrecord_format.num_examples(
                    "train", None if settings.use_synthetic_data else settings.data_dir))


def _resolved_precision(settings, task):
    """--precision, or for auto the precision this process trains in.

    A trainer says in one line what auto took and why, or how a mixed precision asked
    for by name trains on this CPU against fp32 (a warning where it is slower). The ps
    and the evaluator train nothing (evaluation computes in float32): auto takes fp32
    there without measuring.
    """
    requested = settings.hparams.precision
    if task and not task.is_trainer:
        return "fp32" if requested == precision.AUTO else requested
    from cifar10_estimator.machine import hardware, precision_speed
    if requested != precision.AUTO:
        if precision.policy(requested).is_mixed and not settings.num_gpus:
            _log_precision_line(*precision_speed.speed_line(precision.policy(requested)))
        return requested
    if settings.hparams.deterministic:
        console.console_logger().info(
            "--precision auto takes fp32: --deterministic runs in fp32")
        return "fp32"
    name, line = precision_speed.fastest_precision(
        settings.num_gpus, hardware.cpu_flags(), hardware.onednn_enabled(),
        gpu_compute_capabilities=hardware.gpu_compute_capabilities(settings.num_gpus))
    console.console_logger().info(line)
    return name


def _log_precision_line(line, is_warning):
    if is_warning:
        logging.getLogger("tensorflow").warning(line)
    else:
        console.console_logger().info(line)


def periodic_eval_subset(settings):
    """The subset evaluated during training: --eval-subset, or the test set ('eval') when
    the data has no validation set (converted with --validation-examples 0)."""
    if (settings.eval_subset == "validation" and not settings.use_synthetic_data
            and not tfrecord_format.has_subset(settings.data_dir, "validation")):
        return "eval"
    return settings.eval_subset


def subsets_read(settings, task=None):
    """The TFRecord subsets this process reads: training's, if it trains, and the evaluated
    ones, if it evaluates (alone, as a master, or as the evaluator task)."""
    if settings.use_synthetic_data:
        return []
    subsets = []
    if task is None or task.is_trainer:
        subsets.append("train")
    if task is None or task.evaluates:
        subsets += [periodic_eval_subset(settings), "eval"]
    return list(dict.fromkeys(subsets))


def eval_steps(settings, subset):
    """Steps that evaluate each example of `subset` once (one batch with synthetic data);
    validate has checked that the batch divides the subset."""
    if settings.use_synthetic_data:
        return 1
    return tfrecord_format.num_examples(subset, settings.data_dir) // settings.eval_batch_size


def markdown_table():
    """The manual's flag table (docs/training.md): each flag with its default and its help,
    a table per --help group, in --help's order."""
    fields = _fields_in_help_order()
    lines = []
    for title, description in ((None, None),) + GROUPS:
        if title:
            lines += ["", "**%s**%s" % (title.capitalize(),
                                        ": " + description if description else "")]
        lines += ["", markdown.markdown_table(["flag", "default", "meaning"], [
            ["`%s`" % _flag_with_argument(field), _default_text(field),
             field.metadata["help"] % {}]
            for field in fields if field.metadata["group"] == title])]
    return "\n".join(lines[1:])


def _flag_with_argument(field):
    """The flag, with its choices or the name its help gives the value (--train-epochs E)."""
    keywords = field.metadata["add_argument"]
    if "choices" in keywords:
        return "%s %s" % (flag_of(field.name), "|".join(keywords["choices"]))
    if "metavar" in keywords:
        return "%s %s" % (flag_of(field.name), keywords["metavar"])
    return flag_of(field.name)


def _default_text(field):
    keywords = field.metadata["add_argument"]
    if keywords.get("required"):
        return "required"
    if keywords.get("action") == "store_true":
        return "off"
    if field.default is None:
        return ""
    if isinstance(field.default, bool):
        return "true" if field.default else "false"
    if isinstance(field.default, str):
        return "`%s`" % field.default
    return "%g" % field.default


@dataclasses.dataclass(frozen=True)
class TableOptions:
    """The options of this module's command line, which prints the flag table."""

    markdown: bool = option(False, "Print it in Markdown.", action="store_true", required=True)


def main(argv):
    parser = ArgumentParser(description="Print the trainer's flag table, generated from the "
                                        "options' declarations, for docs/training.md.")
    add_options(parser, options.option_fields(TableOptions))
    options.parse(parser, TableOptions, argv)
    print(markdown_table())


if __name__ == "__main__":
    sys.exit(run_command(main))
