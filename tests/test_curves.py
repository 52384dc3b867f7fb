"""python -m cifar10_estimator.curves: real event files of trained jobs drawn into a PNG."""

import dataclasses
import json
import os
import shutil

import pytest
from PIL import Image

from cifar10_estimator import compute_accounting
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import report
from cifar10_estimator.curves import plot, runs
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.training import compute
from cli_helpers import REPO_ROOT, assert_one_line_error, run_module

pytest_plugins = ["trained_job"]
MODULE = "cifar10_estimator.curves"
# trained_job: 64 training examples at 8 per step, evaluated at steps 5 and 10.
EPOCHS_PER_STEP = 8 / 64


@pytest.fixture
def two_jobs(trained_job, tmp_path):
    """The trained job and a copy of it whose hparams.json says learning rate 0.05."""
    other = tmp_path / "other-job"
    shutil.copytree(trained_job.job_dir, str(other))
    path = other / job_hparams.HPARAMS_FILENAME
    content = json.loads(path.read_text())
    content["runs"][-1]["hparams"]["learning_rate"] = 0.05
    path.write_text(json.dumps(content))
    return trained_job.job_dir, str(other)


def test_the_png_shows_each_run_labelled_by_what_differs(two_jobs, tmp_path):
    output = tmp_path / "curves.png"
    result = run_module(MODULE, list(two_jobs) + [
        "--output", output, "--reference", "86.97", "a longer run", "--accuracy-min", "5"])
    assert result.returncode == 0, result.stderr[-3000:]
    with Image.open(str(output)) as image:
        # 9 x 7 inches of panels at 100 dpi, and below them a legend of three lines.
        assert image.format == "PNG" and image.size[0] == 900 and image.size[1] > 700
    lines = result.stdout.splitlines()
    assert lines[0].startswith("--learning-rate 0.1: 2 validation points to epoch 1.2 (")
    assert " min, " in lines[0] and " TFLOP), last " in lines[0]
    assert " min" in lines[0].rsplit("test", 1)[1]
    assert lines[1].startswith("--learning-rate 0.05: 2 validation points to epoch 1.2 (")
    assert lines[-1] == "wrote %s" % output
    assert not [name for name in os.listdir(str(tmp_path)) if name.endswith(".tmp")]


def test_the_png_is_as_readable_as_a_file_written_plainly(tmp_path):
    pyplot = plot._pyplot()
    fig = pyplot.figure(figsize=(1, 1))
    old_umask = os.umask(0o022)
    try:
        plot.save_png(fig, str(tmp_path / "curves.png"))
        with open(str(tmp_path / "plain"), "w"):
            pass
    finally:
        os.umask(old_umask)
        pyplot.close(fig)
    assert os.stat(str(tmp_path / "curves.png")).st_mode & 0o777 == 0o644
    assert sorted(os.listdir(str(tmp_path))) == ["curves.png", "plain"]


def test_runs_of_other_layouts_are_told_apart_by_the_layout_hparams_json_records():
    def run(data_format):
        return runs.Run(job_dir="/x/%s" % data_format, hparams=job_hparams.DEFAULTS,
                        accuracy=[], learning_rate=[], test_accuracy=None,
                        data_format=data_format)
    assert runs.labels([run("channels_first"), run("channels_last")]) == [
        "data format channels_first", "data format channels_last"]


def test_the_axis_is_epochs_of_the_training_set(trained_job):
    run = runs.read_run(trained_job.job_dir)
    assert run.evaluated_on == "validation"
    assert [epoch for epoch, _ in run.accuracy] == [5 * EPOCHS_PER_STEP, 10 * EPOCHS_PER_STEP]
    assert all(0 <= accuracy <= 1 for _, accuracy in run.accuracy)
    assert run.learning_rate and all(rate == pytest.approx(0.1) for _, rate in run.learning_rate)
    assert run.test_accuracy is not None
    pyplot = plot._pyplot()
    fig = plot.figure(pyplot, [run], ["the run"], [(50.0, "half")], accuracy_min=2.5)
    accuracy_axes, rate_axes = fig.axes
    assert accuracy_axes.get_ylim()[0] == 2.5
    assert rate_axes.get_xlabel() == "epochs"
    assert accuracy_axes.get_ylabel() == "validation accuracy (%)"
    drawn = accuracy_axes.get_lines()[0]
    assert list(drawn.get_xdata()) == [0.625, 1.25]
    assert list(drawn.get_ydata()) == [100 * value for _, value in run.accuracy]
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend == ["the run: test %.2f %%" % (100 * run.test_accuracy), "half: 50.00 %"]
    pyplot.close(fig)


def test_labels_name_only_the_differences_and_fall_back_to_the_folder(trained_job):
    run = runs.read_run(trained_job.job_dir)
    alike = [run, runs.Run("/x/seed-run", run.hparams, [], [], None,
                           data_format=run.data_format)]
    assert runs.labels(alike) == ["job", "seed-run"]
    other = dataclasses.replace(run, hparams=dataclasses.replace(
        run.hparams, nesterov=True, moving_average_decay=0.999))
    assert runs.labels([run, other]) == ["no --nesterov, no --moving-average-decay",
                                         "--nesterov, --moving-average-decay 0.999"]


def test_labels_leave_out_what_the_schedule_does_not_read(trained_job):
    run = runs.read_run(trained_job.job_dir)
    cosine = dataclasses.replace(run.hparams, learning_rate_schedule="cosine")
    # Cosine runs recorded with other drops (an older default) train alike on that count.
    recorded_apart = [dataclasses.replace(run, job_dir="/x/a", hparams=dataclasses.replace(
                          cosine, learning_rate_drops="paper", train_epochs=15.0)),
                      dataclasses.replace(run, job_dir="/x/b", hparams=dataclasses.replace(
                          cosine, learning_rate_drops=None, train_epochs=30.0))]
    assert runs.labels(recorded_apart) == ["--train-epochs 15", "--train-epochs 30"]
    # A piecewise run's drops are its own, and named beside a run that has none.
    piecewise = dataclasses.replace(recorded_apart[0], hparams=dataclasses.replace(
        recorded_apart[0].hparams, learning_rate_schedule="piecewise"))
    assert runs.labels([piecewise, recorded_apart[1]]) == [
        "--train-epochs 15, --learning-rate-drops paper, --learning-rate-schedule piecewise",
        "--train-epochs 30, --learning-rate-schedule cosine"]


def test_without_matplotlib_it_says_what_to_install(trained_job, tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    output = tmp_path / "curves.png"
    result = run_module(MODULE, [trained_job.job_dir, "--output", output], env={
        "PYTHONPATH": str(shadow.parent) + os.pathsep + REPO_ROOT})
    assert_one_line_error(result, 1, "needs matplotlib", "pip install -e '.[plot]'")
    assert not output.exists()


def test_a_job_without_a_validation_set_is_drawn_from_its_test_evaluations(
        trained_job, tmp_path):
    # A job trained on data with no validation set evaluates on the test set during
    # training, into job-dir/eval/ (main.make_eval_spec): here the trained job's own
    # evaluations, moved there, and a job with the validation curve beside it.
    job_dir = tmp_path / "all-training-images"
    shutil.copytree(trained_job.job_dir, str(job_dir))
    os.rename(str(job_dir / "eval_validation"), str(job_dir / "eval"))
    run = runs.read_run(str(job_dir))
    assert run.evaluated_on == "test"
    assert run.accuracy == runs.read_run(trained_job.job_dir).accuracy
    pyplot = plot._pyplot()
    fig = plot.figure(pyplot, [run], ["the run"])
    assert fig.axes[0].get_ylabel() == "test accuracy (%), evaluated during training"
    assert [text.get_text() for text in fig.legends[0].get_texts()] == [
        "the run (test set during training): test %.2f %%" % (100 * run.test_accuracy)]
    pyplot.close(fig)
    output = tmp_path / "both.png"
    result = run_module(MODULE, [trained_job.job_dir, job_dir, "--output", output])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("%s: 2 validation points to epoch 1.2 (" % trained_job.job_dir
                               .rstrip("/").rsplit("/", 1)[1])
    assert lines[1].startswith("all-training-images: 2 test points to epoch 1.2 (")
    assert output.exists()


def test_a_job_with_no_evaluation_yet_is_named_with_both_folders(trained_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(trained_job.job_dir, str(job_dir))
    shutil.rmtree(str(job_dir / "eval_validation"))
    with pytest.raises(Cifar10EstimatorError) as raised:
        runs.read_run(str(job_dir))
    assert str(raised.value).startswith(
        "%s has no evaluation during training yet (event files under eval_validation/, "
        "or eval/ for the test set)" % job_dir)


def test_a_folder_that_is_not_a_job_gets_one_line(tmp_path):
    result = run_module(MODULE, [tmp_path, "--output", tmp_path / "curves.png"])
    assert_one_line_error(result, 1, "hparams.json is missing")


def test_minutes_count_from_the_runs_start_to_each_evaluation_and_the_test_result(
        trained_job, tmp_path):
    run = runs.read_run(trained_job.job_dir)
    minutes = [value for value, _ in run.accuracy_minutes]
    assert [accuracy for _, accuracy in run.accuracy_minutes] == [
        accuracy for _, accuracy in run.accuracy]
    assert 0 < minutes[0] < minutes[1] <= run.test_minutes
    # Minutes, not seconds: from the run's start to its test result is less than from its
    # data's writing (which came before the run) to then, in seconds.
    test_written = os.path.getmtime(os.path.join(trained_job.job_dir,
                                                 report.TEST_RESULTS_FILENAME))
    data_written = os.path.getmtime(os.path.join(trained_job.data_dir, "train.tfrecords"))
    assert run.test_minutes * 60 <= test_written - data_written
    assert [rate for _, rate in run.learning_rate_minutes] == [
        rate for _, rate in run.learning_rate]
    output = tmp_path / "minutes.png"
    result = run_module(MODULE, [trained_job.job_dir, "--output", output, "--x-axis", "minutes"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert output.exists()
    fig = plot.figure(plot._pyplot(), [run], ["the run"], x_axis="minutes")
    accuracy_axes, rate_axes = fig.axes
    assert rate_axes.get_xlabel() == "wall-clock minutes since the run started"
    curve, star = accuracy_axes.get_lines()
    assert list(curve.get_xdata()) == minutes
    assert list(star.get_xdata()) == [run.test_minutes]
    assert list(star.get_ydata()) == [100 * run.test_accuracy]


def test_tflop_are_the_training_compute_to_each_evaluation_as_the_trainer_counts_it(
        trained_job, tmp_path):
    run = runs.read_run(trained_job.job_dir)
    training_compute = compute_accounting.training_compute(run.hparams)
    # trained_job: evaluated at steps 5 and 10 of its 10.
    tflop = [training_compute.flops(0, 5) / 1e12, training_compute.flops() / 1e12]
    assert [value for value, _ in run.accuracy_tflop] == tflop
    assert run.training_tflop == tflop[-1]
    with open(os.path.join(trained_job.job_dir, report.TEST_RESULTS_FILENAME)) as stream:
        assert json.load(stream)["training_compute"]["tflop"] == pytest.approx(tflop[-1])
    assert [rate for _, rate in run.learning_rate_tflop] == [
        rate for _, rate in run.learning_rate]
    output = tmp_path / "tflop.png"
    result = run_module(MODULE, [trained_job.job_dir, "--output", output, "--x-axis", "tflop"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert output.exists()
    fig = plot.figure(plot._pyplot(), [run], ["the run"], x_axis="tflop")
    accuracy_axes, rate_axes = fig.axes
    assert rate_axes.get_xlabel() == "TFLOP of training"
    [curve] = accuracy_axes.get_lines()
    assert list(curve.get_xdata()) == tflop
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend[0].endswith(" after %s TFLOP" % compute.tflop_text(tflop[-1]))


def test_a_long_legend_label_wraps_to_lines_that_fit_the_figure():
    label = ", ".join("--flag-number-%d %d" % (i, i) for i in range(20)) + ": test 86.93 %"
    text = plot._legend_text(label)
    lines = text.split("\n")
    assert len(lines) > 1
    assert all(len(line) <= plot.LEGEND_LINE_CHARACTERS for line in lines)
    assert " ".join(line.strip() for line in lines) == label
