"""A pytest plugin: one tiny job dir trained through the real CLI, and its best export
converted to each other runtime's file, shared by the whole test run.

Test modules use it with `pytest_plugins = ["trained_job"]` and the `trained_job` and
`converted_models` fixtures; they do not import this module. The training and the
conversions run once however many modules and parallel workers ask for them (see
built_once), so tests only read what they made.
"""

import glob
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from built_once import built_once
from cli_helpers import run_module

TRAIN_STEPS = 10
SEED = 7


class TrainedJob:
    """A trained job dir, the data it was trained on and what the trainer printed, with
    ways to look inside."""

    def __init__(self, job_dir, data_dir, args, stdout, stderr):
        self.job_dir = str(job_dir)
        self.data_dir = str(data_dir)
        self.args = args  # the trainer's arguments, which train these weights again
        # What the trainer printed, as a CompletedProcess (it succeeded).
        self.result = subprocess.CompletedProcess(args, 0, stdout, stderr)

    def args_for(self, job_dir, **values):
        """The trainer's arguments with --job-dir job_dir and the given flags' values
        replaced (names with _ for -, e.g. save_checkpoints_steps=10)."""
        args = list(self.args)
        for name, value in dict(job_dir=job_dir, **values).items():
            args[args.index("--" + name.replace("_", "-")) + 1] = str(value)
        return args

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
    """ResNet-8 trained for 10 steps with seed 7 on tiny_data_dir by the real trainer CLI.

    Checkpoints every 5 steps; each evaluation (of a new checkpoint, at most one a
    second, and always of the last) exports to export/latest and, if best, export/best.
    """
    def args(directory):
        return [str(arg) for arg in [
            "--data-dir", tiny_data_dir, "--job-dir", directory / "job", "--num-gpus", "0",
            "--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8",
            "--train-steps", TRAIN_STEPS, "--save-checkpoints-steps", "5",
            "--eval-every-secs", "1", "--seed", SEED]]

    def train(directory):
        result = run_module("cifar10_estimator.main", args(directory))
        (directory / "stdout.txt").write_text(result.stdout)
        (directory / "stderr.txt").write_text(result.stderr)
        assert result.returncode == 0, result.stderr[-5000:]

    directory = built_once(tmp_path_factory, "trained_job", train)
    return TrainedJob(directory / "job", tiny_data_dir, args(directory),
                      (directory / "stdout.txt").read_text(),
                      (directory / "stderr.txt").read_text())


# --to of the convert command -> the file it writes.
CONVERTED_FILE_NAMES = {"tflite": "model.tflite", "tflite-int8": "model-int8.tflite",
                        "onnx": "model.onnx"}
# Converted without --data-dir, so checked on random images as a user without the
# TFRecords would convert (test_convert checks both ways on these conversions, instead of
# converting once more); the others are checked on the validation images.
CHECKED_ON_RANDOM_IMAGES = {"tflite"}


class ConvertedModel:
    """A file the convert command wrote, and what it printed."""

    def __init__(self, path):
        self.path = str(path)
        self.stdout = read_text(path + ".stdout")
        self.stderr = read_text(path + ".stderr")


def read_text(path):
    with open(path) as stream:
        return stream.read()


@pytest.fixture(scope="session")
def converted_models(tmp_path_factory, trained_job):
    """{--to: ConvertedModel}: the job dir converted by the real convert CLI to each format,
    once for the test run: int8 calibrated on the validation subset of its data; int8 and
    onnx checked on it, tflite (without --data-dir) on random images."""
    def convert(output_dir):
        for to, name in CONVERTED_FILE_NAMES.items():
            path = output_dir / name
            data = [] if to in CHECKED_ON_RANDOM_IMAGES else ["--data-dir", trained_job.data_dir]
            result = run_module("cifar10_estimator.serving.convert", [
                "--export-dir", trained_job.job_dir, "--to", to, "--output", path] + data)
            assert result.returncode == 0, result.stderr[-5000:]
            (output_dir / (name + ".stdout")).write_text(result.stdout)
            (output_dir / (name + ".stderr")).write_text(result.stderr)

    output_dir = built_once(tmp_path_factory, "converted_models", convert)
    return {to: ConvertedModel(str(output_dir / name))
            for to, name in CONVERTED_FILE_NAMES.items()}
