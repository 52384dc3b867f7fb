"""The optimizer of a training step: the momentum optimizer and the layers a run wraps
around it, in the order of LAYERS, innermost first:

    Momentum          tf.compat.v1.train.MomentumOptimizer: every variable's update
    Muon              --muon-learning-rate: the convolution kernels updated by Muon
    loss scale        --precision fp16: the gradients unscaled; an overflow applies none
    Lookahead         --lookahead-steps: the slow weights synchronised after the update
    weight averaging  --moving-average-decay: the averages moved after all of the above
    SyncReplicas      --sync: the workers' gradients aggregated, applied by the chief

Each layer sees what those outside it hand down and wraps the update of those inside.
Muon takes the kernels' gradients from the momentum optimizer, so it wraps that alone;
the loss scale unscales the gradients for both, and skips both on a step whose gradients
overflowed. Lookahead and the averages follow the update inside them, the averages last,
so that they average the weights Lookahead synchronised (optimizer_wrapper.FollowedOptimizer).
SyncReplicasOptimizer wraps them all: under --sync the chief applies the aggregated
gradients through the whole stack.
"""

import dataclasses
import typing

import tensorflow as tf

from cifar10_estimator import cifar10_utils
from cifar10_estimator.training import lookahead
from cifar10_estimator.training import mixed_precision
from cifar10_estimator.training import muon
from cifar10_estimator.training import weight_averaging

# The momentum optimizer's name, which names the momentum it keeps for each variable
# (VAR/Momentum). Muon keeps the kernels' momentum variables under the same name, unused
# but saved, so that a job goes on with or without --muon-learning-rate.
MOMENTUM_OPTIMIZER_NAME = "Momentum"


@dataclasses.dataclass(frozen=True)
class UpdateInputs:
    """What the layers of a training step's optimizer are built from.

    Attributes:
      optimisation: the run's model_fn.OptimisationConfig.
      learning_rate: the schedule's rate at the step, a scalar tensor.
      base_learning_rate: the rate the schedule starts from (schedule.base_learning_rate):
        Muon's rate is --muon-learning-rate x learning_rate / base_learning_rate.
      global_step: the global step variable, which the update increments.
      last_step: the run's last global step, where Lookahead always synchronises.
      variables: the trainable variables.
      loss_scale: fp16's mixed_precision.DynamicLossScale, or None.
      is_chief: this task is the chief (under --sync it runs the chief's hook).
    """

    optimisation: typing.Any
    learning_rate: tf.Tensor
    base_learning_rate: float
    global_step: tf.Variable
    last_step: int
    variables: typing.Sequence[tf.Variable]
    loss_scale: typing.Optional[mixed_precision.DynamicLossScale]
    is_chief: bool


class Wrapped(typing.NamedTuple):
    """A layer's optimizer, the holder of the variables it adds (their
    optional_variables() for the checkpoints), and the hooks that must run on every worker."""

    optimizer: tf.compat.v1.train.Optimizer
    holder: typing.Any = None
    hooks: tuple = ()


class Layer(typing.NamedTuple):
    """A layer of the stack: its name, whether a run has it (applies(UpdateInputs)), and
    wrap(optimizer, UpdateInputs) -> Wrapped."""

    name: str
    applies: typing.Callable
    wrap: typing.Callable


class OptimizerStack(typing.NamedTuple):
    """The optimizer of the step (the outermost layer), the holders of the variables its
    layers add, outermost first, and the hooks that must run on every worker."""

    optimizer: tf.compat.v1.train.Optimizer
    holders: list
    hooks: list


def _muon(optimizer, inputs):
    config = inputs.optimisation
    # Muon's rate follows the schedule: R x the rate at the step / the base rate.
    kernel_momenta = muon.KernelMomenta(
        inputs.variables, config.muon_momentum,
        inputs.learning_rate * (config.muon_learning_rate / inputs.base_learning_rate),
        MOMENTUM_OPTIMIZER_NAME)
    return Wrapped(muon.MuonOptimizer(optimizer, kernel_momenta), kernel_momenta)


def _loss_scale(optimizer, inputs):
    # The scale is the towers' too: model_fn makes it before them, and keeps its variables.
    return Wrapped(mixed_precision.LossScaleOptimizer(optimizer, inputs.loss_scale))


def _lookahead(optimizer, inputs):
    config = inputs.optimisation
    slow_weights = lookahead.SlowWeights(config.lookahead_steps, config.lookahead_alpha,
                                         inputs.variables, inputs.global_step, inputs.last_step)
    return Wrapped(lookahead.LookaheadOptimizer(optimizer, slow_weights), slow_weights)


def _weight_averaging(optimizer, inputs):
    weight_averages = weight_averaging.WeightAverages(
        inputs.optimisation.moving_average_decay, inputs.variables, inputs.global_step)
    return Wrapped(weight_averaging.AveragingOptimizer(optimizer, weight_averages),
                   weight_averages)


def _sync_replicas(optimizer, inputs):
    workers = inputs.optimisation.num_workers
    optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
        optimizer, replicas_to_aggregate=workers, total_num_replicas=workers)
    hooks = [optimizer.make_session_run_hook(is_chief=False)]
    if inputs.is_chief:
        hooks.append(cifar10_utils.SyncReplicasChiefHook(optimizer))
    return Wrapped(optimizer, hooks=tuple(hooks))


# The layers around the momentum optimizer, innermost first (the module's docstring says why).
LAYERS = (
    Layer("Muon", lambda inputs: bool(inputs.optimisation.muon_learning_rate), _muon),
    Layer("loss scale", lambda inputs: inputs.loss_scale is not None, _loss_scale),
    Layer("Lookahead", lambda inputs: bool(inputs.optimisation.lookahead_steps), _lookahead),
    Layer("weight averaging",
          lambda inputs: inputs.optimisation.moving_average_decay is not None,
          _weight_averaging),
    Layer("SyncReplicas", lambda inputs: inputs.optimisation.sync, _sync_replicas),
)


def build(inputs):
    """The OptimizerStack of `inputs` (UpdateInputs): the momentum optimizer wrapped by
    each layer of LAYERS the run has, in their order."""
    config = inputs.optimisation
    optimizer = tf.compat.v1.train.MomentumOptimizer(
        inputs.learning_rate, momentum=config.momentum, use_nesterov=config.nesterov,
        name=MOMENTUM_OPTIMIZER_NAME)
    holders, hooks = [], []
    for layer in LAYERS:
        if layer.applies(inputs):
            optimizer, holder, layer_hooks = layer.wrap(optimizer, inputs)
            holders[:0] = [holder] if holder is not None else []
            hooks += layer_hooks
    return OptimizerStack(optimizer, holders, hooks)
