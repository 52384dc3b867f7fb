"""OptimizerWrapper: the base of optimizers that add to the update of the optimizer they wrap.

Muon's kernel updates (muon.MuonOptimizer), fp16's loss scaling
(mixed_precision.LossScaleOptimizer), Lookahead's slow weights
(lookahead.LookaheadOptimizer) and the weights' moving averages
(weight_averaging.AveragingOptimizer) each wrap the momentum optimizer and change only
how gradients are applied; the last two follow each update with one of their own
(FollowedOptimizer). Under --sync, SyncReplicasOptimizer wraps them in turn and
asks the optimizer it wraps for its slots and variables: this base forwards those.
"""

import tensorflow as tf


class OptimizerWrapper(tf.compat.v1.train.Optimizer):
    """An optimizer that does what `optimizer` does; subclasses override what they add to."""

    def __init__(self, optimizer, name):
        super().__init__(use_locking=False, name=name)
        self._optimizer = optimizer

    def compute_gradients(self, loss, var_list=None, **kwargs):
        return self._optimizer.compute_gradients(loss, var_list, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._optimizer.apply_gradients(grads_and_vars, global_step, name)

    def get_slot(self, var, name):
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        return self._optimizer.get_slot_names()

    def variables(self):
        return self._optimizer.variables()


class FollowedOptimizer(OptimizerWrapper):
    """Wraps an optimizer so that each update it applies is followed by
    `follower.update_after(update_op)`, the op the wrapper returns instead."""

    def __init__(self, optimizer, follower, name):
        super().__init__(optimizer, name)
        self._follower = follower

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._follower.update_after(
            self._optimizer.apply_gradients(grads_and_vars, global_step, name))
