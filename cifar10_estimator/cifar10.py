"""Cifar10DataSet: the CIFAR-10 TFRecords of one subset as endless tf.data batches.

The batches are what the original tutorial produced: float32 images [N, 32, 32, 3]
with pixel values 0..255 (the model standardises them) and int32 labels [N]; training
images are zero-padded to 40x40, randomly cropped back to 32x32 (offsets uniform over
0..8 in each axis) and flipped left-right with probability 1/2, independently per image.
An AugmentationConfig changes that augmentation for short runs (the original's by
default): crops that move the image by fewer pixels (train_max_shift), and flips that
alternate from one epoch to the next for each image instead of being drawn anew
(alternating_flips).

It is built for throughput rather than record by record like the original:
  - the subset file is read and decoded once, as a single batch, and the decoded
    uint8 images stay in memory for the life of the iterator (training images
    already zero-padded: 192 MB for 40000), so nothing is parsed twice and no
    constant enters the graph;
  - a batch is one op on that array: an index gather, or for training a single
    crop_and_resize that picks, crops, flips and casts the whole batch at once.
Shuffling (train only) draws a fresh uniform permutation of all examples each epoch,
which mixes at least as well as the original's shuffle buffer of 0.4 x examples +
3 x batch. As with the original's repeat-then-batch, batches run on across epoch
boundaries, so every example is served once per epoch and every batch is full.

Records are read as they are: a damaged file fails inside the first session run, and one
cut short is read to where it ends. The commands run tfrecord_format.check_tfrecords on
each file once before they read it, which tells either in one line.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.hparams import ConfigFromHParams, DEFAULTS
# CIFAR-10's facts and the crops' padding, which every module after the TFRecords takes
# from here.
from cifar10_estimator.data.cifar10_facts import (  # noqa: F401
    CLASS_NAMES, DEPTH, HEIGHT, MAX_SHIFT, NUM_CLASSES, OFFICIAL_NUM_EXAMPLES, PADDED_HEIGHT,
    PADDED_WIDTH, SUBSETS, WIDTH, check_subset)
# Here too under its tutorial name; the flag checks, which load no TensorFlow, take it
# from tfrecord_format.
from cifar10_estimator.data.tfrecord_format import check_tfrecords_exist

# Larger than any CIFAR file, so that batching the records yields the whole file at once.
_MAX_RECORDS_PER_FILE = 1 << 31
_READ_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class InputParallelism:
    """How many batches a pipeline assembles at once and keeps ready: input_parallelism's
    choice for the run's devices, handed to Cifar10DataSet.

    The autotuner stays off whatever the values (see _fixed_size_options), so
    tf.data.AUTOTUNE as parallel_batches is its starting value and stays put: as many
    batches at once as the CPU has cores.
    """

    parallel_batches: int
    prefetch_batches: int


# A batch is one gather or one crop_and_resize, about 1 % of a training step on the CPU,
# whose cores the step needs: two at once, two ready.
CPU_PARALLELISM = InputParallelism(parallel_batches=2, prefetch_batches=2)
# A GPU step takes milliseconds and leaves the host's cores to the input: one batch per
# core at once, and a deeper store for the stretches where steps come faster than
# batches (8 of batch 128 are 13 MB of float32 images).
GPU_PARALLELISM = InputParallelism(parallel_batches=tf.data.AUTOTUNE, prefetch_batches=8)


def input_parallelism(num_gpus):
    """The InputParallelism of a training on num_gpus GPUs (0: on the CPU)."""
    return GPU_PARALLELISM if num_gpus > 0 else CPU_PARALLELISM


@dataclasses.dataclass(frozen=True)
class AugmentationConfig(ConfigFromHParams):
    """How training images are cropped and flipped, handed whole to Cifar10DataSet; the
    trainer builds it once from its HParams (from_hparams). The defaults are the
    original's augmentation.

    Attributes:
      train_max_shift: crops move the image by up to this many pixels along each axis
        (offsets uniform over -train_max_shift..train_max_shift), 0..MAX_SHIFT; the
        original's is MAX_SHIFT.
      alternating_flips: each image is mirrored in every other epoch, starting in its
        first epoch with probability 1/2 (Jordan 2024's "alternating flip"), rather
        than with probability 1/2 in every epoch.

    Raises:
      ValueError: train_max_shift out of range.
    """

    train_max_shift: int = DEFAULTS.train_max_shift
    alternating_flips: bool = DEFAULTS.alternating_flips

    def __post_init__(self):
        if not 0 <= self.train_max_shift <= MAX_SHIFT:
            raise ValueError("train_max_shift must be 0..%d, got %r"
                             % (MAX_SHIFT, self.train_max_shift))


class _NumExamplesPerEpoch:
    """Cifar10DataSet.num_examples_per_epoch: the original's static call, metadata-aware.

    On the class, num_examples_per_epoch(subset='train', data_dir=None) counts from
    data_dir's metadata (the original's counts without one); on an instance the
    subset and data_dir default to the instance's own.
    """

    def __get__(self, instance, owner):
        if instance is None:
            return tfrecord_format.num_examples

        def count(subset=None, data_dir=None):
            return tfrecord_format.num_examples(subset or instance.subset,
                                                data_dir or instance.data_dir)
        return count


class Cifar10DataSet:
    """The CIFAR-10 examples of one subset, read from the TFRecords in data_dir.

    Training batches are shuffled by a fresh permutation of the whole subset each
    epoch (see the module docstring for how this compares with the original).
    """

    num_examples_per_epoch = _NumExamplesPerEpoch()

    def __init__(self, data_dir, subset="train", use_distortion=True,
                 augmentation=AugmentationConfig(), parallelism=CPU_PARALLELISM):
        """
        Args:
          data_dir: directory written by generate_tfrecords.
          subset: 'train' (shuffled), 'validation' or 'eval' (both in file order).
          use_distortion: pad/crop/flip the training images; ignored for other subsets.
          augmentation: an AugmentationConfig, how the training images are cropped and
            flipped; the original's by default.
          parallelism: an InputParallelism, the batches assembled at once and kept
            ready; the CPU's by default.

        Raises:
          ValueError: unknown subset.
          Cifar10EstimatorError: data_dir or the subset's TFRecord file is missing.
        """
        self.data_dir = data_dir
        self.subset = subset
        self.use_distortion = use_distortion
        self.augmentation = augmentation
        self.parallelism = parallelism
        self.filename = tfrecord_format.tfrecord_path(data_dir, subset)  # checks the subset
        check_tfrecords_exist(data_dir, [subset])

    def make_batch(self, batch_size):
        """The next (images, labels) batch as tensors of the current graph.

        For a graph-mode input_fn (tf.estimator, tf.compat.v1.Session).

        Returns:
          images: float32 [batch_size, 32, 32, 3], values 0..255.
          labels: int32 [batch_size].
        """
        dataset = self.make_dataset(batch_size)
        return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()

    def read_all_examples(self, max_examples=None):
        """Every example of the subset once, in file order, as numpy arrays (eager mode).

        For feeding a subset to runtimes outside TensorFlow (serving.runtimes).

        Args:
          max_examples: read only the file's first max_examples; None: all of them.

        Returns:
          images: uint8 [N, 32, 32, 3], pixel values 0..255 in HWC order.
          labels: int64 [N].
        """
        for images, labels in _read_whole_file(self.filename, max_examples):
            return images.numpy(), labels.numpy().astype(np.int64)
        # An empty file batches into no element at all.
        return np.zeros([0, HEIGHT, WIDTH, DEPTH], np.uint8), np.zeros([0], np.int64)

    def make_dataset(self, batch_size, seeds=None, first_batch=0, with_indices=False):
        """An endless tf.data.Dataset of (images, labels) batches, as make_batch returns.

        Args:
          batch_size: examples per batch.
          seeds: int64 [2, 2] tensor, the seeds of the example order (row 0) and of the
            crops and flips (row 1); None draws them in tf.data (from the graph seed
            when one is set, else anew for each iterator).
          first_batch: int64 scalar (a tensor, read when the iterator is initialized):
            batches served before this one. The dataset starts with the batch it would
            have served after `first_batch` others, so a resumed run continues the
            stream where its stopped run left it.
          with_indices: each batch also holds int64 [batch_size], the examples' indices
            in the file (for a training that keeps something per example).
        """
        # One element: every example of the file, the seeds and where to start. Stateless
        # ops keyed by the seeds keep the streams independent and unaffected by parallel
        # execution order, and make every batch a function of the seeds and its number.
        if seeds is None:
            seeds = tf.data.Dataset.random().batch(2).batch(2)
        else:
            seeds = tf.data.Dataset.from_tensors(seeds)
        whole_file = tf.data.Dataset.zip((
            _read_whole_file(self.filename), seeds,
            tf.data.Dataset.from_tensors(tf.cast(first_batch, tf.int64))))
        dataset = whole_file.flat_map(without_autograph(
            lambda examples, seeds, first_batch: self._batches(
                examples, seeds, batch_size, first_batch, with_indices))
        ).prefetch(self.parallelism.prefetch_batches)
        return dataset.with_options(_fixed_size_options())

    def _batches(self, examples, seeds, batch_size, first_batch, with_indices=False):
        images, labels = examples
        order_seed, crop_seed = seeds[0], seeds[1]
        num_examples = tf.shape(labels, out_type=tf.int64)[0]
        # (indices, epochs) batches: which examples, and the epoch each is served in.
        index_batches = self._epoch_orders(
            num_examples, order_seed, first_batch * batch_size).rebatch(
            batch_size, drop_remainder=True)
        if self.subset == "train" and self.use_distortion:
            padded_images = pad_images(images)
            first_flips = None
            if self.augmentation.alternating_flips:
                # Each image's flip in its first epoch; it alternates from there.
                first_flips = tf.random.stateless_uniform(
                    [num_examples], tf.random.experimental.stateless_fold_in(crop_seed, -1)) < 0.5

            def take_images(batch_number, indices, epochs):
                seed = tf.random.experimental.stateless_fold_in(crop_seed, batch_number)
                flips = None
                if first_flips is not None:
                    flips = tf.not_equal(tf.gather(first_flips, indices),
                                         tf.equal(epochs % 2, 1))
                return random_crops(padded_images, indices, seed,
                                    self.augmentation.train_max_shift, flips)
        else:
            def take_images(batch_number, indices, epochs):
                return gather_images(images, indices)
        def take_batch(batch_number, batch):
            images_and_labels = (take_images(batch_number, *batch), tf.gather(labels, batch[0]))
            return images_and_labels + ((batch[0],) if with_indices else ())
        return index_batches.enumerate(start=first_batch).map(
            without_autograph(take_batch), num_parallel_calls=self.parallelism.parallel_batches)

    def _epoch_orders(self, num_examples, seed, first_position):
        """An endless dataset of (int64 [M] order, int64 [M] epoch): the example order of
        each epoch and the epoch's number, once per example, from the `first_position`-th
        example served (counting through the epochs one after another).

        M is num_examples, except in the first element, which leaves out the examples of
        its epoch served before first_position.
        """
        first_epoch = first_position // num_examples
        served_in_first_epoch = first_position % num_examples

        def order_of(epoch):
            if self.subset != "train":
                order = tf.range(num_examples)
            else:
                order = tf.random.experimental.stateless_shuffle(
                    tf.range(num_examples), tf.random.experimental.stateless_fold_in(seed, epoch))
            order = order[tf.where(tf.equal(epoch, first_epoch), served_in_first_epoch, 0):]
            return order, tf.fill(tf.shape(order), epoch)
        return tf.data.Dataset.counter(start=first_epoch).map(without_autograph(order_of))


def without_autograph(function):
    """`function` for tf.data to trace as written, without autograph's conversion.

    tf.data converts each function it traces with autograph, which parses and rewrites its
    source (and that of every function it calls) at each graph build: a third of a
    second of a small run's start-up and of each of its evaluations. The pipeline's
    functions branch only on Python values, so the conversion changes nothing but time.
    """
    return tf.autograph.experimental.do_not_convert(function)


def gather_images(images, indices):
    """The images at `indices` of images [N, 32, 32, C], as float32."""
    return tf.cast(tf.gather(images, indices), tf.float32)


def pad_images(images):
    """Zero-pad images [N, 32, 32, C] to [N, 40, 40, C], 4 pixels on each side."""
    return tf.pad(images, [[0, 0], [MAX_SHIFT, MAX_SHIFT], [MAX_SHIFT, MAX_SHIFT], [0, 0]])


def random_crops(padded_images, indices, seed, max_shift=MAX_SHIFT, flips=None):
    """Random 32x32 crops, each flipped left-right with probability 1/2, as float32.

    The tutorial's training augmentation after padding: crop offsets uniform over 0..8
    in each axis and the flip, drawn independently for each image.

    Args:
      padded_images: [N, 40, 40, C] tensor, as pad_images returns.
      indices: int [B] tensor, which images to crop (repeats allowed).
      seed: int32 or int64 [2] tensor; the same seed gives the same crops.
      max_shift: offsets are uniform over MAX_SHIFT - max_shift..MAX_SHIFT + max_shift.
      flips: bool [B] tensor, which crops to mirror; None draws each with probability 1/2.

    Returns:
      float32 [B, 32, 32, C].
    """
    num_crops = tf.shape(indices)[0]
    offset_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    offsets = tf.cast(tf.random.stateless_uniform(
        [2, num_crops], offset_seed, minval=MAX_SHIFT - max_shift,
        maxval=MAX_SHIFT + max_shift + 1, dtype=tf.int32), tf.float32)
    flip = flips if flips is not None else tf.random.stateless_uniform(
        [num_crops], flip_seed) < 0.5
    # Nearest-neighbour crop_and_resize at scale 1 is an exact crop that also selects
    # the images, flips (left edge beyond right edge) and casts, in one threaded op.
    # Box edges are pixel centres in units of (size - 1).
    top = offsets[0] / (PADDED_HEIGHT - 1)
    bottom = (offsets[0] + HEIGHT - 1) / (PADDED_HEIGHT - 1)
    left = offsets[1] / (PADDED_WIDTH - 1)
    right = (offsets[1] + WIDTH - 1) / (PADDED_WIDTH - 1)
    boxes = tf.stack(
        [top, tf.where(flip, right, left), bottom, tf.where(flip, left, right)], axis=1)
    return tf.image.crop_and_resize(
        padded_images, boxes, tf.cast(indices, tf.int32), [HEIGHT, WIDTH], method="nearest")


def _fixed_size_options():
    """tf.data options that turn the autotuner off.

    The autotuner runs a thread per iterator that sleeps between its rounds, for up to a
    minute once the pipeline is steady, and the iterator's destructor waits for that
    sleep to end (TensorFlow 2.15): closing the training session after the last step,
    and each evaluation's, stalled for 15 to 30 seconds at random. A batch here is one
    gather or one crop_and_resize, about 1 % of a training step on the CPU, so fixed
    sizes lose nothing there; for GPUs, InputParallelism's sizes follow the cores.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _read_whole_file(filename, max_examples=None):
    """A one-element dataset: all examples of a TFRecord file (or its first
    max_examples), decoded.

    Its element is (uint8 [N, 32, 32, 3] images in HWC order, int32 [N] labels).
    """
    records = tf.data.TFRecordDataset(filename, buffer_size=_READ_BUFFER_BYTES)
    if max_examples is not None:
        records = records.take(max_examples)
    return records.batch(_MAX_RECORDS_PER_FILE).map(without_autograph(_decode_records))


def _decode_records(serialized):
    features = tf.io.parse_example(serialized, {
        tfrecord_format.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        tfrecord_format.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    })
    pixels = tf.io.decode_raw(features[tfrecord_format.IMAGE_KEY], tf.uint8)
    # CIFAR stores each image channel-major (CHW); the model wants HWC.
    images = tf.transpose(tf.reshape(pixels, [-1, DEPTH, HEIGHT, WIDTH]), [0, 2, 3, 1])
    return images, tf.cast(features[tfrecord_format.LABEL_KEY], tf.int32)
