"""--moving-average-decay D: an exponential moving average of the trained weights.

Training keeps a shadow of every trainable variable, VAR/ExponentialMovingAverage, on
the variable's own device (with it on its ps in a cluster), and after each update moves
it towards the variable: shadow -= (1 - d) x (shadow - variable). The decay d ramps up
with the global step n the update reached, d = min(D, (1 + n) / (10 + n)), as
tf.compat.v1.train.ExponentialMovingAverage does with num_updates: early on the shadows
follow the weights closely, so the average of a short run is not dominated by its
random start. Checkpoints hold both the trained weights and their shadows.

Evaluation, prediction, the evaluate command and every export restore each shadow into
its variable instead (exports hold the averaged values under the variables' own names).

Batch-norm moving means and variances get no shadow: they are no weights the optimizer
trains but already exponential averages of the batches' statistics (decay
--batch-norm-decay, 0.997: about the last 300 steps), taken from weights of that recent
past; a second average would only make them lag further behind the weights. They are
restored as trained, like every variable that is not trainable.

Continuations: a checkpoint without shadows (trained without the flag) starts each
shadow at its variable's restored value when training continues with the flag, and is
evaluated with its trained weights, saying so in the log. Training without the flag
ignores the shadows of older checkpoints, and evaluation then uses the trained weights.
"""

import tensorflow as tf

from cifar10_estimator.training import checkpoint_saver
from cifar10_estimator.training import optimizer_wrapper

# The name of every shadow under its variable's (ExponentialMovingAverage's default).
SHADOW_NAME = "ExponentialMovingAverage"
TRAINED_WEIGHTS = "trained"
# What the log says of a checkpoint without shadows, before what is done instead.
_NO_AVERAGES = "no moving averages of the weights (trained without --moving-average-decay)"


class WeightAverages:
    """The shadows of `variables` during training, and their update (see AveragingOptimizer)."""

    def __init__(self, decay, variables, global_step):
        """Args:
          decay: D, in (0, 1).
          variables: the trainable variables.
          global_step: the global step variable; the decay ramps up with it.
        """
        self._variables = list(variables)
        self._moving_average = tf.compat.v1.train.ExponentialMovingAverage(
            decay, num_updates=global_step, name=SHADOW_NAME)

    def update_after(self, update_op):
        """Op: update_op, then each shadow moved towards its updated variable.

        The shadows are created with the first call, on their variables' devices.
        """
        with tf.control_dependencies([update_op]):
            return self._moving_average.apply(self._variables)

    def optional_variables(self):
        """The shadows as a checkpoint may lack them: each then starts at its variable's
        restored value (their initializer copies the variable once it is initialized).

        Call once the update is built: it creates the shadows.
        """
        shadows = [self._moving_average.average(variable) for variable in self._variables]
        return checkpoint_saver.OptionalVariables(
            {shadow.op.name: shadow for shadow in shadows},
            _NO_AVERAGES + ": each average starts at its weight's restored value")


class AveragingOptimizer(optimizer_wrapper.FollowedOptimizer):
    """Wraps an optimizer to update the weights' moving averages after each update it applies.

    Without --sync every worker's update is a global step of its own, and each worker
    averages after its update. Under SyncReplicasOptimizer, which wraps this, the
    update is the aggregated one the chief applies: the chief averages once per global
    step, and before it hands the workers the tokens of their next step. (The
    averaging SyncReplicasOptimizer offers itself, variable_averages, runs after it
    hands them out: the last step could end training, and its checkpoint be saved,
    before the last averages are.)
    """

    def __init__(self, optimizer, weight_averages, name="AveragingOptimizer"):
        """weight_averages: the WeightAverages to update."""
        super().__init__(optimizer, weight_averages, name)


def _shadow_name(variable):
    """The checkpoint name of `variable`'s moving average."""
    return "%s/%s" % (variable.op.name, SHADOW_NAME)


def evaluation_saver(variables):
    """The Saver of evaluation, prediction and exports, restoring `variables` averaged.

    Each of `variables` is restored from its shadow, every other variable (batch-norm
    statistics, the global step) from itself; from a checkpoint without shadows,
    `variables` are restored as trained, and the log says so. It saves under the
    variables' own names, so an export holds the averaged values as the model's weights.
    """
    variables = list(variables)
    return checkpoint_saver.TolerantSaver(
        [checkpoint_saver.OptionalVariables(
            {_shadow_name(variable): variable for variable in variables},
            _NO_AVERAGES + ": evaluating its trained weights",
            fallback={variable.op.name: variable for variable in variables})],
        sharded=True)


def evaluated_weights(decay, checkpoint):
    """Which weights evaluating `checkpoint` with --moving-average-decay `decay` (None:
    off) uses: 'moving average, decay D', or TRAINED_WEIGHTS when the flag is off or the
    checkpoint holds no moving averages."""
    if decay is None:
        return TRAINED_WEIGHTS
    suffix = "/" + SHADOW_NAME
    if not any(name.endswith(suffix) for name, _ in tf.train.list_variables(checkpoint)):
        return TRAINED_WEIGHTS
    return "moving average, decay %g" % decay
