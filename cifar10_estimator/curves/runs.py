"""Training runs read back from their job directories, and labels that tell them apart."""

import dataclasses
import glob
import json
import os
import typing

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import report
from cifar10_estimator.cli.options import flag_of, option_fields
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.run import evaluation_dirs
from cifar10_estimator.settings import schedule

# Where the trainer writes what is drawn: the evaluations during training on the
# validation set, or where there are none on the test set (evaluation_dirs), and in the
# job dir itself the training summaries.
EVALUATION_FOLDERS = (("validation", evaluation_dirs.VALIDATION_DIR),
                      ("test", evaluation_dirs.TEST_DURING_TRAINING_DIR))
ACCURACY_TAG = "accuracy"
LEARNING_RATE_TAG = "learning_rate"


@dataclasses.dataclass(frozen=True)
class Run:
    """One job directory's curves, in epochs of its training set, in wall-clock minutes and
    in TFLOP of training.

    Minutes count from the job's start (when its first run started, as hparams.json
    records it, or its first training summary, whichever came first) to when a value was
    written; a job stopped and resumed counts the pause too. TFLOP are the training compute up to a value's global step, as
    the trainer counts it from the run's hyper-parameters (training.compute).

    Attributes:
      job_dir: where it was read.
      hparams: the HParams it trained with.
      accuracy: [(epoch, accuracy 0..1)] of the evaluations during training.
      learning_rate: [(epoch, rate)] of the training summaries.
      test_accuracy: the one final test evaluation (0..1), None before it ran.
      accuracy_minutes, learning_rate_minutes: the same values against minutes.
      test_minutes: when the test result was written, in minutes, or None.
      accuracy_tflop, learning_rate_tflop: the same values against TFLOP of training.
      training_tflop: the whole run's training compute in TFLOP.
      data_format: the layout its network computed in, as hparams.json records it beside
        the HParams (the devices chose it), or None.
      evaluated_on: the set `accuracy` was measured on, "validation" or "test".
    """

    job_dir: str
    hparams: job_hparams.HParams
    accuracy: list
    learning_rate: list
    test_accuracy: typing.Optional[float]
    accuracy_minutes: list = dataclasses.field(default_factory=list)
    learning_rate_minutes: list = dataclasses.field(default_factory=list)
    test_minutes: typing.Optional[float] = None
    data_format: typing.Optional[str] = None
    evaluated_on: str = "validation"
    accuracy_tflop: list = dataclasses.field(default_factory=list)
    learning_rate_tflop: list = dataclasses.field(default_factory=list)
    training_tflop: typing.Optional[float] = None

    def points(self, x_axis):
        """(accuracy points, learning rate points) against x_axis: 'epochs', 'minutes' or
        'tflop'."""
        return {"epochs": (self.accuracy, self.learning_rate),
                "minutes": (self.accuracy_minutes, self.learning_rate_minutes),
                "tflop": (self.accuracy_tflop, self.learning_rate_tflop)}[x_axis]


def read_run(job_dir):
    """The Run of a job directory the trainer wrote.

    Raises:
      Cifar10EstimatorError: no hparams.json, or no evaluation during training yet.
    """
    hparams, data_format = job_hparams.load_record(job_dir)
    epochs_per_step = hparams.examples_per_global_step / hparams.num_train_examples
    evaluated_on, evaluations = _evaluations_during_training(job_dir)
    from cifar10_estimator import compute_accounting  # lazy: keeps curves' --help fast
    training_compute = compute_accounting.training_compute(hparams)
    rates = _scalar_by_step(job_dir, LEARNING_RATE_TAG)
    start = _start_time(job_dir, job_hparams.load_runs(job_dir)[0])
    test_path = os.path.join(job_dir, report.TEST_RESULTS_FILENAME)
    test_accuracy = _test_accuracy(job_dir)
    return Run(job_dir=job_dir, hparams=hparams,
               accuracy=_against(evaluations, lambda step, _: step * epochs_per_step),
               learning_rate=_against(rates, lambda step, _: step * epochs_per_step),
               test_accuracy=test_accuracy,
               accuracy_minutes=_against(
                   evaluations, lambda _, wall_time: (wall_time - start) / 60),
               learning_rate_minutes=_against(
                   rates, lambda _, wall_time: (wall_time - start) / 60),
               test_minutes=None if test_accuracy is None
               else (os.path.getmtime(test_path) - start) / 60,
               data_format=data_format, evaluated_on=evaluated_on,
               accuracy_tflop=_against(
                   evaluations, lambda step, _: training_compute.flops(0, step) / 1e12),
               learning_rate_tflop=_against(
                   rates, lambda step, _: training_compute.flops(0, step) / 1e12),
               training_tflop=training_compute.flops() / 1e12)


def _evaluations_during_training(job_dir):
    """(the set, {global step: (wall time, accuracy)}) of the job's evaluations during
    training: on the validation set, or where there are none, on the test set.

    Raises:
      Cifar10EstimatorError: neither has an evaluation yet.
    """
    for evaluated_on, folder in EVALUATION_FOLDERS:
        values = _scalar_by_step(os.path.join(job_dir, folder), ACCURACY_TAG)
        if values:
            return evaluated_on, values
    raise Cifar10EstimatorError(
        "%s has no evaluation during training yet (event files under %s/, or %s/ for the "
        "test set): the trainer writes them when it evaluates a checkpoint"
        % ((job_dir,) + tuple(folder for _, folder in EVALUATION_FOLDERS)))


def _against(values_by_step, x_of):
    """[(x, value)] in step order, x_of(step, wall time) giving each point's x."""
    return [(x_of(step, wall_time), value)
            for step, (wall_time, value) in sorted(values_by_step.items())]


def _start_time(job_dir, first_run):
    """When the job started (seconds since the epoch): the earlier of its first run's
    start (the TrainingRun first_run; in a file of the earlier format, which kept no
    time, the file's own time) and the first event of any training event file."""
    import tensorflow as tf  # lazy: keeps curves' --help and flag errors fast
    times = [first_run.start_time if first_run.start_time is not None
             else os.path.getmtime(os.path.join(job_dir, job_hparams.HPARAMS_FILENAME))]
    for path in glob.glob(os.path.join(job_dir, "events.out.tfevents.*")):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                times.append(event.wall_time)
                break
        except tf.errors.DataLossError:
            pass
    return min(times)


def _scalar_by_step(folder, tag):
    """{global step: (wall time, value)} of `tag` in the event files directly in `folder`.

    A resumed run writes a new event file that may repeat steps: the later file wins.
    """
    import tensorflow as tf  # lazy: keeps curves' --help and flag errors fast
    values = {}
    paths = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    for path in sorted(paths, key=os.path.getmtime):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag == tag:
                        values[event.step] = (event.wall_time, _scalar_value(value))
        except tf.errors.DataLossError:
            pass  # the file is still being written: its last record is cut short
    return values


def _scalar_value(value):
    """A summary value's number: simple_value (tf.compat.v1) or a scalar tensor (TF 2)."""
    import tensorflow as tf  # lazy: keeps curves' --help and flag errors fast
    if value.HasField("tensor"):
        return float(tf.make_ndarray(value.tensor))
    return float(value.simple_value)


def _test_accuracy(job_dir):
    path = os.path.join(job_dir, report.TEST_RESULTS_FILENAME)
    try:
        with open(path) as stream:
            return float(json.load(stream)["accuracy"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def labels(runs):
    """One label per run: the hyper-parameters that differ between the runs, as flags.

    A field none of the runs differ in is left out; runs that differ in nothing (or a
    single run) are named by their job directory, which is also added where two labels
    would otherwise be the same.
    """
    values = [_used_values(run) for run in runs]
    differing = [name for name in values[0]
                 if len({json.dumps(value[name]) for value in values}) > 1]
    texts = [", ".join(_as_flag(name, value[name]) for name in differing
                       if value[name] is not _UNUSED) for value in values]
    names = [os.path.basename(os.path.normpath(run.job_dir)) for run in runs]
    return [text if text and texts.count(text) == 1 else
            ("%s (%s)" % (name, text) if text else name)
            for text, name in zip(texts, names)]


# Stands for a field the run's training did not read: equal to itself, shown as nothing.
_UNUSED = "(unused)"
# The recorded fields a hyper-parameter's flag sets; the others read as their names.
_FLAGGED = {field.name for field in option_fields(job_hparams.HParams)}


def _used_values(run):
    """The run's recorded fields as a dict, _UNUSED where the run's schedule ignores the
    field, so that runs recorded with different defaults for it are not told apart by it."""
    values = job_hparams.record(run.hparams, run.data_format)
    for name in schedule.unused_fields(run.hparams):
        values[name] = _UNUSED
    return values


def _as_flag(name, value):
    """How a field's value reads on the trainer's command line, e.g. '--nesterov'; a field
    no hyper-parameter's flag sets reads as its name, e.g. 'num workers 2'."""
    if name not in _FLAGGED:
        return "%s %s" % (name.replace("_", " "), value)
    flag = flag_of(name)
    if value is True:
        return flag
    if value is False or value is None:
        return "no " + flag
    return "%s %s" % (flag, "%g" % value if isinstance(value, float) else value)
