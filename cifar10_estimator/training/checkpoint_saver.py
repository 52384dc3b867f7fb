"""A Saver that restores checkpoints lacking some optional variables.

A job's checkpoints need not all hold the same variables. A job trained in fp32 and
continued with --precision fp16 has no loss scale in its checkpoints; one trained
without --moving-average-decay and continued with it has no moving averages; and an
evaluation of the averages may meet a checkpoint written before they existed. Each such
set of variables is an OptionalVariables, and TolerantSaver restores it when the
checkpoint holds it and starts it another way when the checkpoint holds none of it.
A checkpoint missing any other variable still fails to restore as usual.
"""

import dataclasses
import typing

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class OptionalVariables:
    """Variables a checkpoint may lack, and how they start when it does.

    Attributes:
      var_list: {name in the checkpoint: variable} of the set.
      missing: what the checkpoint lacks and what happens instead, for the log line
        "<checkpoint> holds <missing>", e.g. "no loss scale (...): the scale starts at
        its initial value".
      fallback: {name in the checkpoint: variable} restored instead, or None to run the
        variables' initializers. These run after every other variable is restored, so an
        initializer that reads another variable reads its restored value.
    """

    var_list: typing.Dict[str, tf.Variable]
    missing: str
    fallback: typing.Optional[typing.Dict[str, tf.Variable]] = None


class TolerantSaver(tf.compat.v1.train.Saver):
    """A tf.compat.v1.train.Saver whose restore accepts checkpoints without `optional` sets.

    It saves as a Saver made with saver_kwargs does (every global variable under its own
    name by default). Restoring, it restores every global variable outside the optional
    sets under its own name, then each optional set: from the checkpoint if it holds any
    of the set's names (one missing then fails as any missing variable does), else from
    its fallback, logging so.
    """

    def __init__(self, optional, **saver_kwargs):
        """Args:
          optional: OptionalVariables sets, disjoint.
          **saver_kwargs: tf.compat.v1.train.Saver's arguments.
        """
        super().__init__(**saver_kwargs)
        sharded = saver_kwargs.get("sharded", False)
        in_sets = {variable.ref() for group in optional for variable in group.var_list.values()}
        others = [variable for variable in tf.compat.v1.global_variables()
                  if variable.ref() not in in_sets]
        # Built now: the graph is finalized before restore runs.
        self._others_restorer = tf.compat.v1.train.Saver(others, sharded=sharded)
        self._optional = [(group, tf.compat.v1.train.Saver(group.var_list, sharded=sharded),
                           _starter_without(group, sharded)) for group in optional]
        # What a checkpoint may lack (the rerun check reads it).
        self.optional_names = frozenset(name for group in optional for name in group.var_list)

    def restore(self, sess, save_path):
        self._others_restorer.restore(sess, save_path)
        names = {name for name, _ in tf.train.list_variables(save_path)}
        for group, restorer, start_without in self._optional:
            if any(name in names for name in group.var_list):
                restorer.restore(sess, save_path)
            else:
                tf.compat.v1.logging.info("%s holds %s", save_path, group.missing)
                start_without(sess, save_path)


def _starter_without(group, sharded):
    """start(session, save_path) of group's variables from a checkpoint without them."""
    if group.fallback:
        return tf.compat.v1.train.Saver(group.fallback, sharded=sharded).restore
    initializer = tf.group([variable.initializer for variable in group.var_list.values()])
    return lambda session, _: session.run(initializer)
