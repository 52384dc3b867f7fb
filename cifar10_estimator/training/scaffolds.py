"""The Scaffolds of the model_fn's specs: what a session restores, and where a job starts.

Training resumes checkpoints that lack the optional variables of a run's tricks (each a
checkpoint_saver.OptionalVariables: fp16's loss scale, --skip-learned's losses, the
weights' averages, Lookahead's slow weights, Muon's momenta, the input stream's seeds),
and starts a new job's variables at given values. Evaluation, prediction and exports
restore the weights' averages where training kept them.
"""

import numpy as np
import tensorflow as tf

from cifar10_estimator.training import checkpoint_saver
from cifar10_estimator.training import weight_averaging


def training_scaffold(config, holders, input_seeds_name, starting_values=None):
    """The training Scaffold, or None where it would be the Estimator's own.

    Args:
      config: the Estimator's RunConfig, or None (then RunConfig's defaults).
      holders: the holders of the run's optional variables, each with its
        optional_variables() (mixed_precision.DynamicLossScale,
        example_skipping.LearnedExampleSkipping and optimizer_stack's layers').
      input_seeds_name: the name of the input stream's seeds variable
        (input_fn.INPUT_SEEDS_NAME), optional too where the input_fn made it.
      starting_values: {variable name: numpy array} (starting_value_feeds), or None.
    """
    optional_variables = [
        holder.optional_variables() for holder in holders] + _input_seeds_optional(
            input_seeds_name)
    feeds = starting_value_feeds(starting_values or {})
    if not optional_variables and not feeds:
        return None
    return tf.compat.v1.train.Scaffold(
        saver=_checkpoint_saver(config, optional_variables) if optional_variables else None,
        init_feed_dict=feeds or None)


def inference_scaffold(moving_average_decay):
    """The Scaffold of evaluation and prediction (so of exports): with
    --moving-average-decay its Saver restores the averaged weights
    (weight_averaging.evaluation_saver); None without."""
    if moving_average_decay is None:
        return None
    with tf.device("/cpu:0"):  # a Saver's ops are file and string work
        return tf.compat.v1.train.Scaffold(
            saver=weight_averaging.evaluation_saver(tf.compat.v1.trainable_variables()))


def starting_value_feeds(starting_values):
    """{tensor: value} that make the graph's initializers start variables at
    `starting_values` ({variable name: numpy array}) instead of at their draws.

    The Scaffold's init op runs the initializers with these feeds only where a job
    starts: on the chief (the other workers wait for it), and never when a checkpoint is
    restored, so a resumed job keeps what it trained. The initial value is fed rather
    than assigned afterwards because the weights' moving averages start from it too.

    Raises:
      ValueError: no global variable of the graph has a name, or a value's shape is not
        its variable's.
    """
    variables = {variable.op.name: variable for variable in tf.compat.v1.global_variables()}
    feeds = {}
    for name, value in sorted(starting_values.items()):
        if name not in variables:
            raise ValueError("no variable %s to give a starting value" % name)
        variable = variables[name]
        if not variable.shape.is_compatible_with(np.shape(value)):
            raise ValueError("the starting value of %s has shape %s, the variable %s"
                             % (name, np.shape(value), variable.shape))
        feeds[variable.initial_value] = np.asarray(value, variable.dtype.base_dtype.as_numpy_dtype)
    return feeds


def _input_seeds_optional(name):
    """The training stream's seeds (the variable `name`) as optional variables of the
    checkpoints, where the input_fn made them: a checkpoint written before they existed
    resumes with new ones."""
    seeds = [variable for variable in tf.compat.v1.global_variables()
             if variable.op.name == name]
    return [checkpoint_saver.OptionalVariables(
        var_list={name: variable},
        missing="no seeds of the training stream (an earlier version wrote it): the "
                "stream starts from new seeds") for variable in seeds]


def _checkpoint_saver(config, optional_variables):
    """The Saver tf.estimator would make, resuming checkpoints without
    `optional_variables` (checkpoint_saver.OptionalVariables); config: the Estimator's
    RunConfig, or None (then RunConfig's defaults)."""
    config = config or tf.estimator.RunConfig()
    return checkpoint_saver.TolerantSaver(
        optional_variables, sharded=True, max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
        defer_build=True, save_relative_paths=True)
