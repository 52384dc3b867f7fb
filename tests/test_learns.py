"""The trainer learns: a task a small ResNet can tell apart in seconds, through the real CLI.

Every other trainer test trains on random labels, which shows only that a run runs. Here
each class has its own colour under noise, so a ResNet-8 trained for a few hundred steps
must classify the held-out test images far above chance (10 %).
"""

import json
import os

import numpy as np
import pytest

from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.data import synthetic_archive
from cli_helpers import run_module

IMAGES_PER_BATCH = 100
# Ten colours far apart in RGB: the corners of the cube and two greys between them.
CLASS_COLOURS = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0],
                          [255, 0, 255], [0, 255, 255], [255, 255, 255], [85, 85, 85],
                          [170, 170, 170]], np.float64)
NOISE = 40.0


def coloured_batch(seed, batch_label):
    """An official batch dict whose images are their class's colour plus Gaussian noise."""
    batch = synthetic_archive.random_batch(IMAGES_PER_BATCH, seed, batch_label)
    rng = np.random.default_rng(seed)
    colours = CLASS_COLOURS[batch[b"labels"]]  # [N, 3]
    pixels = colours[:, :, np.newaxis] + rng.normal(0, NOISE, (IMAGES_PER_BATCH, 3, 1024))
    batch[b"data"] = np.clip(pixels, 0, 255).astype(np.uint8).reshape(IMAGES_PER_BATCH, 3072)
    return batch


@pytest.mark.slow
def test_a_small_resnet_learns_a_learnable_task_far_above_chance(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    batches = {name: coloured_batch(index, "batch %d of 6" % (index + 1))
               for index, name in enumerate(cifar10_archive.BATCH_NAMES)}
    synthetic_archive.write_archive(str(data_dir / cifar10_archive.ARCHIVE_FILENAME), batches)
    converted = run_module("cifar10_estimator.generate_tfrecords", ["--data-dir", data_dir])
    assert converted.returncode == 0, converted.stderr[-3000:]

    job_dir = tmp_path / "job"
    trained = run_module("cifar10_estimator.main", [
        "--data-dir", data_dir, "--job-dir", job_dir, "--num-gpus", "0", "--num-layers", "8",
        "--train-batch-size", "32", "--eval-batch-size", "100", "--train-steps", "120",
        # Evaluation normalises with batch norm's moving statistics: at the tutorial's
        # decay (0.997) 120 steps leave them mostly at their starting values.
        "--batch-norm-decay", "0.9", "--seed", "1"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    with open(os.path.join(job_dir, "test_results.json")) as results_file:
        results = json.load(results_file)
    assert results["num_examples"] == IMAGES_PER_BATCH
    # Chance is 0.1; the colours under this noise are told apart almost always once learned.
    assert results["accuracy"] > 0.6, results
