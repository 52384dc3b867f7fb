"""A rerun into a job dir keeps the job's truth: checked against its newest checkpoint
before it writes anything, and a damaged newest checkpoint costs one checkpoint.

The reruns run the real trainer on copies of the shared trained_job (ResNet-8, 10 steps,
a checkpoint every 5).
"""

import glob
import os
import pathlib
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10_model, flags, model_fn
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import main as trainer
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.run import damaged_checkpoints, job_dir_lock, rerun_check
from cli_helpers import TENSORFLOW_CPP_LOG_LINE, assert_one_line_error, run_module
from test_training import checkpoint_steps

pytest_plugins = ["trained_job"]
MODULE = "cifar10_estimator.main"


def job_files(job_dir):
    """{path under job_dir: (size, modification time)} of every file but the log, which
    records every run."""
    files = {}
    for folder, _, names in os.walk(str(job_dir)):
        for name in names:
            path = os.path.join(folder, name)
            if name not in ("train.log", job_dir_lock.LOCK_FILENAME):
                files[os.path.relpath(path, str(job_dir))] = (
                    os.path.getsize(path), os.path.getmtime(path))
    return files


def copy_of(trained_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(trained_job.job_dir, str(job_dir))
    return job_dir


@pytest.fixture(scope="module")
def refused_job(trained_job, tmp_path_factory):
    """(a copy of the trained job after a rerun with --num-layers 20, what the rerun
    printed, job_files before it)."""
    job_dir = copy_of(trained_job, tmp_path_factory.mktemp("refused"))
    before = job_files(job_dir)
    return job_dir, run_module(MODULE, trained_job.args_for(job_dir, num_layers=20)), before


@pytest.mark.slow
def test_a_rerun_with_another_depth_is_refused_in_one_line_before_it_writes_anything(
        refused_job):
    job_dir, result, before = refused_job
    assert_one_line_error(result, 2, "--num-layers 20 does not fit the job",
                          "%s/model.ckpt-10 holds a network of --num-layers 8" % job_dir,
                          "rerun with --num-layers 8", "or pass another --job-dir")
    assert job_files(job_dir) == before


@pytest.mark.slow
def test_evaluate_rebuilds_the_jobs_network_after_a_refused_rerun(trained_job, refused_job):
    job_dir, _, _ = refused_job
    result = run_module("cifar10_estimator.serving.evaluate",
                        ["--job-dir", job_dir, "--data-dir", trained_job.data_dir])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpoint: %s/model.ckpt-10 (global step 10)" % job_dir in result.stdout


@pytest.mark.slow
def test_predict_classifies_with_the_jobs_export_after_a_refused_rerun(refused_job, tmp_path):
    job_dir, _, _ = refused_job
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8)).numpy())
    result = run_module("cifar10_estimator.serving.predict", ["--export-dir", job_dir, image])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(str(image) + "\t")


@pytest.mark.slow
def test_with_the_jobs_depth_the_rerun_carries_on_says_what_changed_and_exports(
        trained_job, refused_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(str(refused_job[0]), str(job_dir))
    exported_before = set(os.listdir(str(job_dir / "export" / "latest")))

    result = run_module(MODULE, trained_job.args_for(job_dir, train_steps=15) + [
        "--train-batch-size", "16", "--save-checkpoints-steps", "15"])

    assert result.returncode == 0, result.stderr[-5000:]
    assert re.search(r"^Recipe tutorial\. Training to step 15 .*; changed since the job's "
                     r"last run: --train-steps 10 -> 15, --train-batch-size 8 -> 16$",
                     result.stderr, re.M), result.stderr[-3000:]
    assert re.search(r"^Resuming from %s/model\.ckpt-10$" % job_dir, result.stderr, re.M)
    runs = job_hparams.load_runs(str(job_dir))
    assert [(run.hparams.train_steps, run.hparams.train_batch_size, run.start_step)
            for run in runs] == [(10, 8, 0), (15, 16, 10)]
    new_exports = set(os.listdir(str(job_dir / "export" / "latest"))) - exported_before
    assert len(new_exports) == 1
    served = trained_job.serve_images(
        str(job_dir / "export" / "latest" / new_exports.pop()), np.zeros([2, 32, 32, 3], np.uint8))
    assert served["classes"].shape == (2,)


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
        trained_job, tmp_path):
    job_dir = copy_of(trained_job, tmp_path)
    # The weights' shard (the other holds the training stream's seeds), cut in half.
    data_file = job_dir / "model.ckpt-10.data-00001-of-00002"
    data_file.write_bytes(data_file.read_bytes()[:data_file.stat().st_size // 2])

    result = run_module(MODULE, trained_job.args_for(job_dir, train_steps=15))

    assert result.returncode == 0, result.stderr[-5000:]
    said = re.search(r"^%s/model\.ckpt-10 cannot be read \(.+\): moved aside to (\S+); "
                     r"resuming from %s/model\.ckpt-5$" % (job_dir, job_dir),
                     result.stderr, re.M)
    assert said, result.stderr[-3000:]
    assert sorted(os.listdir(said.group(1))) == [
        "model.ckpt-10.data-00000-of-00002", "model.ckpt-10.data-00001-of-00002",
        "model.ckpt-10.index", "model.ckpt-10.meta"]
    assert checkpoint_steps(job_dir)[-1] == 15


# The rerun check, on the graphs the trainer would build (nothing trained): each job's
# checkpoint is written with the variables, names and shapes, of its own graph.
def graph_hparams(**fields):
    return job_hparams.HParams(**dict(dict(num_layers=8, train_batch_size=8, train_steps=10,
                                           num_train_examples=64), **fields))


# Every optional variable the trainer's Saver tolerates: Muon's momenta, Lookahead's slow
# weights, the weights' averages, fp16's loss scale, --skip-learned's losses.
WITH_EVERY_OPTION = dict(muon_learning_rate=0.1, lookahead_steps=5, moving_average_decay=0.9,
                         precision="fp16", skip_learned=0.5)


@pytest.fixture(scope="module")
def built(tiny_data_dir):
    """built(hparams): the rerun_check.BuiltVariables of the trainer's training graph."""
    cache = {}

    def build(hparams):
        if hparams not in cache:
            settings = flags.Settings(hparams=hparams, data_dir=tiny_data_dir, job_dir="unused",
                                      num_gpus=0)
            layout = model_fn.TowerLayout.for_devices(num_gpus=0)
            cache[hparams] = rerun_check.built_variables(
                model_fn.make_model_fn(layout, hparams), trainer.make_train_input_fn(settings),
                tf.estimator.RunConfig())
        return cache[hparams]
    return build


def checkpoint_of(built_variables, path):
    """Write a checkpoint holding variables of the names and shapes of built_variables."""
    with tf.Graph().as_default():
        variables = {name: tf.compat.v1.Variable(tf.zeros(shape), name="variable")
                     for name, shape in built_variables.shapes.items()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver(variables).save(session, str(path))


def check(checkpoint, built_variables, hparams):
    rerun_check.check(checkpoint, built_variables, model_fn.NETWORK_SCOPE, hparams,
                      {"num_layers": cifar10_model.num_layers_of})


@pytest.mark.parametrize("job_fields, rerun_fields", [({}, WITH_EVERY_OPTION),
                                                      (WITH_EVERY_OPTION, {})],
                         ids=["options-added", "options-dropped"])
def test_the_optional_variables_of_either_run_leave_the_rerun_free(
        built, tmp_path, job_fields, rerun_fields):
    job_built = built(graph_hparams(**job_fields))
    rerun = graph_hparams(**rerun_fields)
    assert set(job_built.shapes) != set(built(rerun).shapes)
    check(checkpoint_of(job_built, tmp_path / "model.ckpt-10"), built(rerun), rerun)


@pytest.mark.parametrize("job_layers, rerun_fields, said", [
    (8, dict(num_layers=14), "--num-layers 14 does not fit the job"),
    (14, dict(num_layers=8), "--num-layers 8 does not fit the job"),
    (8, dict(recipe="paper", num_layers=20),
     "--num-layers 20 (through --recipe paper) does not fit the job")],
    ids=["deeper", "shallower", "through-a-recipe"])
def test_a_network_of_another_depth_is_refused_naming_the_flag_and_the_jobs_value(
        built, tmp_path, job_layers, rerun_fields, said):
    checkpoint = checkpoint_of(built(graph_hparams(num_layers=job_layers)),
                               tmp_path / "model.ckpt-10")
    rerun = graph_hparams(**rerun_fields)
    with pytest.raises(UsageError) as raised:
        check(checkpoint, built(rerun), rerun)
    assert str(raised.value) == (
        "%s: %s holds a network of --num-layers %d; rerun with --num-layers %d to carry on "
        "with the job, or pass another --job-dir to train a new one"
        % (said, checkpoint, job_layers, job_layers))


def test_any_other_variable_that_does_not_fit_is_refused_naming_it(built, tmp_path):
    hparams = graph_hparams()
    job_built = built(hparams)
    name = "%s/dense/kernel" % model_fn.NETWORK_SCOPE
    other = rerun_check.BuiltVariables(dict(job_built.shapes, **{name: (64, 10)}),
                                       job_built.optional)
    checkpoint = checkpoint_of(other, tmp_path / "model.ckpt-10")
    with pytest.raises(UsageError, match=r"^this run's variables do not fit the job's "
                       r"checkpoint %s \(%s: \[64, 10\] -> \[64, 11\]\): rerun with the flags "
                       r"the job trained with" % (re.escape(checkpoint), name)):
        check(checkpoint, job_built, hparams)


def test_the_depth_is_the_count_of_the_networks_weight_layers(built):
    for num_layers in (8, 14):
        assert cifar10_model.num_layers_of(
            built(graph_hparams(num_layers=num_layers, **WITH_EVERY_OPTION)).shapes) == num_layers


# Damaged checkpoints, each kind made to a copy of the trained job's model.ckpt-10 (its
# weights' shard is data-00001-of-00002).
def cut_short(prefix):
    data_file = pathlib.Path(prefix + ".data-00001-of-00002")
    data_file.write_bytes(data_file.read_bytes()[:data_file.stat().st_size // 2])


def lose_a_shard(prefix):
    os.remove(prefix + ".data-00001-of-00002")


def damage_the_index(prefix):
    index = pathlib.Path(prefix + ".index")
    content = bytearray(index.read_bytes())
    content[100:200] = b"x" * 100
    index.write_bytes(bytes(content))


def lose_the_index(prefix):
    os.remove(prefix + ".index")


DAMAGES = [cut_short, lose_a_shard, damage_the_index, lose_the_index]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda damage: damage.__name__)
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_one_before_resumed(
        trained_job, tmp_path, damage):
    job_dir = str(copy_of(trained_job, tmp_path))
    newest, before = [os.path.join(job_dir, "model.ckpt-%d" % step) for step in (10, 5)]
    damage(newest)

    checkpoint, line = damaged_checkpoints.resume_point(job_dir)

    folder = os.path.join(job_dir, damaged_checkpoints.DAMAGED_DIR)
    assert checkpoint == before
    assert re.match(r"^%s cannot be read \(.+\): moved aside to %s; resuming from %s$" % (
        re.escape(newest), re.escape(folder), re.escape(before)), line), line
    assert glob.glob(newest + ".*") == []
    assert {os.path.basename(path) for path in glob.glob(os.path.join(folder, "*"))} >= {
        "model.ckpt-10.meta"}
    # The job's checkpoint list, relative to the job dir as the trainer writes it, ends at
    # the one resumed.
    assert tf.train.latest_checkpoint(job_dir) == before
    state = pathlib.Path(job_dir, "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-5"' in state and "ckpt-10" not in state


def test_a_checkpoint_damaged_again_at_the_same_step_is_kept_beside_the_first(
        trained_job, tmp_path):
    job_dir = str(copy_of(trained_job, tmp_path))
    folder = os.path.join(job_dir, damaged_checkpoints.DAMAGED_DIR)
    os.makedirs(folder)
    pathlib.Path(folder, "model.ckpt-10.index").write_text("set aside before")
    cut_short(os.path.join(job_dir, "model.ckpt-10"))
    damaged_checkpoints.resume_point(job_dir)
    assert pathlib.Path(folder, "model.ckpt-10.index").read_text() == "set aside before"
    assert os.path.exists(os.path.join(folder, "model.ckpt-10.2.index"))


def test_where_no_checkpoint_reads_one_line_names_each_and_nothing_moves(
        trained_job, tmp_path):
    job_dir = str(copy_of(trained_job, tmp_path))
    for step, damage in ((10, cut_short), (5, lose_a_shard), (0, damage_the_index)):
        damage(os.path.join(job_dir, "model.ckpt-%d" % step))
    with pytest.raises(Cifar10EstimatorError) as raised:
        damaged_checkpoints.resume_point(job_dir)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("no checkpoint of %s can be read: %s/model.ckpt-10 (" % (
        job_dir, job_dir))
    assert all("%s/model.ckpt-%d (" % (job_dir, step) in message for step in (5, 0))
    assert not os.path.exists(os.path.join(job_dir, damaged_checkpoints.DAMAGED_DIR))


EVALUATE = "cifar10_estimator.serving.evaluate"


@pytest.mark.slow
def test_evaluate_says_in_one_line_which_it_evaluates_instead_of_a_damaged_newest(
        trained_job, tmp_path):
    job_dir = copy_of(trained_job, tmp_path)
    cut_short(str(job_dir / "model.ckpt-10"))
    before = job_files(job_dir)

    result = run_module(EVALUATE, ["--job-dir", job_dir, "--data-dir", trained_job.data_dir])

    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not TENSORFLOW_CPP_LOG_LINE.match(line)]
    assert len(lines) == 1 and re.match(
        r"^python -m %s: warning: %s/model\.ckpt-10 cannot be read \(.+\): evaluating "
        r"%s/model\.ckpt-5, the newest that reads$" % (EVALUATE, job_dir, job_dir),
        lines[0]), result.stderr[-3000:]
    assert "checkpoint: %s/model.ckpt-5 (global step 5)" % job_dir in result.stdout
    # A reader leaves the job dir as it is.
    assert job_files(job_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize("command", [MODULE, EVALUATE])
def test_where_no_checkpoint_reads_the_trainer_and_evaluate_name_each_in_one_line(
        trained_job, tmp_path, command):
    job_dir = copy_of(trained_job, tmp_path)
    for step, damage in ((10, cut_short), (5, lose_the_index), (0, lose_a_shard)):
        damage(str(job_dir / ("model.ckpt-%d" % step)))
    before = job_files(job_dir)
    args = (trained_job.args_for(job_dir, train_steps=15) if command == MODULE
            else ["--job-dir", job_dir, "--data-dir", trained_job.data_dir])

    result = run_module(command, args)

    assert_one_line_error(result, 1, "no checkpoint of %s can be read: " % job_dir,
                          *["%s/model.ckpt-%d (" % (job_dir, step) for step in (10, 5, 0)])
    assert job_files(job_dir) == before
