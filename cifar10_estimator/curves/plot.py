"""python -m cifar10_estimator.curves: the accuracy of the evaluations during training
(validation, or test for a job without a validation set) and the learning rate against
epochs, wall-clock minutes or TFLOP of training.

    python -m cifar10_estimator.curves JOB [JOB ...] --output curves.png \
        [--reference 86.97 "the paper's schedule, 182 epochs (test)"] [--x-axis minutes]

TensorBoard stays the live view; this is the picture for a README, a report or a pull
request: one PNG, each run labelled by how its hyper-parameters differ from the others'.
Needs matplotlib, the optional extra: pip install -e '.[plot]'.
"""

import dataclasses
import os
import textwrap
import typing

from cifar10_estimator import files
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import option, options_parser, parse
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.curves import runs as job_runs
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.training import compute

MATPLOTLIB_MISSING = ("drawing curves needs matplotlib, which is not installed: "
                      "pip install -e '.[plot]' (or pip install matplotlib)")
# --x-axis: what the shared horizontal axis counts.
X_AXIS_LABELS = {"epochs": "epochs", "minutes": "wall-clock minutes since the run started",
                 "tflop": "TFLOP of training"}
# The accuracy axis, by the sets the runs were evaluated on during training.
ACCURACY_LABELS = {
    ("validation",): "validation accuracy (%)",
    ("test",): "test accuracy (%), evaluated during training",
    ("test", "validation"): "accuracy (%): validation, or test where the legend says so",
}
# Marks a run evaluated on the test set during training (no validation set).
TEST_CURVE_MARK = " (test set during training)"
LEARNING_RATE_LABEL = "learning rate"


@dataclasses.dataclass(frozen=True)
class CurvesOptions:
    """The command line: the runs, the PNG, and what the figure shows."""

    job_dirs: list = option(
        None, "Job directories written by python -m cifar10_estimator.main.",
        positional=True, nargs="+", metavar="JOB")
    output: str = option(
        None, "The PNG file to write (replaced if it exists).", required=True, metavar="PNG")
    reference: list = option(
        [], "A horizontal line at an accuracy, e.g. a longer run's test accuracy to compare "
            "with (may be repeated).",
        nargs=2, action="append", metavar=("PERCENT", "LABEL"))
    accuracy_min: typing.Optional[float] = option(
        None, "The lowest accuracy the upper panel shows (default: the lowest point), to "
              "look closely at the end of the runs.",
        type=float, metavar="PERCENT")
    x_axis: str = option(
        "epochs", "epochs of the training set, minutes since each run started (time to "
                  "accuracy; the test result is drawn as a star where the run wrote it, at "
                  "the end of the whole command), or TFLOP of training as the trainer counts "
                  "them (compute to accuracy, the same on every machine).",
        choices=sorted(X_AXIS_LABELS))
    title: typing.Optional[str] = option(None, "The figure's title.")


def build_parser():
    return options_parser(
        CurvesOptions,
        description="Draw the accuracy of the evaluations during training (on the "
                    "validation set, or on the test set for a job without one) and the "
                    "learning rate of training runs against epochs, from their job "
                    "directories' event files, into a PNG.")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise Cifar10EstimatorError(MATPLOTLIB_MISSING)
    matplotlib.use("Agg")  # files only: no screen needed
    import matplotlib.pyplot as pyplot
    return pyplot


# Inches: the two panels, and each line of the legend below them.
PANELS_HEIGHT = 7.0
LEGEND_LINE_HEIGHT = 0.22
# Characters of a legend line that fit the figure's 9 inches in the small font; longer
# labels wrap rather than run off the image.
LEGEND_LINE_CHARACTERS = 140


def _with_test_result(run, label, x_axis):
    if run.evaluated_on == "test":
        label += TEST_CURVE_MARK
    if run.test_accuracy is None:
        return label
    label = "%s: test %.2f %%" % (label, 100 * run.test_accuracy)
    if x_axis == "minutes":
        label += " at %.1f min" % run.test_minutes
    elif x_axis == "tflop":
        label += " after %s TFLOP" % compute.tflop_text(run.training_tflop)
    return label


def _legend_text(label):
    return textwrap.fill(label, LEGEND_LINE_CHARACTERS, subsequent_indent="    ",
                         break_on_hyphens=False)


def figure(pyplot, runs, labels, references=(), title=None, accuracy_min=None,
           x_axis="epochs"):
    """The matplotlib Figure: accuracy above, learning rate below, one shared axis of
    epochs, minutes or TFLOP (`x_axis`), and the legend under both (long labels would hide
    the curves inside a panel)."""
    in_minutes = x_axis == "minutes"
    run_labels = [_legend_text(_with_test_result(run, label, x_axis))
                  for run, label in zip(runs, labels)]
    reference_labels = [_legend_text("%s: %.2f %%" % (label, percent))
                        for percent, label in references]
    num_lines = sum(label.count("\n") + 1 for label in run_labels + reference_labels)
    legend_height = LEGEND_LINE_HEIGHT * num_lines + 0.3
    fig, (accuracy_axes, rate_axes) = pyplot.subplots(
        2, 1, sharex=True, figsize=(9, PANELS_HEIGHT + legend_height),
        gridspec_kw={"height_ratios": [3, 1]})
    for run, label in zip(runs, run_labels):
        accuracy_points, rate_points = run.points(x_axis)
        positions, accuracies = zip(*accuracy_points)
        line, = accuracy_axes.plot(positions, [100 * value for value in accuracies],
                                   marker=".", label=label)
        if in_minutes and run.test_accuracy is not None:
            accuracy_axes.plot([run.test_minutes], [100 * run.test_accuracy], marker="*",
                               markersize=10, color=line.get_color())
        if rate_points:
            rate_positions, rates = zip(*rate_points)
            rate_axes.plot(rate_positions, rates, color=line.get_color())
    for (percent, _), label in zip(references, reference_labels):
        accuracy_axes.axhline(percent, color="black", linestyle="--", linewidth=1,
                              label=label)
    accuracy_axes.set_ylabel(ACCURACY_LABELS[tuple(sorted({run.evaluated_on for run in runs}))])
    if accuracy_min is not None:
        accuracy_axes.set_ylim(bottom=accuracy_min)
    accuracy_axes.grid(alpha=0.3)
    rate_axes.set_ylabel(LEARNING_RATE_LABEL)
    rate_axes.set_xlabel(X_AXIS_LABELS[x_axis])
    rate_axes.grid(alpha=0.3)
    if title:
        accuracy_axes.set_title(title)
    fig.tight_layout(rect=(0, legend_height / fig.get_figheight(), 1, 1))
    handles, texts = accuracy_axes.get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower left", fontsize="small", frameon=False,
               bbox_to_anchor=(0.02, 0.0))
    return fig


def save_png(fig, path):
    """Write the figure to `path` whole or not at all (files.written_whole)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError("--output %s: the folder %s does not exist" % (path, folder))
    with files.written_whole(path) as temporary:
        fig.savefig(temporary, format="png", dpi=100)


def main(argv):
    args = parse(build_parser(), CurvesOptions, argv)
    references = []
    for percent, label in args.reference:
        try:
            references.append((float(percent), label))
        except ValueError:
            raise UsageError("--reference %s %s: the first value must be a percentage, "
                             "e.g. 86.97" % (percent, label))
    pyplot = _pyplot()
    quiet_tensorflow_logs("3", "ERROR")
    runs = [job_runs.read_run(job_dir) for job_dir in args.job_dirs]
    labels = job_runs.labels(runs)
    fig = figure(pyplot, runs, labels, references, args.title, args.accuracy_min, args.x_axis)
    save_png(fig, args.output)
    for run, label in zip(runs, labels):
        last_epoch, last_accuracy = run.accuracy[-1]
        last_minutes, _ = run.accuracy_minutes[-1]
        last_tflop, _ = run.accuracy_tflop[-1]
        print("%s: %d %s points to epoch %.1f (%.1f min, %s TFLOP), last %.2f %%%s" % (
            label, len(run.accuracy), run.evaluated_on, last_epoch, last_minutes,
            compute.tflop_text(last_tflop), 100 * last_accuracy,
            "" if run.test_accuracy is None else ", test %.2f %% at %.1f min" % (
                100 * run.test_accuracy, run.test_minutes)))
    print("wrote %s" % args.output)


def console_main():
    raise SystemExit(run_command(main))
