"""SavedModels exported by training: where they go, their two signatures, PREDICT mode."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import cifar10, files, model_fn
from cifar10_estimator.serving import export, export_dirs
from cifar10_estimator.errors import Cifar10EstimatorError
from cli_helpers import cli_env
from test_training import eval_metrics

pytest_plugins = ["trained_job"]
slow = pytest.mark.slow

SIGNATURE_OUTPUTS = {"classes", "class_names", "probabilities"}


def random_images(count, height=32, width=32, channels=3, seed=0):
    return np.random.RandomState(seed).randint(
        0, 256, size=(count, height, width, channels)).astype(np.uint8)


def assert_consistent_predictions(outputs, count):
    assert set(outputs) == SIGNATURE_OUTPUTS
    probabilities, classes = outputs["probabilities"], outputs["classes"]
    assert probabilities.dtype == np.float32 and probabilities.shape == (count, 10)
    assert classes.dtype == np.int64 and classes.shape == (count,)
    assert outputs["class_names"].dtype == object and outputs["class_names"].shape == (count,)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert (probabilities >= 0).all()
    np.testing.assert_array_equal(classes, probabilities.argmax(axis=1))
    assert [name.decode() for name in outputs["class_names"]] == [
        cifar10.CLASS_NAMES[index] for index in classes]


@slow
def test_training_exports_the_latest_and_the_best_model(trained_job):
    latest = trained_job.exports("latest")
    assert 1 <= len(latest) <= export.LATEST_EXPORTS_TO_KEEP
    assert len(trained_job.exports("best")) == 1


@slow
def test_best_export_holds_the_checkpoint_with_the_highest_eval_accuracy(trained_job):
    accuracies = {step: metrics["accuracy"]
                  for step, metrics in eval_metrics(trained_job.job_dir).items()}
    # A later evaluation replaces the best export only if strictly more accurate.
    best_step = min(step for step, accuracy in accuracies.items()
                    if accuracy == max(accuracies.values()))
    (best_export,) = trained_job.exports("best")
    exported = tf.train.load_checkpoint(os.path.join(best_export, "variables", "variables"))
    trained = tf.train.load_checkpoint(
        os.path.join(trained_job.job_dir, "model.ckpt-%d" % best_step))
    names = [name for name in trained.get_variable_to_shape_map() if name.startswith("resnet/")
             and "Momentum" not in name]
    assert names
    for name in names:
        np.testing.assert_array_equal(exported.get_tensor(name), trained.get_tensor(name), name)


class EstimatorStub:
    """Just what BestAccuracyExporter asks of an Estimator; records export calls."""

    def __init__(self, model_dir):
        self._model_dir = model_dir
        self.exported_checkpoints = []

    def eval_dir(self, name=None):
        return os.path.join(self._model_dir, "eval_" + name if name else "eval")

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, **kwargs):
        self.exported_checkpoints.append(kwargs["checkpoint_path"])
        return os.path.join(export_dir_base, "1800000000").encode()


def write_eval_accuracies(eval_dir, accuracy_by_step):
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriter(eval_dir)
        for step, accuracy in accuracy_by_step.items():
            writer.add_summary(tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag="accuracy", simple_value=accuracy)]), step)
        writer.close()


def test_after_a_restart_the_best_export_is_replaced_only_by_a_better_model(tmp_path):
    eval_dir = str(tmp_path / "eval_validation")
    # Steps 5 and 10 were evaluated before the restart, step 15 is the current evaluation.
    write_eval_accuracies(eval_dir, {5: 0.5, 10: 0.25, 15: 0.375})
    # The test set's accuracies, higher, must not count: the best is chosen on validation.
    write_eval_accuracies(str(tmp_path / "eval"), {5: 0.9, 10: 0.9})
    export_path = tmp_path / "export" / "best"
    (export_path / "1700000000").mkdir(parents=True)
    (export_path / "1700000000" / "saved_model.pb").write_bytes(b"")
    exporter = export.best_exporter("validation")
    assert export.best_accuracy_before(eval_dir, 15) == 0.5

    estimator = EstimatorStub(str(tmp_path))
    worse = {"accuracy": 0.375, "global_step": 15, "loss": 1.0}
    assert exporter.export(estimator, str(export_path), "ckpt-15", worse, False) is None
    better = {"accuracy": 0.625, "global_step": 15, "loss": 1.0}
    exporter.export(estimator, str(export_path), "ckpt-15", better, False)
    assert estimator.exported_checkpoints == ["ckpt-15"]


class FailingEstimatorStub(EstimatorStub):
    """An Estimator whose export fails half-way, as tf.estimator writes one: in temp-<ts>/."""

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, **kwargs):
        os.makedirs(os.path.join(export_dir_base, "temp-1800000000", "variables"))
        raise OSError("No space left on device")


def test_an_export_that_fails_half_way_leaves_no_temporary_directory(tmp_path):
    export_path = tmp_path / "export" / "latest"
    with pytest.raises(OSError, match="No space left"):
        export.latest_exporter().export(FailingEstimatorStub(str(tmp_path)), str(export_path),
                                        "ckpt-5", {"accuracy": 0.5, "global_step": 5}, False)
    assert os.listdir(str(export_path)) == []


def test_what_a_killed_export_left_goes_before_the_next_export(tmp_path):
    export_path = tmp_path / "export" / "best"
    (export_path / "1700000000").mkdir(parents=True)
    (export_path / "1700000000" / "saved_model.pb").write_bytes(b"")
    (export_path / "temp-1750000000" / "variables").mkdir(parents=True)
    write_eval_accuracies(str(tmp_path / "eval_validation"), {5: 0.5})
    estimator = EstimatorStub(str(tmp_path))
    export.best_exporter("validation").export(
        estimator, str(export_path), "ckpt-10", {"accuracy": 0.75, "global_step": 10}, False)
    assert estimator.exported_checkpoints == ["ckpt-10"]
    assert sorted(os.listdir(str(export_path))) == ["1700000000"]


class WritingEstimatorStub(EstimatorStub):
    """An Estimator whose exports are directories with a SavedModel's files (not a model)."""

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, **kwargs):
        self.exported_checkpoints.append(kwargs["checkpoint_path"])
        export_dir = os.path.join(export_dir_base, str(1800000000 + len(self.exported_checkpoints)))
        os.makedirs(os.path.join(export_dir, "variables"))
        for name in ("saved_model.pb", os.path.join("variables", "variables.index")):
            with open(os.path.join(export_dir, name), "w") as stream:
                stream.write("%s of %s" % (name, kwargs["checkpoint_path"]))
        return export_dir.encode()


def files_of(directory):
    return {os.path.relpath(os.path.join(path, name), directory):
            open(os.path.join(path, name)).read()
            for path, _, names in os.walk(directory) for name in names}


def test_the_best_export_copies_the_latest_export_of_the_same_checkpoint(tmp_path):
    write_eval_accuracies(str(tmp_path / "eval_validation"), {5: 0.5})
    estimator = WritingEstimatorStub(str(tmp_path))
    latest, best = export.latest_and_best_exporters("validation")
    latest_path, best_path = tmp_path / "export" / "latest", tmp_path / "export" / "best"
    result = {"accuracy": 0.75, "global_step": 10}
    latest_dir = latest.export(estimator, str(latest_path), "ckpt-10", result, False).decode()
    best_dir = best.export(estimator, str(best_path), "ckpt-10", result, False).decode()

    assert estimator.exported_checkpoints == ["ckpt-10"]  # built once, then copied
    assert os.path.dirname(best_dir) == str(best_path)
    assert os.listdir(str(best_path)) == [os.path.basename(best_dir)]  # no temp- left
    assert files_of(best_dir) == files_of(latest_dir)
    assert "saved_model.pb of ckpt-10" in files_of(best_dir).values()

    # Of another checkpoint than the latest export's, the best export is built, and
    # replaces the one before (one best export is kept).
    newer = {"accuracy": 0.875, "global_step": 15}
    best_dir = best.export(estimator, str(best_path), "ckpt-15", newer, False).decode()
    assert estimator.exported_checkpoints == ["ckpt-10", "ckpt-15"]
    assert os.listdir(str(best_path)) == [os.path.basename(best_dir)]
    assert "saved_model.pb of ckpt-15" in files_of(best_dir).values()


def test_a_temporary_export_is_never_picked_though_newer(tmp_path):
    latest = tmp_path / "export" / "latest"
    for name in ("1700000000", "temp-1800000000"):
        (latest / name).mkdir(parents=True)
        (latest / name / "saved_model.pb").write_bytes(b"")
    (tmp_path / "export" / "best" / "temp-1800000001").mkdir(parents=True)
    assert export_dirs.resolve_export_dir(str(tmp_path)) == str(latest / "1700000000")
    assert export_dirs.resolve_export_dir(str(latest)) == str(latest / "1700000000")


@slow
def test_training_records_the_hparams_to_rebuild_the_model(trained_job):
    hparams = job_hparams.load(trained_job.job_dir)
    assert hparams == job_hparams.HParams(
        num_layers=8, train_batch_size=8, num_train_examples=64, train_steps=10, seed=7)
    assert job_hparams.load_record(trained_job.job_dir) == (hparams, "channels_last")


def test_hparams_json_keeps_every_run_that_trained_the_job_with_its_start_and_layout(
        tmp_path):
    first = job_hparams.HParams(num_layers=8, label_smoothing=0.1)
    second = dataclasses.replace(first, train_steps=40)
    job_hparams.record_run(str(tmp_path), first, "channels_first", 0)
    job_hparams.record_run(str(tmp_path), second, "channels_last", 20)

    content = json.loads((tmp_path / job_hparams.HPARAMS_FILENAME).read_text())
    assert content["format"] == job_hparams.HPARAMS_FORMAT
    assert [run["hparams"] for run in content["runs"]] == [
        dict(dataclasses.asdict(first), data_format="channels_first"),
        dict(dataclasses.asdict(second), data_format="channels_last")]
    runs = job_hparams.load_runs(str(tmp_path))
    assert [(run.hparams, run.data_format, run.start_step) for run in runs] == [
        (first, "channels_first", 0), (second, "channels_last", 20)]
    assert runs[0].start_time <= runs[1].start_time <= time.time()
    # What rebuilds the job's newest checkpoints: its newest run's.
    assert job_hparams.load_record(str(tmp_path)) == (second, "channels_last")


def test_an_hparams_json_of_one_run_as_earlier_versions_wrote_it_is_read_and_kept(tmp_path):
    hparams = job_hparams.HParams(num_layers=8)
    files.write_json(str(tmp_path / job_hparams.HPARAMS_FILENAME), {
        "format": job_hparams.SINGLE_RUN_FORMAT,
        "hparams": job_hparams.record(hparams, "channels_last")})
    assert job_hparams.load_record(str(tmp_path)) == (hparams, "channels_last")
    assert job_hparams.load_runs(str(tmp_path))[0].start_time is None

    job_hparams.record_run(str(tmp_path), dataclasses.replace(hparams, train_steps=5),
                           None, 3)
    runs = job_hparams.load_runs(str(tmp_path))
    assert [(run.hparams.train_steps, run.start_step) for run in runs] == [(None, None), (5, 3)]


def test_load_hparams_names_the_missing_file(tmp_path):
    with pytest.raises(Cifar10EstimatorError, match="hparams.json is missing"):
        job_hparams.load(str(tmp_path))


@slow
def test_serving_default_classifies_uint8_images(trained_job):
    export_dir = trained_job.exports("latest")[-1]
    signatures = tf.saved_model.load(export_dir).signatures
    assert set(signatures) == {"serving_default", "image_bytes:serving_default"}
    inputs = signatures["serving_default"].structured_input_signature[1]
    assert inputs == {"images": tf.TensorSpec([None, 32, 32, 3], tf.uint8, name="images")}
    assert_consistent_predictions(trained_job.serve_images(export_dir, random_images(5)), 5)


@slow
def test_image_bytes_decodes_png_and_jpeg_of_any_size_then_resizes(trained_job):
    export_dir = trained_job.exports("latest")[-1]
    signature = tf.saved_model.load(export_dir).signatures["image_bytes:serving_default"]
    assert signature.structured_input_signature[1] == {
        "image_bytes": tf.TensorSpec([None], tf.string, name="image_bytes")}
    encoded = [tf.io.encode_png(random_images(1, 45, 61, seed=1)[0]),
               tf.io.encode_jpeg(random_images(1, 20, 24, seed=2)[0]),
               tf.io.encode_png(random_images(1, 64, 40, channels=1, seed=3)[0]),
               tf.io.encode_png(random_images(1, seed=4)[0])]
    outputs = signature(image_bytes=tf.stack(encoded))
    outputs = {key: value.numpy() for key, value in outputs.items()}
    assert_consistent_predictions(outputs, len(encoded))

    resized = np.stack([export.resize_to_cifar(tf.io.decode_image(
        data, channels=3, expand_animations=False)).numpy() for data in encoded])
    expected = trained_job.serve_images(export_dir, resized)
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], atol=1e-6)
    np.testing.assert_array_equal(resized[3], random_images(1, seed=4)[0])


def test_resize_to_cifar_keeps_a_flat_colour_and_a_32x32_image():
    flat = np.full([50, 70, 3], [200, 10, 99], np.uint8)
    np.testing.assert_array_equal(export.resize_to_cifar(flat).numpy(),
                                  np.full([32, 32, 3], [200, 10, 99], np.uint8))
    image = random_images(1, seed=5)[0]
    np.testing.assert_array_equal(export.resize_to_cifar(image).numpy(), image)


@slow
def test_saved_model_cli_runs_serving_default_on_a_npy_file(trained_job, tmp_path):
    export_dir = trained_job.exports("best")[-1]
    images = random_images(4, seed=6)
    np.save(str(tmp_path / "images.npy"), images)
    saved_model_cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    result = subprocess.run(
        [saved_model_cli, "run", "--dir", export_dir, "--tag_set", "serve",
         "--signature_def", "serving_default", "--inputs", "images=%s" % (tmp_path / "images.npy"),
         "--outdir", str(tmp_path / "out")],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = trained_job.serve_images(export_dir, images)
    np.testing.assert_allclose(np.load(str(tmp_path / "out" / "probabilities.npy")),
                               expected["probabilities"], atol=1e-6)
    np.testing.assert_array_equal(np.load(str(tmp_path / "out" / "classes.npy")),
                                  expected["classes"])


@slow
def test_estimator_predict_agrees_with_the_export(trained_job):
    images = random_images(6, seed=7)
    estimator = tf.estimator.Estimator(
        model_fn.make_model_fn(model_fn.TowerLayout.for_devices(num_gpus=0),
                               job_hparams.load(trained_job.job_dir)),
        model_dir=trained_job.job_dir)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(images).batch(4)

    predictions = list(estimator.predict(input_fn))
    assert len(predictions) == 6
    expected = trained_job.serve_images(trained_job.exports("latest")[-1], images)
    np.testing.assert_allclose([p["probabilities"] for p in predictions],
                               expected["probabilities"], atol=1e-5)
    assert [p["class_names"] for p in predictions] == list(expected["class_names"])


@slow
def test_an_eval_flips_export_averages_each_image_and_its_mirror(trained_job, tmp_path):
    hparams = dataclasses.replace(job_hparams.load(trained_job.job_dir), eval_flips=True)
    estimator = tf.estimator.Estimator(
        model_fn.make_model_fn(model_fn.TowerLayout.for_devices(num_gpus=0), hparams),
        model_dir=trained_job.job_dir)
    flips_export = estimator.export_saved_model(
        str(tmp_path), export.serving_input_receiver_fn).decode()
    plain_export = trained_job.exports("latest")[-1]  # of the same, last, checkpoint
    images = random_images(5, seed=8)

    outputs = trained_job.serve_images(flips_export, images)
    assert_consistent_predictions(outputs, 5)  # the same signature, the same outputs
    plain = trained_job.serve_images(plain_export, images)["probabilities"]
    mirrored = trained_job.serve_images(plain_export, images[:, :, ::-1, :])["probabilities"]
    np.testing.assert_allclose(outputs["probabilities"], (plain + mirrored) / 2, atol=1e-6)
    assert np.abs(outputs["probabilities"] - plain).max() > 1e-4


@slow
def test_export_dir_may_be_an_export_its_parent_or_the_job_dir(trained_job, tmp_path):
    newest_best = trained_job.exports("best")[-1]
    newest_latest = trained_job.exports("latest")[-1]
    assert export_dirs.resolve_export_dir(newest_latest) == newest_latest
    assert export_dirs.resolve_export_dir(os.path.dirname(newest_latest)) == newest_latest
    assert export_dirs.resolve_export_dir(trained_job.job_dir) == newest_best
    with pytest.raises(Cifar10EstimatorError, match="no SavedModel in"):
        export_dirs.resolve_export_dir(str(tmp_path))
    with pytest.raises(Cifar10EstimatorError, match="does not exist"):
        export_dirs.resolve_export_dir(str(tmp_path / "missing"))
