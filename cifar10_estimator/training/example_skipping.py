"""--skip-learned R: steps leave out examples the run has already learned.

InfoBatch (Qin et al. 2024) at the level of a step. The run keeps each training
example's latest training loss (a variable of the checkpoints, +inf until the example is
first trained). In a step, an example whose kept loss is below the mean of all the kept
finite losses counts as learned, and each learned example is left out with probability
R. The towers run the network on the examples that stay, so a step costs what they cost:
the epochs and the schedule stay the recipe's, the compute falls. The learned examples
that stay stand in for those left out: their losses weigh (learned in the batch) /
(learned kept), and the step's loss is the weighted sum over the full batch size, so it
still estimates the whole batch's mean loss. From SKIPPING_STOPS_AT of the run on every
example trains again (InfoBatch's annealing: the last eighth sees all the data).

The kept count is rounded up to a multiple of an eighth of the batch (at most
MAX_KEPT_MULTIPLE) with learned examples drawn at random, so the kernels see a few batch
sizes rather than a new one every step. The
decisions are a function of the kept losses, the global step and the tower, so a resumed
run leaves out what the run never stopped would have.
"""

import math

import tensorflow as tf

from cifar10_estimator.settings import schedule
from cifar10_estimator.training import checkpoint_saver

# The fraction of the run after which no example is left out (InfoBatch's delta).
SKIPPING_STOPS_AT = 0.875
MAX_KEPT_MULTIPLE = 16
SCOPE = "example_skipping"
# The checkpoints' count of the examples each image-size phase trained.
COUNTS_NAME = SCOPE + "/examples_trained"


def skipping_stop_step(hparams):
    """The global step from which every example trains again."""
    return int(math.floor(SKIPPING_STOPS_AT * schedule.last_step(hparams)))


class LearnedExampleSkipping:
    """The kept losses, the count of examples trained in each image-size phase, and the
    ops that choose a step's examples and record their losses. Build once per graph, on
    the device of the averaged update."""

    def __init__(self, fraction, num_examples, stop_step, phase_ends):
        """
        Args:
          fraction: R, the probability that a learned example is left out of a step.
          num_examples: examples in the training set (the indices' range).
          stop_step: the global step from which every example trains (skipping_stop_step).
          phase_ends: the end steps of the image-size phases but the last, as
            training.compute counts the phases.
        """
        self.fraction = fraction
        self._stop_step = stop_step
        self._phase_ends = tf.constant(list(phase_ends), tf.int64)
        with tf.compat.v1.variable_scope(SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
            self.losses = tf.compat.v1.get_variable(
                "losses", [num_examples], tf.float32, trainable=False, use_resource=True,
                initializer=tf.compat.v1.constant_initializer(float("inf")))
            self.examples_trained = tf.compat.v1.get_variable(
                "examples_trained", [len(phase_ends) + 1], tf.int64, trainable=False,
                use_resource=True, initializer=tf.compat.v1.zeros_initializer())

    def choose(self, indices, global_step):
        """(positions in the batch to train, int32 [K]; their loss weights, float32 [K])
        for the examples `indices` (int64 [B], into the training set) of a tower's batch.

        The draws are keyed by the step and the batch's first example, so towers and
        workers draw apart and a resumed run draws what the run never stopped did.
        """
        batch_size = tf.shape(indices)[0]
        multiple = kept_multiple(indices.shape[0])
        kept_losses = tf.gather(self.losses, indices)
        finite = tf.math.is_finite(self.losses)
        mean_loss = tf.math.divide_no_nan(
            tf.reduce_sum(tf.where(finite, self.losses, tf.zeros_like(self.losses))),
            tf.reduce_sum(tf.cast(finite, tf.float32)))
        learned = kept_losses < mean_loss
        draws = tf.random.stateless_uniform(
            [batch_size], tf.stack([tf.cast(global_step, tf.int64), indices[0]]))
        skipping = tf.cast(global_step, tf.int64) < self._stop_step
        kept = tf.logical_or(tf.logical_not(learned),
                             tf.logical_or(draws >= self.fraction, tf.logical_not(skipping)))
        # Kept examples first (priority above 1), then the left-out ones in random order,
        # from which the rounding up to KEPT_MULTIPLE takes its extra examples.
        priority = tf.where(kept, 1.0 + draws, draws)
        num_kept = tf.reduce_sum(tf.cast(kept, tf.int32))
        num_trained = tf.minimum(batch_size, -(-num_kept // multiple) * multiple)
        positions = tf.math.top_k(priority, num_trained, sorted=False).indices
        learned_trained = tf.gather(learned, positions)
        learned_weight = tf.math.divide_no_nan(
            tf.reduce_sum(tf.cast(learned, tf.float32)),
            tf.reduce_sum(tf.cast(learned_trained, tf.float32)))
        weights = tf.where(learned_trained, learned_weight, 1.0)
        return positions, weights

    def record(self, indices, losses, global_step):
        """The op that keeps `losses` (float32 [K]) of the trained examples `indices` and
        counts them in the phase of `global_step`."""
        phase = tf.reduce_sum(tf.cast(self._phase_ends <= tf.cast(global_step, tf.int64),
                                      tf.int32))
        return tf.group(
            self.losses.scatter_update(tf.IndexedSlices(tf.stop_gradient(losses), indices)),
            self.examples_trained.scatter_add(tf.IndexedSlices(
                tf.cast(tf.shape(indices)[:1], tf.int64), tf.reshape(phase, [1]))))

    def optional_variables(self):
        """The kept losses and counts as a checkpoint may lack them (a run continued with
        the option from one trained without it): every example then counts as unseen."""
        return checkpoint_saver.OptionalVariables(
            {variable.op.name: variable for variable in (self.losses, self.examples_trained)},
            "no losses of the training examples (a run without --skip-learned wrote it): "
            "every example starts unseen")


def kept_multiple(batch_size):
    """What a step's kept count is rounded up to: an eighth of a batch of `batch_size`
    (None: unknown), at least 1 and at most MAX_KEPT_MULTIPLE."""
    return max(1, min(MAX_KEPT_MULTIPLE, (batch_size or 8 * MAX_KEPT_MULTIPLE) // 8))


def chosen_examples(features, labels, skipping):
    """The training shards cut to the examples `skipping` (a LearnedExampleSkipping)
    trains this step.

    Args:
      features: per tower a dict of "images" and their "example_indices" (the training
        input_fn's with_example_indices).
      labels: per tower the labels [B].

    Returns:
      (image shards, label shards): per tower the chosen images, and a dict of their
      "labels", "example_indices" and "loss_weights" (losses.skipped_examples_loss's).
    """
    global_step = tf.compat.v1.train.get_global_step()
    image_shards, label_shards = [], []
    for shard, shard_labels in zip(features, labels):
        positions, weights = skipping.choose(shard["example_indices"], global_step)
        image_shards.append(tf.gather(shard["images"], positions))
        label_shards.append({"labels": tf.gather(shard_labels, positions),
                             "example_indices": tf.gather(shard["example_indices"], positions),
                             "loss_weights": weights})
    return image_shards, label_shards
