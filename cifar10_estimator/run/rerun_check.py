"""A rerun checks itself against its job: the variables it would train against the
newest checkpoint's.

A job dir's checkpoints are the truth of what the job trained, and a rerun restores the
newest. Before the trainer writes anything into a job dir that has one (hparams.json,
an event file, a checkpoint), it builds its training graph once and compares its
variables, names and shapes, with those the checkpoint itself holds (not hparams.json,
which a record could get wrong). Where they differ the run is refused in one line: one
naming the flag at fault, the job's value and the way out where a flag that shapes the
variables (--num-layers, given or through --recipe) differs from the checkpoint's.
The optional variables the trainer's Saver tolerates (checkpoint_saver.OptionalVariables:
Muon's momenta, Lookahead's slow weights, the weights' averages, fp16's loss scale,
--skip-learned's losses) may be missing from the checkpoint, and another run's may be
there unused. Every other flag (the steps, the schedule, the batch, the precision, the
layout, the evaluations) changes only the rest of the run, which carries on.
"""

import dataclasses

import tensorflow as tf

from cifar10_estimator.cli.options import flag_of
from cifar10_estimator.errors import UsageError
from cifar10_estimator.settings import recipes
from cifar10_estimator.training import checkpoint_saver


@dataclasses.dataclass(frozen=True)
class BuiltVariables:
    """The variables a training graph holds.

    Attributes:
      shapes: {name in a checkpoint: shape as a tuple} of every global variable.
      optional: the names its Saver restores only from a checkpoint that holds them.
    """

    shapes: dict
    optional: frozenset


def built_variables(model_fn, input_fn, config):
    """The BuiltVariables of the training graph tf.estimator would build of model_fn on
    input_fn's batches (built here and dropped, nothing run)."""
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        batches = input_fn()
        if isinstance(batches, tf.data.Dataset):
            batches = tf.compat.v1.data.make_initializable_iterator(batches).get_next()
        features, labels = batches
        spec = model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, config)
        saver = spec.scaffold.saver if spec.scaffold else None
        return BuiltVariables(
            shapes={variable.op.name: tuple(variable.shape.as_list())
                    for variable in tf.compat.v1.global_variables()},
            optional=(saver.optional_names if isinstance(saver, checkpoint_saver.TolerantSaver)
                      else frozenset()))


def differences(built, checkpoint_shapes, network_scope):
    """What would not restore: ['name: the checkpoint's shape -> the built one'], one per
    variable missing from the checkpoint, of another shape there, or of the network
    (under network_scope) and not built; empty where the checkpoint fits.

    A checkpoint variable named after a built one (VAR/Momentum, VAR/ExponentialMovingAverage)
    belongs to another run's options and is not restored: it is no difference.
    """
    found = []
    for name, shape in sorted(built.shapes.items()):
        if name in checkpoint_shapes and tuple(checkpoint_shapes[name]) != shape:
            found.append("%s: %s -> %s" % (name, _shape_text(checkpoint_shapes[name]),
                                           _shape_text(shape)))
        elif name not in checkpoint_shapes and name not in built.optional:
            found.append("%s: none -> %s" % (name, _shape_text(shape)))
    for name, shape in sorted(checkpoint_shapes.items()):
        if name.startswith(network_scope + "/") and not _named_after(name, built.shapes):
            found.append("%s: %s -> none" % (name, _shape_text(shape)))
    return found


def _named_after(name, built_names):
    """Whether `name` is a built variable's, or under one's (VAR/suffix)."""
    parts = name.split("/")
    return any("/".join(parts[:end]) in built_names for end in range(1, len(parts) + 1))


def _shape_text(shape):
    return "[%s]" % ", ".join(str(size) for size in shape)


def check(checkpoint, built, network_scope, hparams, job_values):
    """Refuse a rerun whose training graph does not fit the job's newest checkpoint.

    Args:
      checkpoint: the job's newest checkpoint that reads (its prefix).
      built: the rerun's BuiltVariables.
      network_scope: the variable scope of the network's variables.
      hparams: the rerun's hparams.HParams.
      job_values: {HParams field that shapes the variables: value_of({name: shape} of a
        checkpoint) -> the field's value there}.

    Raises:
      UsageError: the graph does not fit: naming the flag and the job's value where one
        of job_values differs, else the first variable that differs.
    """
    checkpoint_shapes = dict(tf.train.list_variables(checkpoint))
    found = differences(built, checkpoint_shapes, network_scope)
    if not found:
        return
    for field, value_of in job_values.items():
        value, job_value = getattr(hparams, field), value_of(checkpoint_shapes)
        if value != job_value:
            raise UsageError(
                "%s %s%s does not fit the job: %s holds a network of %s %s; rerun with %s "
                "%s to carry on with the job, or pass another --job-dir to train a new one"
                % (flag_of(field), value, _through_recipe(hparams, field), checkpoint,
                   flag_of(field), job_value, flag_of(field), job_value))
    raise UsageError(
        "this run's variables do not fit the job's checkpoint %s (%s%s): rerun with the "
        "flags the job trained with (its hparams.json), or pass another --job-dir"
        % (checkpoint, found[0], " and %d more" % (len(found) - 1) if len(found) > 1 else ""))


def _through_recipe(hparams, field):
    """' (through --recipe NAME)' where the rerun's value of `field` is its recipe's."""
    if recipes.RECIPES[hparams.recipe].get(field) == getattr(hparams, field):
        return " (through --recipe %s)" % hparams.recipe
    return ""
