"""Measure Cifar10DataSet against an input pipeline written the original tutorial's way.

Both pipelines read the same train file with the same batch size and augmentation, in
graph mode as the Estimator runs them. Each measurement builds its pipeline in a fresh
graph and session, runs warm-up batches untimed (file decoding, shuffle-buffer filling),
then times a fixed number of batches; the two pipelines alternate over several rounds,
so load from other processes hits both alike. A fresh session per measurement also
stops the idle pipeline from filling its prefetch buffers in the background, which
would otherwise count work done outside its timed window. Usage:

    python -m cifar10_estimator.benchmarks.input_pipeline [--data-dir DIR] [--batch-size 128]

Without --data-dir, a synthetic train file of 40000 random images is written to a
temporary directory first.
"""

import argparse
import dataclasses
import functools
import tempfile
import time
import typing

import numpy as np
import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import option, options_parser, parse
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.machine import alternating_rounds

SYNTHETIC_NUM_EXAMPLES = 40000


@dataclasses.dataclass
class Measurement:
    """One timed run of a pipeline: wall-clock throughput and process CPU time."""

    examples_per_sec: float
    cpu_ms_per_batch: float


@dataclasses.dataclass
class PipelineComparison:
    """The rounds of both pipelines, on the same file with the same batch size."""

    original: list
    dataset: list

    @property
    def original_examples_per_sec(self):
        return _overall_examples_per_sec(self.original)

    @property
    def dataset_examples_per_sec(self):
        return _overall_examples_per_sec(self.dataset)

    @property
    def speedup(self):
        """How many times the examples/sec of the original way Cifar10DataSet delivers."""
        return self.dataset_examples_per_sec / self.original_examples_per_sec

    @property
    def median_round_speedup(self):
        """The median over rounds of the same ratio: robust to a round disturbed by load."""
        return float(np.median([dataset.examples_per_sec / original.examples_per_sec
                                for original, dataset in zip(self.original, self.dataset)]))


def _overall_examples_per_sec(measurements):
    # Every round times the same number of examples: the overall rate is the harmonic mean.
    return len(measurements) / sum(1.0 / m.examples_per_sec for m in measurements)


def mean_cpu_ms_per_batch(measurements):
    return sum(m.cpu_ms_per_batch for m in measurements) / len(measurements)


def original_input_pipeline(filename, batch_size, num_examples):
    """The original tutorial's training input: one record at a time, then shuffle and batch.

    Each record is parsed, decoded, transposed, padded, cropped and flipped on its own in
    a map with num_parallel_calls=batch_size; the shuffle buffer holds 0.4 x num_examples
    + 3 x batch_size examples (the original took num_examples from a hard-coded table).
    """
    def parse_and_distort(serialized):
        features = tf.io.parse_single_example(serialized, {
            tfrecord_format.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
            tfrecord_format.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        })
        image = tf.io.decode_raw(features[tfrecord_format.IMAGE_KEY], tf.uint8)
        image.set_shape([tfrecord_format.IMAGE_NUM_BYTES])
        image = tf.reshape(image, [cifar10.DEPTH, cifar10.HEIGHT, cifar10.WIDTH])
        image = tf.cast(tf.transpose(image, [1, 2, 0]), tf.float32)
        image = tf.image.resize_with_crop_or_pad(
            image, cifar10.PADDED_HEIGHT, cifar10.PADDED_WIDTH)
        image = tf.image.random_crop(image, [cifar10.HEIGHT, cifar10.WIDTH, cifar10.DEPTH])
        image = tf.image.random_flip_left_right(image)
        return image, tf.cast(features[tfrecord_format.LABEL_KEY], tf.int32)

    dataset = tf.data.TFRecordDataset([filename]).repeat()
    dataset = dataset.map(parse_and_distort, num_parallel_calls=batch_size)
    dataset = dataset.shuffle(buffer_size=int(0.4 * num_examples) + 3 * batch_size)
    return dataset.batch(batch_size)


def write_synthetic_train_tfrecords(data_dir, num_examples=SYNTHETIC_NUM_EXAMPLES, seed=0):
    """Write a train file of random images and labels, and its counts file, to data_dir."""
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, size=(num_examples, tfrecord_format.IMAGE_NUM_BYTES),
                         dtype=np.uint8)
    labels = rng.randint(0, cifar10.NUM_CLASSES, size=num_examples)
    tfrecord_format.write_tfrecords(
        tfrecord_format.tfrecord_path(data_dir, "train"), images, labels)
    tfrecord_format.write_metadata(data_dir, {"train": num_examples})


def measure_pipeline(make_batch_tensors, batch_size, num_batches, num_warmup_batches):
    """Time one pipeline in a fresh graph and session, after untimed warm-up batches.

    Args:
      make_batch_tensors: function building the pipeline in the current graph and
        returning its (images, labels) batch tensors.
      batch_size: examples per batch, to turn batches into examples.
      num_batches: batches timed.
      num_warmup_batches: batches run first, untimed.

    Returns:
      A Measurement.
    """
    with tf.Graph().as_default():
        # Running a group of the batch tensors produces them without copying them out.
        step = tf.group(*make_batch_tensors())
        with tf.compat.v1.Session() as session:
            for _ in range(num_warmup_batches):
                session.run(step)
            start_seconds, start_cpu_seconds = time.perf_counter(), time.process_time()
            for _ in range(num_batches):
                session.run(step)
            seconds = time.perf_counter() - start_seconds
            cpu_seconds = time.process_time() - start_cpu_seconds
    return Measurement(num_batches * batch_size / seconds, 1000.0 * cpu_seconds / num_batches)


def compare_input_pipelines(data_dir, batch_size=128, num_batches=200, num_rounds=5,
                            num_warmup_batches=20, report_round=None):
    """Measure both pipelines on the train file of data_dir, alternating them each round.

    Args:
      data_dir: directory holding train.tfrecords (and, optionally, its counts file).
      batch_size: examples per batch, for both pipelines.
      num_batches: batches timed per pipeline and round.
      num_rounds: number of rounds; the pipeline measured first alternates
        (alternating_rounds).
      num_warmup_batches: untimed batches before each measurement.
      report_round: optional function(round_index, original, dataset) called with the
        two Measurements of each round.

    Returns:
      A PipelineComparison.

    Raises:
      Cifar10EstimatorError: data_dir or its train file is missing.
    """
    data_set = cifar10.Cifar10DataSet(data_dir, "train", use_distortion=True)

    def original_batch():
        dataset = original_input_pipeline(data_set.filename, batch_size,
                                          data_set.num_examples_per_epoch())
        return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()

    def report(round_index, measured):
        if report_round:
            report_round(round_index, measured["original"], measured["dataset"])

    pipelines = {"original": original_batch,
                 "dataset": lambda: data_set.make_batch(batch_size)}
    results = alternating_rounds.measure(
        {name: functools.partial(measure_pipeline, make_batch_tensors, batch_size,
                                 num_batches, num_warmup_batches)
         for name, make_batch_tensors in pipelines.items()},
        num_rounds, report_round=report)
    return PipelineComparison(original=results["original"].measurements,
                              dataset=results["dataset"].measurements)


def _int_at_least(minimum):
    """argparse type: an integer >= minimum."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                "expected an integer of at least %d, got %r" % (minimum, text))
        return value
    return parse


@dataclasses.dataclass(frozen=True)
class InputBenchmarkOptions:
    """The command line: the train file, and how much to time."""

    data_dir: typing.Optional[str] = option(
        None, "directory with train.tfrecords (default: %d synthetic examples in a temporary "
              "directory)" % SYNTHETIC_NUM_EXAMPLES)
    batch_size: int = option(128, "examples per batch (default 128)",
                             type=_int_at_least(1))
    num_batches: int = option(200, "batches timed per pipeline and round (default 200)",
                              type=_int_at_least(1))
    rounds: int = option(5, "alternating rounds (default 5)", type=_int_at_least(1))
    warmup_batches: int = option(
        20, "untimed batches before each measurement (default 20)", type=_int_at_least(0))


def build_parser():
    return options_parser(
        InputBenchmarkOptions,
        description="Examples/sec of Cifar10DataSet versus the original tutorial's pipeline, "
                    "on the same train file.")


def main(argv):
    args = parse(build_parser(), InputBenchmarkOptions, argv)
    if args.data_dir is not None:
        return _compare_and_print(args.data_dir, args)
    with tempfile.TemporaryDirectory(prefix="cifar10_input_benchmark_") as data_dir:
        print("writing %d synthetic training examples to %s" % (SYNTHETIC_NUM_EXAMPLES, data_dir),
              flush=True)
        write_synthetic_train_tfrecords(data_dir)
        return _compare_and_print(data_dir, args)


def _compare_and_print(data_dir, args):
    print("%s, batch size %d, %d rounds of %d timed batches per pipeline after %d warm-up "
          "batches" % (tfrecord_format.tfrecord_path(data_dir, "train"), args.batch_size,
                       args.rounds, args.num_batches, args.warmup_batches), flush=True)

    def report_round(round_index, original, dataset):
        print("round %d: original %.0f examples/sec (%.2f CPU ms/batch), Cifar10DataSet %.0f "
              "examples/sec (%.2f CPU ms/batch): %.2fx"
              % (round_index + 1, original.examples_per_sec, original.cpu_ms_per_batch,
                 dataset.examples_per_sec, dataset.cpu_ms_per_batch,
                 dataset.examples_per_sec / original.examples_per_sec), flush=True)

    comparison = compare_input_pipelines(
        data_dir, args.batch_size, args.num_batches, args.rounds, args.warmup_batches,
        report_round)
    print("original tutorial pipeline: %.0f examples/sec, %.2f CPU ms/batch"
          % (comparison.original_examples_per_sec, mean_cpu_ms_per_batch(comparison.original)))
    print("Cifar10DataSet:             %.0f examples/sec, %.2f CPU ms/batch"
          % (comparison.dataset_examples_per_sec, mean_cpu_ms_per_batch(comparison.dataset)))
    print("ratio: %.2fx the examples/sec (median of the rounds' ratios: %.2fx)"
          % (comparison.speedup, comparison.median_round_speedup))


def console_main():
    raise SystemExit(run_command(main))


if __name__ == "__main__":
    console_main()
