"""The evaluate command: accuracy, per-class accuracy and confusion matrix of a checkpoint."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import cifar10, model_fn
from cifar10_estimator.serving import evaluate
from cifar10_estimator.errors import Cifar10EstimatorError
from cli_helpers import assert_one_line_error, run_module

pytest_plugins = ["trained_job"]
slow = pytest.mark.slow

MODULE = "cifar10_estimator.serving.evaluate"


def confusion_matrix(labels, predicted):
    matrix = np.zeros([10, 10], np.int64)
    for true_class, predicted_class in zip(labels, predicted):
        matrix[true_class, predicted_class] += 1
    return matrix


def test_confusion_matrix_rows_are_true_classes_columns_predicted():
    labels = [0, 0, 1, 9, 9, 9]
    predicted = [0, 3, 1, 2, 9, 9]
    matrix = evaluate.confusion_matrix(labels, predicted)
    np.testing.assert_array_equal(matrix, confusion_matrix(labels, predicted))
    assert (matrix[0, 3], matrix[9, 2], matrix[9, 9], matrix.sum()) == (1, 1, 2, 6)


def test_summarize_gives_no_accuracy_to_classes_without_examples():
    results = evaluate.summarize(evaluate.confusion_matrix([0, 0, 1, 9], [0, 3, 1, 1]))
    assert (results["num_examples"], results["num_correct"], results["accuracy"]) == (4, 2, 0.5)
    assert results["per_class"]["airplane"] == {
        "num_examples": 2, "num_correct": 1, "accuracy": 0.5}
    assert results["per_class"]["truck"] == {"num_examples": 1, "num_correct": 0, "accuracy": 0.0}
    assert results["per_class"]["cat"] == {"num_examples": 0, "num_correct": 0, "accuracy": None}


def checkpoint_predictions(trained_job, checkpoint, images):
    """Classes predicted by estimator.predict from `checkpoint` for uint8 images."""
    estimator = tf.estimator.Estimator(model_fn.make_model_fn(
        model_fn.TowerLayout.for_devices(num_gpus=0), job_hparams.load(trained_job.job_dir)))
    predictions = estimator.predict(
        lambda: tf.data.Dataset.from_tensor_slices(images).batch(10), checkpoint_path=checkpoint)
    return np.array([prediction["classes"] for prediction in predictions])


def assert_consistent(results, labels):
    """The JSON results count every example once and their accuracies match the matrix."""
    matrix = np.array(results["confusion_matrix"])
    assert matrix.shape == (10, 10)
    assert matrix.sum() == results["num_examples"] == len(labels)
    np.testing.assert_array_equal(matrix.sum(axis=1), np.bincount(labels, minlength=10))
    assert results["num_correct"] == np.trace(matrix)
    assert results["accuracy"] == pytest.approx(np.trace(matrix) / len(labels))
    assert results["class_names"] == list(cifar10.CLASS_NAMES)
    for index, name in enumerate(cifar10.CLASS_NAMES):
        entry = results["per_class"][name]
        assert entry["num_examples"] == matrix[index].sum()
        assert entry["num_correct"] == matrix[index, index]
        if entry["num_examples"]:
            assert entry["accuracy"] == pytest.approx(matrix[index, index] / matrix[index].sum())
        else:
            assert entry["accuracy"] is None
    return matrix


def printed_matrix(stdout):
    """The confusion matrix as printed: a header of class names, then one row per class."""
    lines = stdout.splitlines()
    header = lines.index("confusion matrix (rows: true class, columns: predicted class):")
    assert lines[header + 1].split() == list(cifar10.CLASS_NAMES)
    rows = [line.split() for line in lines[header + 2:header + 12]]
    assert [row[0] for row in rows] == list(cifar10.CLASS_NAMES)
    return np.array([[int(count) for count in row[1:]] for row in rows])


@slow
def test_eval_subset_counts_every_example_once_despite_a_partial_last_batch(
        trained_job, tmp_path):
    json_path = tmp_path / "results.json"
    # 32 eval examples in batches of 5: the last batch holds 2.
    result = run_module(MODULE, ["--job-dir", trained_job.job_dir, "--data-dir",
                                 trained_job.data_dir, "--batch-size", "5", "--json", json_path])
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(json_path.read_text())
    images, labels = trained_job.read_subset("eval")
    matrix = assert_consistent(results, labels)

    assert results["subset"] == "eval"
    assert results["global_step"] == 10
    assert results["checkpoint"] == os.path.join(trained_job.job_dir, "model.ckpt-10")
    # The newest export was taken from the same (last) checkpoint.
    exported = trained_job.serve_images(trained_job.exports("latest")[-1], images)
    np.testing.assert_array_equal(matrix, confusion_matrix(labels, exported["classes"]))

    assert "accuracy: %.4f (%d/32)" % (results["accuracy"], np.trace(matrix)) in result.stdout
    np.testing.assert_array_equal(printed_matrix(result.stdout), matrix)


@slow
def test_validation_subset_from_an_explicit_checkpoint(trained_job, tmp_path):
    checkpoint = os.path.join(trained_job.job_dir, "model.ckpt-5")
    json_path = tmp_path / "results.json"
    result = run_module(MODULE, ["--job-dir", trained_job.job_dir, "--data-dir",
                                 trained_job.data_dir, "--subset", "validation",
                                 "--checkpoint", checkpoint, "--json", json_path])
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(json_path.read_text())
    images, labels = trained_job.read_subset("validation")
    matrix = assert_consistent(results, labels)
    assert (results["subset"], results["global_step"]) == ("validation", 5)
    predicted = checkpoint_predictions(trained_job, checkpoint, images)
    np.testing.assert_array_equal(matrix, confusion_matrix(labels, predicted))
    assert "subset: validation, 16 examples" in result.stdout


@slow
def test_a_missing_checkpoint_is_a_one_line_error(trained_job):
    checkpoint = os.path.join(trained_job.job_dir, "model.ckpt-999")
    result = run_module(MODULE, ["--job-dir", trained_job.job_dir, "--data-dir",
                                 trained_job.data_dir, "--checkpoint", checkpoint])
    assert_one_line_error(result, 1, "checkpoint %s not found" % checkpoint)


@slow
def test_missing_data_is_a_one_line_error(trained_job, tmp_path):
    data_dir = tmp_path / "no-data"
    result = run_module(MODULE, ["--job-dir", trained_job.job_dir, "--data-dir", data_dir])
    assert_one_line_error(result, 1, str(data_dir), "generate_tfrecords")


@slow
def test_a_job_dir_without_hparams_is_a_one_line_error(tiny_data_dir, tmp_path):
    result = run_module(MODULE, ["--job-dir", tmp_path, "--data-dir", tiny_data_dir])
    assert_one_line_error(result, 1, os.path.join(str(tmp_path), "hparams.json"), "missing")


@slow
def test_a_job_dir_without_checkpoints_is_a_one_line_error(tiny_data_dir, tmp_path):
    job_hparams.record_run(str(tmp_path), job_hparams.HParams(num_layers=8), None, 0)
    result = run_module(MODULE, ["--job-dir", tmp_path, "--data-dir", tiny_data_dir])
    assert_one_line_error(result, 1, "no checkpoint in %s; train first" % tmp_path)


def test_batch_size_must_be_positive(tiny_data_dir, tmp_path):
    result = run_module(MODULE, ["--job-dir", tmp_path, "--data-dir", tiny_data_dir,
                                 "--batch-size", "0"])
    assert_one_line_error(result, 2, "--batch-size", "expected a positive integer")


@slow
def test_a_checkpoint_of_another_depth_is_a_clear_error(trained_job):
    checkpoint = os.path.join(trained_job.job_dir, "model.ckpt-10")
    with pytest.raises(Cifar10EstimatorError, match="cannot restore .* into a ResNet-14"):
        evaluate.predict_subset(checkpoint, job_hparams.HParams(num_layers=14),
                                trained_job.data_dir, "eval", 8)


@slow
@pytest.mark.parametrize("to", ["tflite", "tflite-int8", "onnx"])
def test_a_model_file_is_evaluated_by_its_runtime(trained_job, converted_models, to, tmp_path):
    from cifar10_estimator.serving import runtimes

    path = converted_models[to].path
    json_path = tmp_path / "results.json"
    result = run_module(MODULE, ["--model", path, "--data-dir", trained_job.data_dir,
                                 "--batch-size", "5", "--json", json_path])
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(json_path.read_text())
    images, labels = trained_job.read_subset("eval")
    matrix = assert_consistent(results, labels)
    model = runtimes.load(path)
    predicted = model.predict(images)["classes"]
    np.testing.assert_array_equal(matrix, confusion_matrix(labels, predicted))
    assert (results["model"], results["format"], results["runtime"]) == (
        path, model.format_name, model.runtime)
    assert result.stdout.startswith("model: %s (%s)\nruntime: %s\nsubset: eval, 32 examples\n"
                                    % (path, model.format_name, model.runtime))


@slow
def test_an_export_as_model_is_evaluated_by_its_serving_default(trained_job, tmp_path):
    export_dir = trained_job.exports("best")[-1]
    json_path = tmp_path / "results.json"
    result = run_module(MODULE, ["--model", trained_job.job_dir, "--data-dir",
                                 trained_job.data_dir, "--subset", "validation",
                                 "--json", json_path])
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(json_path.read_text())
    images, labels = trained_job.read_subset("validation")
    matrix = assert_consistent(results, labels)
    served = trained_job.serve_images(export_dir, images)["classes"]
    np.testing.assert_array_equal(matrix, confusion_matrix(labels, served))
    assert (results["model"], results["format"]) == (export_dir, "SavedModel")


def test_a_checkpoint_with_a_model_file_is_a_usage_error(tiny_data_dir, tmp_path):
    result = run_module(MODULE, ["--model", tmp_path / "model.tflite", "--data-dir",
                                 tiny_data_dir, "--checkpoint", tmp_path / "model.ckpt-1"])
    assert_one_line_error(result, 2, "--checkpoint is for --job-dir")


def test_a_job_dir_and_a_model_file_together_are_a_usage_error(tiny_data_dir, tmp_path):
    result = run_module(MODULE, ["--model", tmp_path / "model.tflite", "--job-dir", tmp_path,
                                 "--data-dir", tiny_data_dir])
    assert_one_line_error(result, 2, "--job-dir", "not allowed with argument --model")


@slow
@pytest.mark.parametrize("name, fragment", [
    ("missing.tflite", "model file {} does not exist"),
    ("damaged.onnx", "cannot load {} in ONNX Runtime"),
    ("damaged.tflite", "cannot load {} in the TensorFlow Lite interpreter"),
    ("notes.txt", "{} is neither a .tflite nor an .onnx file"),
])
def test_a_model_file_that_does_not_load_is_a_one_line_error(tiny_data_dir, tmp_path, name,
                                                             fragment):
    path = tmp_path / name
    if not name.startswith("missing"):
        path.write_text("not a model\n")
    result = run_module(MODULE, ["--model", path, "--data-dir", tiny_data_dir])
    assert_one_line_error(result, 1, fragment.format(path))
