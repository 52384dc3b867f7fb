"""The convert command: an export to TensorFlow Lite (float and int8) and ONNX files, each
checked in its own runtime; and the runtimes that run them (serving.runtimes)."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.cli.command import run_command
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.serving import convert, runtimes
from cli_helpers import assert_one_line_error, run_module

pytest_plugins = ["trained_job"]
slow = pytest.mark.slow

MODULE = "cifar10_estimator.serving.convert"
# Measured: int8 and the SavedModel classify the tiny job's 32 eval images alike (its
# 10-step model is far from any decision boundary); one image of margin. What int8 costs
# a trained ResNet-20 is measured in docs/other-runtimes.md.
INT8_ACCURACY_BOUND = 1 / 32
# Measured: 6e-8 (float32 kernels adding in another order).
FLOAT_PROBABILITY_TOLERANCE = 1e-6


def accuracy(classes, labels):
    return float(np.mean(classes == labels))


@pytest.fixture(scope="module")
def eval_subset_served(trained_job):
    """(images, labels, outputs): the eval subset and what serving_default of the newest
    export under export/best gives on it, computed once for the tests that compare."""
    images, labels = trained_job.read_subset("eval")
    return images, labels, trained_job.serve_images(trained_job.exports("best")[-1], images)


@slow
@pytest.mark.parametrize("to", ["tflite", "onnx"])
def test_float_files_give_the_saved_models_outputs(converted_models, to, eval_subset_served):
    images, _, expected = eval_subset_served
    outputs = runtimes.load(converted_models[to].path).predict(images)
    # Given a job dir, convert uses the newest export under export/best (eval_subset_served).
    np.testing.assert_array_equal(outputs["classes"], expected["classes"])
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"],
                               atol=FLOAT_PROBABILITY_TOLERANCE)


@slow
def test_int8_file_is_quantized_calibrated_on_validation_and_as_accurate(
        converted_models, eval_subset_served):
    int8 = converted_models["tflite-int8"]
    assert "calibrated on 16 validation images" in int8.stdout  # all the tiny job has
    assert os.path.getsize(int8.path) < 0.5 * os.path.getsize(converted_models["tflite"].path)
    interpreter = tf.lite.Interpreter(model_path=int8.path)
    assert np.int8 in {detail["dtype"] for detail in interpreter.get_tensor_details()}
    runner = interpreter.get_signature_runner("serving_default")
    # Its edges are the SavedModel's: uint8 pixels in, float32 probabilities out.
    assert runner.get_input_details()["images"]["dtype"] == np.uint8
    assert runner.get_output_details()["probabilities"]["dtype"] == np.float32

    images, labels, expected = eval_subset_served
    classes = runtimes.load(int8.path).predict(images)["classes"]
    assert abs(accuracy(classes, labels) - accuracy(expected["classes"], labels)) <= (
        INT8_ACCURACY_BOUND)


@slow
def test_each_file_was_checked_in_its_runtime_without_the_converters_chatter(
        converted_models):
    for to, runtime in (("tflite", "TensorFlow Lite interpreter"),
                        ("tflite-int8", "TensorFlow Lite interpreter"),
                        ("onnx", "ONNX Runtime")):
        lines = converted_models[to].stdout.splitlines()
        assert lines[0].startswith("wrote %s: " % converted_models[to].path), lines
        assert lines[-1].startswith("checked in %s" % runtime), lines
        if to != "tflite":  # converted without --data-dir: the next test
            assert "on 16 validation images: top-1 agrees with the SavedModel" in lines[-1]
        assert "Summary on the non-converted ops" not in converted_models[to].stderr


@slow
def test_float_file_is_checked_on_random_images_without_data(converted_models):
    # The shared tflite conversion is the one without --data-dir (trained_job.py).
    tflite = converted_models["tflite"]
    assert "on random images: top-1 agrees with the SavedModel on 100 of 100" in tflite.stdout
    # No conversion left a temporary file beside its output: the directory holds the
    # three files and what the fixture kept of each command's output.
    written = [os.path.basename(model.path) for model in converted_models.values()]
    assert sorted(os.listdir(os.path.dirname(tflite.path))) == sorted(
        name + kept for name in written for kept in ("", ".stdout", ".stderr"))


@slow
def test_onnx_file_holds_the_serving_default_signature_only(converted_models):
    import onnxruntime

    session = onnxruntime.InferenceSession(converted_models["onnx"].path,
                                           providers=["CPUExecutionProvider"])
    assert [(item.name, item.type) for item in session.get_inputs()] == [
        ("images", "tensor(uint8)")]
    assert {item.name for item in session.get_outputs()} == {
        "classes", "class_names", "probabilities"}


@slow
def test_an_export_dir_without_exports_is_a_one_line_error(tmp_path):
    result = run_module(MODULE, ["--export-dir", tmp_path, "--to", "tflite",
                                 "--output", tmp_path / "model.tflite"])
    assert_one_line_error(result, 1, "no SavedModel in %s" % tmp_path)
    assert os.listdir(tmp_path) == []


@slow
def test_missing_calibration_data_is_a_one_line_error(trained_job, tmp_path):
    data_dir = tmp_path / "no-data"
    result = run_module(MODULE, ["--export-dir", trained_job.job_dir, "--to", "tflite-int8",
                                 "--output", tmp_path / "model.tflite", "--data-dir", data_dir])
    assert_one_line_error(result, 1, str(data_dir), "generate_tfrecords")
    assert os.listdir(tmp_path) == []


def test_int8_without_data_is_a_usage_error(tmp_path):
    result = run_module(MODULE, ["--export-dir", tmp_path, "--to", "tflite-int8",
                                 "--output", tmp_path / "model.tflite"])
    assert_one_line_error(result, 2, "--to tflite-int8 calibrates on the validation images",
                          "--data-dir")


def test_an_unknown_format_is_a_usage_error(tmp_path):
    result = run_module(MODULE, ["--export-dir", tmp_path, "--to", "coreml",
                                 "--output", tmp_path / "model.mlmodel"])
    assert_one_line_error(result, 2, "--to", "invalid choice: 'coreml'")


def test_an_output_of_another_kind_is_a_usage_error(tmp_path):
    result = run_module(MODULE, ["--export-dir", tmp_path, "--to", "onnx",
                                 "--output", tmp_path / "model.tflite"])
    assert_one_line_error(result, 2, "--output of --to onnx must end in .onnx")


@slow
def test_onnx_without_its_packages_says_what_to_install(trained_job, tmp_path, monkeypatch,
                                                         capsys):
    monkeypatch.setitem(sys.modules, "tf2onnx", None)  # import tf2onnx raises ImportError
    status = run_command(convert.main, [
        "--export-dir", trained_job.job_dir, "--to", "onnx", "--output",
        str(tmp_path / "model.onnx")], prog="convert")
    error = capsys.readouterr().err
    assert status == 1
    assert error.count("\n") == 1 and "pip install -e '.[onnx]'" in error, error
    assert os.listdir(tmp_path) == []


@slow
def test_onnx_files_without_onnxruntime_say_what_to_install(converted_models, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(Cifar10EstimatorError, match=r"pip install -e '\.\[onnx\]'"):
        runtimes.load(converted_models["onnx"].path)


@slow
def test_a_file_that_fails_its_check_leaves_the_output_as_it_was(trained_job, tmp_path):
    output = tmp_path / "model.onnx"
    output.write_bytes(b"the previous model")
    saved_model = runtimes.SavedModelRunner(trained_job.job_dir)
    with pytest.raises(Cifar10EstimatorError, match="cannot load .* in ONNX Runtime"):
        convert.write_checked(b"not a model", str(output), convert.TARGETS["onnx"],
                              saved_model, convert.random_images(4), "random images")
    assert output.read_bytes() == b"the previous model"
    assert os.listdir(tmp_path) == ["model.onnx"]


class FixedModel:
    """A stand-in runner that gives the same outputs whatever the images."""

    path = "fixed"
    runtime = "a test"

    def __init__(self, probabilities):
        self.probabilities = np.asarray(probabilities, np.float32)

    def predict(self, images):
        probabilities = np.repeat(self.probabilities[None], len(images), axis=0)
        return {"classes": np.argmax(probabilities, axis=1), "probabilities": probabilities}


def test_check_refuses_a_float_file_that_strays_from_the_saved_model():
    saved_model = FixedModel([0.5, 0.3] + [0.025] * 8)
    strayed = FixedModel([0.49, 0.31] + [0.025] * 8)
    images = convert.random_images(3)
    with pytest.raises(Cifar10EstimatorError, match="differ from the SavedModel's by 0.01"):
        convert.check_model(strayed, saved_model, images, "random images",
                            convert.FLOAT_TOLERANCE)
    # Quantized files are not held to a tolerance: the check reports how close they are.
    check = convert.check_model(strayed, saved_model, images, "random images", None)
    assert (check.num_images, check.num_agreeing) == (3, 3)
    assert check.max_probability_difference == pytest.approx(0.01, abs=1e-6)


@slow
@pytest.mark.parametrize("to", ["tflite", "onnx"])
def test_a_file_runs_on_the_threads_it_is_given(converted_models, to):
    assert runtimes.load(converted_models[to].path).runtime.endswith(
        ", %s" % runtimes.threads_text(runtimes.cpu_threads()))
    assert runtimes.load(converted_models[to].path, num_threads=1).runtime.endswith(", 1 thread")
