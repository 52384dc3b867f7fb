"""A tower's loss: the cross entropy of its shard, label-smoothed in training, plus weight
decay; with --skip-learned the weighted cross entropy of the examples a step trains."""

import tensorflow as tf

from cifar10_estimator.data import cifar10_facts


def tower_loss(labels, logits, optimisation, label_smoothing):
    """The mean cross entropy of a shard, its targets smoothed by `label_smoothing` (0.0
    in evaluation, schedule.label_smoothing in training), plus weight decay over the
    trainable variables --weight-decay-scope names (decayed_variables; all of them, as in
    the tutorial, by default); optimisation: the run's model_fn.OptimisationConfig."""
    return mean_cross_entropy(labels, logits, label_smoothing) + weight_decay_loss(optimisation)


def skipped_examples_loss(chosen, logits, optimisation, label_smoothing, skipping):
    """tower_loss of the examples of `chosen` (example_skipping.chosen_examples' label dict) with
    their weights, after `skipping` (an example_skipping.LearnedExampleSkipping) keeps each
    one's cross entropy for the next steps' choice."""
    losses = cross_entropies(chosen["labels"], logits, label_smoothing)
    record = skipping.record(chosen["example_indices"], losses,
                             tf.compat.v1.train.get_global_step())
    with tf.control_dependencies([record]):
        cross_entropy = tf.math.divide_no_nan(tf.reduce_sum(losses * chosen["loss_weights"]),
                                              tf.reduce_sum(chosen["loss_weights"]))
    return cross_entropy + weight_decay_loss(optimisation)


def weight_decay_loss(optimisation):
    """--weight-decay times the squared norms (halved) of the variables it decays."""
    decayed = decayed_variables(tf.compat.v1.trainable_variables(),
                                optimisation.weight_decay_scope)
    return optimisation.weight_decay * tf.add_n([tf.nn.l2_loss(variable) for variable in decayed])


def decayed_variables(variables, weight_decay_scope):
    """The variables that weight decay applies to, for a hparams.WEIGHT_DECAY_SCOPES entry.

    kernels keeps the convolution and dense kernels (`.../kernel`), leaving batch norm's
    gamma and beta and the dense bias undecayed: the "no bias decay" of He et al. 2019
    (Bag of Tricks).
    """
    if weight_decay_scope == "all":
        return list(variables)
    if weight_decay_scope == "kernels":
        return [v for v in variables if v.op.name.rsplit("/", 1)[-1] == "kernel"]
    raise ValueError("weight_decay_scope %r is neither 'all' nor 'kernels'" % weight_decay_scope)


def mean_cross_entropy(labels, logits, label_smoothing=0.0):
    """Mean cross entropy of labels [N] against logits [N, 11], optionally label-smoothed.

    The softmax runs over all the network's logits, as the original's loss did. With
    label_smoothing F the target is 1 - F on the label plus F / 10 on each of CIFAR-10's
    classes; the 11th logit, never a label, gets no target mass. F may be a tensor (a
    smoothing that changes with the step).
    """
    if not tf.is_tensor(label_smoothing) and not label_smoothing:
        return tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels=labels, logits=logits, loss_collection=None)
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=_smoothed_targets(labels, logits, label_smoothing), logits=logits))


def cross_entropies(labels, logits, label_smoothing=0.0):
    """float32 [N]: each example's cross entropy, as mean_cross_entropy averages them."""
    if not tf.is_tensor(label_smoothing) and not label_smoothing:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.nn.softmax_cross_entropy_with_logits(
        labels=_smoothed_targets(labels, logits, label_smoothing), logits=logits)


def _smoothed_targets(labels, logits, label_smoothing):
    """The targets [N, 11] of labels [N] smoothed by `label_smoothing` (mean_cross_entropy's)."""
    num_classes = cifar10_facts.NUM_CLASSES
    class_targets = (tf.one_hot(labels, num_classes) * (1.0 - label_smoothing)
                     + label_smoothing / num_classes)
    return tf.pad(class_targets, [[0, 0], [0, logits.shape[-1] - num_classes]])
