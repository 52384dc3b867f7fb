"""A pytest plugin: one tiny job dir trained through the real CLI, and its best export
converted to each other runtime's file, shared by the session.

Test modules use it with `pytest_plugins = ["trained_job"]` (which registers the
fixtures once, so the training and conversions run once however many modules ask for
them) and the `trained_job` and `converted_models` fixtures; they do not import this
module.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from cli_helpers import run_module

TRAIN_STEPS = 10


class TrainedJob:
    """A trained job dir and the data it was trained on, with ways to look inside."""

    def __init__(self, job_dir, data_dir):
        self.job_dir = str(job_dir)
        self.data_dir = str(data_dir)

    def exports(self, exporter_name):
        """Timestamped export directories under job-dir/export/<exporter_name>, oldest first."""
        pattern = os.path.join(self.job_dir, "export", exporter_name, "*", "saved_model.pb")
        return sorted((os.path.dirname(path) for path in glob.glob(pattern)),
                      key=lambda path: int(os.path.basename(path)))

    def read_subset(self, subset):
        """(images uint8 [N, 32, 32, 3], labels int64 [N]) of a TFRecord file, in file order."""
        images, labels = [], []
        path = os.path.join(self.data_dir, subset + ".tfrecords")
        for record in tf.data.TFRecordDataset(path):
            features = tf.train.Example.FromString(record.numpy()).features.feature
            pixels = np.frombuffer(features["image"].bytes_list.value[0], np.uint8)
            images.append(pixels.reshape(3, 32, 32).transpose(1, 2, 0))
            labels.append(features["label"].int64_list.value[0])
        return np.stack(images), np.array(labels, np.int64)

    @staticmethod
    def serve_images(export_dir, images):
        """The outputs of the serving_default signature on uint8 images, as numpy arrays."""
        signature = tf.saved_model.load(export_dir).signatures["serving_default"]
        outputs = signature(images=tf.constant(images, tf.uint8))
        return {key: value.numpy() for key, value in outputs.items()}


@pytest.fixture(scope="session")
def trained_job(tmp_path_factory, tiny_data_dir):
    """ResNet-8 trained for 10 steps on tiny_data_dir by the real trainer CLI.

    Checkpoints every 5 steps; each evaluation (of a new checkpoint, at most one a
    second, and always of the last) exports to export/latest and, if best, export/best.
    """
    job_dir = tmp_path_factory.mktemp("trained") / "job"
    result = run_module("cifar10_estimator.main", [
        "--data-dir", tiny_data_dir, "--job-dir", job_dir, "--num-gpus", "0",
        "--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8",
        "--train-steps", TRAIN_STEPS, "--save-checkpoints-steps", "5",
        "--eval-every-secs", "1"])
    assert result.returncode == 0, result.stderr[-5000:]
    return TrainedJob(job_dir, tiny_data_dir)


# --to of the convert command -> the file it writes.
CONVERTED_FILE_NAMES = {"tflite": "model.tflite", "tflite-int8": "model-int8.tflite",
                        "onnx": "model.onnx"}


class ConvertedModel:
    """A file the convert command wrote, and what it printed."""

    def __init__(self, path, result):
        self.path = str(path)
        self.stdout = result.stdout
        self.stderr = result.stderr


@pytest.fixture(scope="session")
def converted_models(tmp_path_factory, trained_job):
    """{--to: ConvertedModel}: the job dir converted by the real convert CLI to each format,
    checked and (int8) calibrated on the validation subset of its data."""
    output_dir = tmp_path_factory.mktemp("converted")
    models = {}
    for to, name in CONVERTED_FILE_NAMES.items():
        path = output_dir / name
        result = run_module("cifar10_estimator.serving.convert", [
            "--export-dir", trained_job.job_dir, "--to", to, "--output", path,
            "--data-dir", trained_job.data_dir])
        assert result.returncode == 0, result.stderr[-5000:]
        models[to] = ConvertedModel(path, result)
    return models
