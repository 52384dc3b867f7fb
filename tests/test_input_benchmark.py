"""The input benchmark: runs on tiny data and reports both pipelines and their ratio."""

import re

import pytest

from cifar10_estimator import cifar10
from cifar10_estimator.benchmarks import input_pipeline
from cifar10_estimator.cli.command import run_command

TINY_RUN = ["--batch-size", "8", "--num-batches", "3", "--rounds", "2", "--warmup-batches", "1"]


def test_benchmark_prints_both_rates_and_their_ratio(tiny_data_dir, capsys):
    status = run_command(input_pipeline.main, ["--data-dir", str(tiny_data_dir)] + TINY_RUN)

    output = capsys.readouterr().out
    assert status == 0
    assert len(re.findall(r"^round \d: original \d+ examples/sec", output, re.M)) == 2
    original = float(re.search(r"^original tutorial pipeline: (\d+) examples/sec", output,
                               re.M).group(1))
    dataset = float(re.search(r"^Cifar10DataSet: +(\d+) examples/sec", output, re.M).group(1))
    ratio = float(re.search(r"^ratio: ([\d.]+)x", output, re.M).group(1))
    assert original > 0 and dataset > 0
    assert ratio == pytest.approx(dataset / original, rel=0.02)


def test_original_pipeline_gives_the_same_kind_of_batches(tiny_data_dir):
    import tensorflow as tf

    data_set = cifar10.Cifar10DataSet(str(tiny_data_dir), "train")
    with tf.Graph().as_default():
        dataset = input_pipeline.original_input_pipeline(data_set.filename, 8, 64)
        images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as session:
            image_values, label_values = session.run([images, labels])
    assert image_values.shape == (8, 32, 32, 3) and image_values.dtype.name == "float32"
    assert label_values.shape == (8,) and label_values.dtype.name == "int32"
    assert 0 <= image_values.min() and image_values.max() <= 255


def test_synthetic_train_file_reads_back(tmp_path):
    input_pipeline.write_synthetic_train_tfrecords(str(tmp_path), num_examples=20)

    data_set = cifar10.Cifar10DataSet(str(tmp_path), "train", use_distortion=False)
    assert data_set.num_examples_per_epoch() == 20
    images, labels = next(iter(data_set.make_dataset(20)))
    assert images.shape == (20, 32, 32, 3) and len(set(labels.numpy())) > 1


def test_missing_data_directory_is_one_line_and_status_1(tmp_path, capsys):
    status = run_command(input_pipeline.main, ["--data-dir", str(tmp_path / "none")],
                         prog="input_benchmark")
    error = capsys.readouterr().err
    assert status == 1
    assert error.count("\n") == 1 and "generate_tfrecords" in error


def test_bad_flag_is_a_usage_error(capsys):
    status = run_command(input_pipeline.main, ["--batch-size", "0"], prog="input_benchmark")
    assert status == 2
    assert "--batch-size" in capsys.readouterr().err
