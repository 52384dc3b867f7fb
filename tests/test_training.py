"""Training through the real CLI in a subprocess, on tiny TFRecords and ResNet-8."""

import glob
import json
import os
import pathlib
import re
import shutil
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.run import job_dir_lock
from cli_helpers import run_module, start_module

pytest_plugins = ["trained_job"]
MODULE = "cifar10_estimator.main"
pytestmark = pytest.mark.slow


def trainer_args(data_dir, job_dir, *extra):
    return ["--data-dir", data_dir, "--job-dir", job_dir, "--num-gpus", "0",
            "--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8",
            "--eval-every-secs", "1"] + list(extra)


def checkpoint_steps(job_dir):
    return sorted(int(re.search(r"model\.ckpt-(\d+)\.index$", path).group(1))
                  for path in glob.glob(os.path.join(str(job_dir), "model.ckpt-*.index")))


def resume_step(job_dir):
    """Step of the checkpoint a rerun resumes from (the one job_dir's "checkpoint" file
    names: a checkpoint's files are complete before it is named there), or None."""
    path = tf.train.latest_checkpoint(str(job_dir))
    return int(path.rsplit("-", 1)[1]) if path else None


def eval_metrics(job_dir, eval_folder="eval_validation"):
    """{global_step: {tag: value}} read from the event files under job_dir/eval_folder."""
    metrics = {}
    for path in glob.glob(os.path.join(str(job_dir), eval_folder, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                metrics.setdefault(event.step, {})[value.tag] = value.simple_value
    return metrics


def train_log(job_dir, since=0, name="train.log"):
    """The job's log file (TensorFlow's whole log), from character `since` on: a rerun
    appends to it."""
    path = os.path.join(str(job_dir), name)
    if not os.path.exists(path):
        return ""
    with open(path) as log:
        return log.read()[since:]


def assert_trained_and_evaluated(result, job_dir, train_steps):
    assert result.returncode == 0, result.stderr[-5000:]
    assert checkpoint_steps(job_dir)[-1] == train_steps
    final = eval_metrics(job_dir)[train_steps]
    assert 0.0 <= final["accuracy"] <= 1.0
    assert final["loss"] > 0
    # The tutorial's lines are in the job's log, not on the console.
    log = train_log(job_dir)
    assert "Average examples/sec:" in log
    assert re.search(r"learning_rate = 0\.1, loss = [0-9.]+", log)
    assert "Average examples/sec:" not in result.stderr


def test_one_tower_trains_checkpoints_and_evaluates(tiny_data_dir, tmp_path):
    # 15 steps: the throughput line comes every 10 steps, once the first has started its clock.
    job_dir = tmp_path / "job"
    result = run_module(MODULE, trainer_args(tiny_data_dir, job_dir, "--train-steps", "15"))
    assert_trained_and_evaluated(result, job_dir, 15)
    assert "Final evaluation:" in train_log(job_dir)
    assert re.search(r"^evaluation of step 15 on the validation set: accuracy [0-9.]+ %, "
                     r"loss [0-9.]+, \d+ s$", result.stderr, re.M), result.stderr[-3000:]
    # Where the run is and when it ends, at least when its last step is done: what is
    # left to go then is the final evaluations.
    assert re.search(r"^step 15/15 \(100 %\), \d+ examples/sec, about \d+ s to go$",
                     result.stderr, re.M), result.stderr[-3000:]


def test_validation_during_training_and_one_test_evaluation_at_the_end(trained_job):
    # trained_job: 10 steps, a checkpoint every 5.
    result, job_dir = trained_job.result, pathlib.Path(trained_job.job_dir)
    # Evaluations during training: the validation set, in the Estimator's folder for it.
    assert 10 in eval_metrics(job_dir, "eval_validation")
    assert not (job_dir / "eval").exists()
    # The test set: once, on the final checkpoint.
    test_events = eval_metrics(job_dir, "eval_test")
    assert list(test_events) == [10]
    with open(str(job_dir / "test_results.json")) as stream:
        results = json.load(stream)
    assert results["num_examples"] == 32 and results["global_step"] == 10
    assert results["checkpoint"].endswith("model.ckpt-10")
    assert abs(results["accuracy"] - test_events[10]["accuracy"]) < 1e-6
    assert results["weights"] == "trained"
    assert "Test accuracy: %.4f on 32 examples (checkpoint model.ckpt-10); weights: trained" \
        % results["accuracy"] in result.stderr
    # The closing summary says where things are and what to run next.
    assert "validation accuracy" in result.stdout and "test accuracy" in result.stdout
    assert str(job_dir / "export" / "best") in result.stdout
    assert "cifar10_estimator.serving.predict --export-dir" in result.stdout
    assert "tensorboard --logdir %s" % job_dir in result.stdout
    # 10 steps end long before epoch 82: the log says the rate never drops, once.
    assert result.stderr.count("ends before the first learning-rate drop") == 1


def test_averaged_weights_flips_precision_auto_and_eval_subset_are_recorded_and_evaluate_agrees(
        tiny_data_dir, tmp_path):
    job_dir = tmp_path / "job"
    result = run_module(MODULE, trainer_args(tiny_data_dir, job_dir, "--train-steps", "5",
                                             "--moving-average-decay", "0.9", "--eval-flips",
                                             "--precision", "auto", "--eval-subset", "eval"))
    assert result.returncode == 0, result.stderr[-5000:]
    assert_evaluated_on_test_during_training_without_best_export(
        result, job_dir, "--eval-subset eval")
    hparams = json.loads((job_dir / "hparams.json").read_text())["runs"][-1]["hparams"]
    assert (hparams["moving_average_decay"], hparams["eval_flips"]) == (0.9, True)
    # --precision auto says what it took and records it, not "auto".
    chosen = re.search(r"--precision auto: (\w+) \(", result.stderr).group(1)
    assert chosen in ("fp32", "bf16")
    assert hparams["precision"] == chosen
    results = json.loads((job_dir / "test_results.json").read_text())
    assert results["weights"] == "moving average, decay 0.9"
    assert "Test accuracy: %.4f on 32 examples (checkpoint model.ckpt-5); weights: moving " \
           "average, decay 0.9" % results["accuracy"] in result.stderr

    # evaluate rebuilds the model from hparams.json: the same weights, the same flips.
    evaluated = run_module("cifar10_estimator.serving.evaluate", [
        "--job-dir", job_dir, "--data-dir", tiny_data_dir, "--json", tmp_path / "eval.json"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "weights: moving average, decay 0.9" in evaluated.stdout
    assert json.loads((tmp_path / "eval.json").read_text())["accuracy"] == pytest.approx(
        results["accuracy"])


def final_weights(job_dir):
    """{variable name: value} of the job's last checkpoint."""
    reader = tf.train.load_checkpoint(str(job_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def test_the_same_seed_trains_the_same_weights_and_another_seed_others(trained_job, tmp_path):
    # trained_job trained with --seed 7: its arguments train it again, with 7 and with 8,
    # with one checkpoint, at the end, and so one evaluation instead of two (checkpoints
    # and evaluations do not change what training computes).
    job_dirs = {"first": pathlib.Path(trained_job.job_dir)}
    for name, seed in (("again", "7"), ("other", "8")):
        job_dirs[name] = tmp_path / name
        args = trained_job.args_for(job_dirs[name], seed=seed, save_checkpoints_steps=10)
        result = run_module(MODULE, args)
        assert result.returncode == 0, result.stderr[-5000:]
    runs = {}
    for (name, job_dir), seed in zip(job_dirs.items(), (7, 7, 8)):
        recorded = json.loads((job_dir / "hparams.json").read_text())["runs"][-1]["hparams"]
        assert recorded["seed"] == seed
        runs[name] = final_weights(job_dir)
    kernel = next(name for name in runs["first"] if name.endswith("conv2d/kernel"))
    for name, value in runs["first"].items():
        assert np.array_equal(value, runs["again"][name]), name
    assert not np.allclose(runs["first"][kernel], runs["other"][kernel])


def without_validation_set(tiny_data_dir, tmp_path):
    """A copy of tiny_data_dir as `generate_tfrecords --validation-examples 0` leaves it."""
    data_dir = tmp_path / "data"
    shutil.copytree(str(tiny_data_dir), str(data_dir))
    os.remove(str(data_dir / "validation.tfrecords"))
    metadata = data_dir / "cifar10_metadata.json"
    content = json.loads(metadata.read_text())
    del content["num_examples"]["validation"]
    metadata.write_text(json.dumps(content))
    return data_dir


def assert_evaluated_on_test_during_training_without_best_export(result, job_dir, reason):
    """A 5-step run that evaluated on the test set during training, for `reason`."""
    assert "Evaluating on the test set during training (%s)" % reason in result.stderr
    assert 5 in eval_metrics(job_dir, "eval")
    assert glob.glob(str(job_dir / "export" / "latest" / "*" / "saved_model.pb"))
    assert not (job_dir / "export" / "best").exists()
    with open(str(job_dir / "test_results.json")) as stream:
        assert json.load(stream)["global_step"] == 5
    assert "validation accuracy" not in result.stdout


def test_without_a_validation_set_training_evaluates_on_test_and_keeps_no_best_export(
        tiny_data_dir, tmp_path):
    # --eval-subset eval, the other way to evaluate on the test set, is checked by the
    # averaged-weights run above.
    job_dir = tmp_path / "job"
    data_dir = without_validation_set(tiny_data_dir, tmp_path)
    result = run_module(MODULE, trainer_args(data_dir, job_dir, "--train-steps", "5"))
    assert result.returncode == 0, result.stderr[-5000:]
    assert_evaluated_on_test_during_training_without_best_export(
        result, job_dir, "%s has no validation set" % data_dir)


def test_train_epochs_fits_the_drops_and_a_rerun_continues_with_a_new_schedule(
        tiny_data_dir, tmp_path):
    # 64 training examples in batches of 8: 8 steps per epoch.
    job_dir = tmp_path / "job"
    first = run_module(MODULE, trainer_args(tiny_data_dir, job_dir, "--train-epochs", "1"))
    assert first.returncode == 0, first.stderr[-5000:]
    assert "Training to step 8 (1.0 epochs of 64 examples at 8 per step); learning rate 0.1, " \
           "x0.1 after step 4, x0.01 after step 6" in first.stderr
    assert checkpoint_steps(job_dir)[-1] == 8
    assert "ends before the first learning-rate drop" not in first.stderr

    # A rerun with a new length, rate and shape continues from the saved step, its schedule
    # computed from step 0 of the new run: the step it starts at, 8, is a third of the way
    # down the line from 0.05 to 0 at step 24.
    logged_before = len(train_log(job_dir))
    rerun = run_module(MODULE, trainer_args(tiny_data_dir, job_dir, "--train-epochs", "3",
                                            "--learning-rate", "0.05",
                                            "--learning-rate-schedule", "linear"))
    assert rerun.returncode == 0, rerun.stderr[-5000:]
    assert re.search(r"^Resuming from \S+model\.ckpt-8$", rerun.stderr, re.M)
    rerun_log = train_log(job_dir, since=logged_before)
    assert re.search(r"Restoring parameters from \S+model\.ckpt-8\b", rerun_log)
    assert "Training to step 24 (3.0 epochs of 64 examples at 8 per step); learning rate 0.05, " \
           "linear decay to 0 at step 24" in rerun.stderr
    # The first step it logs is step 8: 0.05 x 16/24.
    assert re.search(r"learning_rate = 0\.033333\d*, loss = \S+", rerun_log), rerun_log[-3000:]
    assert checkpoint_steps(job_dir)[-1] == 24
    with open(str(job_dir / "hparams.json")) as stream:
        recorded = json.load(stream)["runs"][-1]["hparams"]
    assert (recorded["train_epochs"], recorded["learning_rate"],
            recorded["learning_rate_schedule"]) == (3, 0.05, "linear")

    # Back to the step drops with a longer run: the drops move to 50 % and 75 % of the new
    # length, so step 24, where it resumes, is past the first drop only. Drops left where
    # the first run put them (steps 4 and 6) would give it 0.001.
    logged_before = len(train_log(job_dir))
    longer = run_module(MODULE, trainer_args(tiny_data_dir, job_dir, "--train-epochs", "5"))
    assert longer.returncode == 0, longer.stderr[-5000:]
    assert "Training to step 40 (5.0 epochs of 64 examples at 8 per step); learning rate 0.1, " \
           "x0.1 after step 20, x0.01 after step 30" in longer.stderr
    longer_log = train_log(job_dir, since=logged_before)
    assert re.search(r"Restoring parameters from \S+model\.ckpt-24\b", longer_log)
    first_rate = re.search(r"learning_rate = (\S+),", longer_log)
    assert first_rate and float(first_rate.group(1)) == pytest.approx(0.01), longer_log[-3000:]
    assert checkpoint_steps(job_dir)[-1] == 40


def test_three_cpu_towers_train_on_three_devices_evaluate_on_two_and_sync_ends_at_train_steps(
        tiny_data_dir, tmp_path):
    job_dir = tmp_path / "job"
    # --sync on one machine: the sync optimizer with one replica, whose update thread
    # must end with the run (no coordinator warning) at exactly --train-steps. The
    # evaluation batch of 8 splits evenly over 2 of the 3 towers, not over 3.
    result = run_module(MODULE, trainer_args(
        tiny_data_dir, job_dir, "--train-steps", "15", "--num-cpu-towers", "3",
        "--train-batch-size", "9", "--log-device-placement", "--sync"))
    assert_trained_and_evaluated(result, job_dir, 15)
    for log in (result.stderr, train_log(job_dir)):
        assert "Coordinator stopped with threads still running" not in log
        assert "Traceback" not in log
    placements = re.findall(
        r"\] (resnet\S*/tower_(\d)/\S+): \((\w+)\): \S+device:CPU:(\d)$", result.stderr, re.M)
    compute = [(tower, device) for _, tower, op_type, device in placements
               if op_type in ("Conv2D", "Conv2DBackpropFilter", "FusedBatchNormV3", "MatMul")]
    assert {tower for tower, _ in compute} == {"0", "1", "2"}, result.stderr[-3000:]
    assert all(tower == device for tower, device in compute), compute
    assert ("Evaluations run on 2 of the 3 towers, 4 images each: --eval-batch-size 8 splits "
            "evenly over no more of them") in result.stderr
    # Each of the 32 test images counted once: the accuracy is a whole number of them.
    with open(str(job_dir / "test_results.json")) as stream:
        results = json.load(stream)
    assert results["num_examples"] == 32
    assert results["accuracy"] * 32 == pytest.approx(round(results["accuracy"] * 32))


def test_synthetic_data_needs_no_files(tmp_path):
    job_dir = tmp_path / "job"
    result = run_module(MODULE, ["--use-synthetic-data", "--job-dir", job_dir, "--num-gpus", "0",
                                 "--num-layers", "8", "--train-batch-size", "8",
                                 "--eval-batch-size", "8", "--train-steps", "15"])
    assert_trained_and_evaluated(result, job_dir, 15)


def test_rerun_after_kill_resumes_from_the_last_checkpoint(tiny_data_dir, tmp_path):
    job_dir = tmp_path / "job"
    args = trainer_args(tiny_data_dir, job_dir, "--train-steps", "100",
                        "--save-checkpoints-steps", "5", "--eval-every-secs", "3600")
    process = start_module(MODULE, args, stdout=open(os.devnull, "w"),
                           stderr=open(str(tmp_path / "first.log"), "w"))
    try:
        deadline = time.time() + 300  # a hang guard (cli_helpers): a tiny run's first steps
        # Not the newest model.ckpt-N.index: the kill may come before the "checkpoint"
        # file names it, and a rerun resumes from the one named there.
        while (resume_step(job_dir) or 0) < 5:
            assert process.poll() is None, open(str(tmp_path / "first.log")).read()[-3000:]
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    killed_at = resume_step(job_dir)
    assert killed_at < 100, "training finished before it could be killed"
    # Its lock file stays behind naming it; the lock itself died with it.
    with open(str(job_dir / job_dir_lock.LOCK_FILENAME)) as stream:
        assert json.load(stream)["pid"] == process.pid

    # A checkpoint at the end only: the rerun saves once, not 19 times.
    logged_before = len(train_log(job_dir))
    result = run_module(MODULE, args + ["--save-checkpoints-steps", "100"])
    exited_at = time.time()
    assert result.returncode == 0, result.stderr[-5000:]
    restored = re.search(r"^Resuming from \S+model\.ckpt-(\d+)$", result.stderr, re.M)
    assert restored and int(restored.group(1)) == killed_at
    rerun_log = train_log(job_dir, since=logged_before)
    first_step = int(re.search(r"loss = [0-9.]+, step = (\d+)", rerun_log).group(1))
    assert first_step >= killed_at
    assert checkpoint_steps(job_dir)[-1] == 100
    # The final checkpoint is evaluated as training ends, --eval-every-secs 3600 or not:
    # within the seconds its evaluation and export take (60 s: several times theirs on a
    # loaded machine), not after the hour the throttle would hold it.
    assert 100 in eval_metrics(job_dir)
    assert exited_at - os.path.getmtime(str(job_dir / "model.ckpt-100.index")) < 60


def test_rerun_of_a_finished_job_evaluates_its_final_checkpoint(trained_job, tmp_path):
    # As if killed after the last checkpoint but before its evaluation and export: a copy
    # of trained_job (10 steps) without them, rerun with its own arguments.
    job_dir = tmp_path / "job"
    shutil.copytree(trained_job.job_dir, str(job_dir))
    shutil.rmtree(str(job_dir / "eval_validation"))
    shutil.rmtree(str(job_dir / "export"))
    args = trained_job.args_for(job_dir)
    recorded = (job_dir / "hparams.json").read_bytes()

    result = run_module(MODULE, args)

    assert result.returncode == 0, result.stderr[-5000:]
    assert checkpoint_steps(job_dir)[-1] == 10
    # It trained nothing: hparams.json keeps the runs that did, as they were.
    assert (job_dir / "hparams.json").read_bytes() == recorded
    assert 0.0 <= eval_metrics(job_dir)[10]["accuracy"] <= 1.0
    assert glob.glob(str(job_dir / "export" / "latest" / "*" / "saved_model.pb"))
    assert glob.glob(str(job_dir / "export" / "best" / "*" / "saved_model.pb"))
    assert re.search(r"^evaluation of step 10 on the validation set", result.stderr, re.M)


def test_the_console_is_for_a_person_and_the_log_file_keeps_the_tutorials_lines(trained_job):
    result, job_dir = trained_job.result, trained_job.job_dir
    console_lines = result.stderr.splitlines()
    # Not on the console: TensorFlow's log, the network's shapes, the start-up notices.
    for noise in ("INFO:tensorflow:", "image after unit", "Unable to register cuDNN factory",
                  "Average examples/sec", "_model_dir"):
        assert not any(noise in line for line in console_lines), noise
    assert console_lines[0].startswith("Recipe tutorial. Training to step 10 ")
    assert any(re.match(r"step 10/10 \(100 %\), \d+ examples/sec, about \d+ s to go$", line)
               for line in console_lines), result.stderr
    log = train_log(job_dir)
    for line in ("Unable to register cuDNN factory", "image after unit", "_model_dir",
                 "INFO:tensorflow:loss = ", "INFO:tensorflow:Recipe tutorial.",
                 "INFO:tensorflow:Final evaluation: "):
        assert line in log, line


def test_tensorboard_reads_the_same_tags_for_training_and_evaluation_and_the_hparams(
        trained_job):
    from tensorboard.backend.event_processing import event_multiplexer
    from tensorboard.plugins.hparams import metadata
    runs = event_multiplexer.EventMultiplexer()
    runs.AddRunsFromDirectory(trained_job.job_dir)
    runs.Reload()
    tags = runs.Runs()
    assert {"loss", "accuracy", "examples/sec", "learning_rate"} <= set(tags["."]["scalars"])
    for evaluation in ("eval_validation", "eval_test"):
        assert {"loss", "accuracy"} <= set(tags[evaluation]["scalars"])
    # The HParams dashboard: the job's resolved values and the metrics it shows.
    session = metadata.parse_session_start_info_plugin_data(
        runs.SummaryMetadata(".", metadata.SESSION_START_INFO_TAG).plugin_data.content)
    recorded = json.loads(pathlib.Path(trained_job.job_dir, "hparams.json").read_text())[
        "runs"][-1]["hparams"]
    assert session.hparams["num_layers"].number_value == recorded["num_layers"] == 8
    assert session.hparams["recipe"].string_value == "tutorial"
    assert session.hparams["eval_flips"].bool_value is False
    assert session.hparams["data_format"].string_value == recorded["data_format"] == (
        "channels_last")
    experiment = metadata.parse_experiment_plugin_data(
        runs.SummaryMetadata(".", metadata.EXPERIMENT_TAG).plugin_data.content)
    assert {(metric.name.group, metric.name.tag) for metric in experiment.metric_infos} == {
        ("eval_validation", "accuracy"), ("eval_validation", "loss"), ("eval_test", "accuracy")}
