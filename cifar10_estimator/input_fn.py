"""Input functions for the Estimator: global batches split into one shard per tower."""

import tensorflow as tf

from cifar10_estimator import cifar10


def split_batch_into_towers(images, labels, num_towers):
    """Split a global batch into `num_towers` equal shards along the batch axis.

    Args:
      images: [N, 32, 32, 3] tensor with a static batch size N.
      labels: [N] tensor.
      num_towers: number of shards; must divide N.

    Returns:
      (image_shards, label_shards): two lists of `num_towers` tensors.
    """
    if num_towers == 1:
        return [images], [labels]
    return tf.split(images, num_towers), tf.split(labels, num_towers)


def make_tfrecord_input_fn(data_dir, subset, num_towers, batch_size, use_distortion,
                           max_shift=cifar10.MAX_SHIFT, alternating_flips=False):
    """An Estimator input_fn reading `subset` from the TFRecords in data_dir.

    Args:
      data_dir: directory written by generate_tfrecords.
      subset: 'train', 'validation' or 'eval'.
      num_towers: number of shards each global batch is split into.
      batch_size: global batch size (all towers of this worker together).
      use_distortion: pad/crop/flip augmentation (training only).
      max_shift, alternating_flips: how it crops and flips (see cifar10.Cifar10DataSet).

    Returns:
      A function returning (image_shards, label_shards), built on the CPU.
    """
    def input_fn():
        with tf.device("/cpu:0"):
            dataset = cifar10.Cifar10DataSet(data_dir, subset, use_distortion, max_shift,
                                             alternating_flips)
            images, labels = dataset.make_batch(batch_size)
            return split_batch_into_towers(images, labels, num_towers)
    return input_fn


def make_synthetic_input_fn(num_towers, batch_size, seed=0):
    """An input_fn yielding the same random in-memory batch forever: no files, no decoding.

    Its throughput is the ceiling any real input pipeline can reach for the model.
    """
    def random_batch(_):
        images = tf.random.uniform(
            [batch_size, cifar10.HEIGHT, cifar10.WIDTH, cifar10.DEPTH],
            maxval=256.0, seed=seed)
        labels = tf.random.uniform(
            [batch_size], maxval=cifar10.NUM_CLASSES, dtype=tf.int32, seed=seed)
        return tf.floor(images), labels

    def input_fn():
        with tf.device("/cpu:0"):
            dataset = tf.data.Dataset.range(1).map(random_batch).cache().repeat()
            dataset = dataset.prefetch(1)
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            return split_batch_into_towers(images, labels, num_towers)
    return input_fn
