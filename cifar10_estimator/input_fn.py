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
                           augmentation=cifar10.AugmentationConfig()):
    """An Estimator input_fn reading `subset` from the TFRecords in data_dir.

    Args:
      data_dir: directory written by generate_tfrecords.
      subset: 'train', 'validation' or 'eval'.
      num_towers: number of shards each global batch is split into.
      batch_size: global batch size (all towers of this worker together).
      use_distortion: pad/crop/flip augmentation (training only).
      augmentation: a cifar10.AugmentationConfig, how it crops and flips.

    Returns:
      A function returning (image_shards, label_shards), built on the CPU.
    """
    def input_fn():
        with tf.device("/cpu:0"):
            dataset = cifar10.Cifar10DataSet(data_dir, subset, use_distortion, augmentation)
            images, labels = dataset.make_batch(batch_size)
            return split_batch_into_towers(images, labels, num_towers)
    return input_fn


# The variable holding the training stream's seeds (Cifar10DataSet.make_dataset's
# `seeds`): saved in every checkpoint, so a resumed run draws the stream its first
# session drew.
INPUT_SEEDS_NAME = "input_pipeline/seeds"


def make_training_input_fn(data_dir, num_towers, batch_size, use_distortion,
                           augmentation=cifar10.AugmentationConfig(), rank=0,
                           with_example_indices=False, parallelism=cifar10.CPU_PARALLELISM):
    """The trainer's input_fn: the training batches from where the job's global step is.

    A batch is a function of the stream's seeds and its number alone (see
    cifar10.Cifar10DataSet), so a run resumed from a checkpoint at global step N takes the
    same batch N, the same examples in the same order with the same crops and flips, as a
    run that was never stopped. The seeds are a variable of the checkpoints
    (INPUT_SEEDS_NAME), drawn when the job starts: from --seed's graph seed when there is
    one, else at random. The global step is read when the iterator is initialized, after
    the checkpoint is restored: tf.estimator does that for an input_fn that returns a
    Dataset.

    Args:
      data_dir, num_towers, batch_size, use_distortion, augmentation: as for
        make_tfrecord_input_fn.
      rank: the trainer's rank in a cluster (chief 0, worker i: i + 1); each draws a
        stream of its own from the shared seeds.
      with_example_indices: each image shard becomes a dict of its images ("images")
        and their indices in the training set ("example_indices"), for
        --skip-learned.
      parallelism: a cifar10.InputParallelism, the batches assembled at once and kept
        ready (cifar10.input_parallelism of the run's GPUs).

    Returns:
      An input_fn returning a Dataset of (image shards, label shards) tuples.
    """
    def input_fn():
        with tf.device("/cpu:0"):
            seeds = _stream_seeds(rank)
            global_step = tf.compat.v1.train.get_global_step()
            first_batch = 0 if global_step is None else tf.identity(global_step)
            dataset = cifar10.Cifar10DataSet(
                data_dir, "train", use_distortion, augmentation, parallelism
            ).make_dataset(batch_size, seeds, first_batch, with_example_indices)
            return dataset.map(cifar10.without_autograph(_tower_shards(num_towers)))
    return input_fn


def _tower_shards(num_towers):
    """(images, labels[, indices]) -> (image shards, label shards) of split_batch_into_towers;
    with indices, each image shard a dict of its images and their example indices."""
    def shards(images, labels, indices=None):
        image_shards, label_shards = split_batch_into_towers(images, labels, num_towers)
        if indices is not None:
            index_shards = tf.split(indices, num_towers) if num_towers > 1 else [indices]
            image_shards = [{"images": shard, "example_indices": index_shard}
                            for shard, index_shard in zip(image_shards, index_shards)]
        return tuple(image_shards), tuple(label_shards)
    return shards


def _stream_seeds(rank):
    """int64 [2, 2]: the checkpointed seeds of the training stream, folded with `rank`."""
    with tf.compat.v1.variable_scope("input_pipeline", reuse=tf.compat.v1.AUTO_REUSE):
        seeds = tf.compat.v1.get_variable(
            "seeds", shape=[2, 2], dtype=tf.int64, trainable=False,
            initializer=tf.compat.v1.random_uniform_initializer(
                minval=-(2 ** 62), maxval=2 ** 62))
    value = tf.identity(seeds)
    if rank:
        value = tf.stack([tf.random.experimental.stateless_fold_in(row, rank)
                          for row in tf.unstack(value)])
    return value


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
            dataset = tf.data.Dataset.range(1).map(
                cifar10.without_autograph(random_batch)).cache().repeat()
            dataset = dataset.prefetch(1)
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            return split_batch_into_towers(images, labels, num_towers)
    return input_fn
