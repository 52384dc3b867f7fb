"""--lookahead-steps K: Lookahead (Zhang et al. 2019) around the momentum optimizer.

Training keeps a slow copy of every trainable variable, VAR/Lookahead, on the
variable's own device. The momentum optimizer moves the variables (the fast weights) as
usual; after every K-th global step, and after the run's last step, the slow copy moves
a fraction alpha (--lookahead-alpha) of the way to the fast weights, slow += alpha x
(fast - slow), and the fast weights are set to it: training goes on from the slow
weights. The momentum buffers are left as they are (the paper's default). Ending the run
on a synchronisation means the last checkpoint's weights, which evaluation and every
export use, are the slow weights.

Checkpoints hold the slow copies. A checkpoint without them (trained without the flag)
starts each at its variable's restored value when training continues with the flag.
Training without the flag ignores the slow copies of older checkpoints.

The synchronisation is read from the global step, so it holds across restarts and in a
cluster: under --sync the chief applies it with the aggregated update, without --sync it
follows whichever worker's update reached a K-th step. With --moving-average-decay the
averages follow the weights after the synchronisation (weight_averaging wraps this).
"""

import tensorflow as tf

from cifar10_estimator.training import checkpoint_saver
from cifar10_estimator.training import optimizer_wrapper

# The name of every slow copy under its variable's.
SLOW_NAME = "Lookahead"


class SlowWeights:
    """The slow copies of `variables` and their synchronisation (see LookaheadOptimizer)."""

    def __init__(self, steps, alpha, variables, global_step, last_step):
        """Args:
          steps: K, the global steps between synchronisations (>= 1).
          alpha: the fraction of the way the slow weights move, in (0, 1].
          variables: the trainable variables.
          global_step: the global step variable, which the update increments.
          last_step: the run's last global step, which always synchronises.
        """
        self._steps = steps
        self._alpha = alpha
        self._variables = list(variables)
        self._global_step = global_step
        self._last_step = last_step
        self._slow = None

    def _slow_copies(self):
        """The slow copies, made with the first call on their variables' devices; each
        starts at its variable's value: its initial value where the job starts, its
        restored value where a checkpoint without slow copies was restored first (see
        checkpoint_saver.OptionalVariables), as the weights' moving averages do."""
        if self._slow is None:
            self._slow = []
            for variable in self._variables:
                with tf.compat.v1.name_scope(None), tf.device(variable.device):
                    start = tf.cond(tf.compat.v1.is_variable_initialized(variable),
                                    variable.read_value, lambda v=variable: v.initial_value)
                with tf.compat.v1.name_scope(None), tf.compat.v1.colocate_with(variable):
                    self._slow.append(tf.compat.v1.Variable(
                        start, trainable=False, name="%s/%s" % (variable.op.name, SLOW_NAME)))
        return self._slow

    def update_after(self, update_op):
        """Op: update_op (which increments the global step), then, where the step it
        reached is a multiple of K or the last step, the synchronisation."""
        slow_copies = self._slow_copies()
        with tf.control_dependencies([update_op]):
            step = tf.identity(self._global_step.read_value())
            due = tf.logical_or(tf.equal(step % self._steps, 0),
                                tf.greater_equal(step, self._last_step))

            def synchronise():
                assignments = []
                for variable, slow in zip(self._variables, slow_copies):
                    moved = slow + self._alpha * (variable - slow)
                    assignments += [slow.assign(moved), variable.assign(moved)]
                return tf.group(assignments)

            return tf.cond(due, synchronise, tf.no_op)

    def optional_variables(self):
        """The slow copies as a checkpoint may lack them: each then starts at its
        variable's restored value."""
        return checkpoint_saver.OptionalVariables(
            {slow.op.name: slow for slow in self._slow_copies()},
            "no Lookahead slow weights (trained without --lookahead-steps): each starts at "
            "its weight's restored value")


class LookaheadOptimizer(optimizer_wrapper.FollowedOptimizer):
    """Wraps an optimizer to synchronise `slow_weights` (SlowWeights) after its updates."""

    def __init__(self, optimizer, slow_weights, name="LookaheadOptimizer"):
        super().__init__(optimizer, slow_weights, name)
