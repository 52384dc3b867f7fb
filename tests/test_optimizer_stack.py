"""The optimizer stack: the momentum optimizer and the layers a run's flags wrap around
it, in the order training.optimizer_stack documents, each only where its flag asks."""

import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import model_fn
from cifar10_estimator.training import lookahead, mixed_precision, muon, optimizer_stack
from cifar10_estimator.training import weight_averaging

# Every layer on: the flags of each, fp16's loss scale given apart (the towers need it).
EVERY_LAYER = dict(muon_learning_rate=0.05, lookahead_steps=5, moving_average_decay=0.99,
                   sync=True, num_workers=2)
# The wrappers innermost first, as the module's docstring orders them.
DOCUMENTED_WRAPPERS = ["MomentumOptimizer", "MuonOptimizer", "LossScaleOptimizer",
                       "LookaheadOptimizer", "AveragingOptimizer", "SyncReplicasOptimizer"]


def built_stack(fp16=False, is_chief=True, **fields):
    """optimizer_stack.build's OptimizerStack for the HParams `fields`, on a convolution
    kernel and a bias, and the optimizers it wraps, innermost first."""
    config = model_fn.OptimisationConfig.from_hparams(job_hparams.HParams(**fields))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    variables = [tf.compat.v1.get_variable("conv2d/kernel", [3, 3, 3, 8]),
                 tf.compat.v1.get_variable("dense/bias", [8])]
    stack = optimizer_stack.build(optimizer_stack.UpdateInputs(
        optimisation=config, learning_rate=tf.constant(0.1), base_learning_rate=0.1,
        global_step=global_step, last_step=100, variables=variables,
        loss_scale=mixed_precision.DynamicLossScale() if fp16 else None, is_chief=is_chief))
    chain, optimizer = [], stack.optimizer
    while optimizer is not None:
        chain.insert(0, optimizer)
        optimizer = getattr(optimizer, "_optimizer", getattr(optimizer, "_opt", None))
    return stack, chain


def documented_layers():
    """The layer names of training.optimizer_stack's docstring table, innermost first."""
    rows = [line for line in optimizer_stack.__doc__.splitlines()
            if line.startswith("    ") and not line.startswith("     ")]
    return [row.strip().split("  ")[0] for row in rows]


def test_the_layers_are_in_the_documented_order():
    assert documented_layers() == ["Momentum"] + [
        layer.name for layer in optimizer_stack.LAYERS]
    with tf.Graph().as_default():
        stack, chain = built_stack(fp16=True, **EVERY_LAYER)
    assert [type(optimizer).__name__ for optimizer in chain] == DOCUMENTED_WRAPPERS
    # The holders of the variables the layers add, outermost first (fp16's loss scale is
    # model_fn's: the towers scale their losses by it).
    assert [type(holder) for holder in stack.holders] == [
        weight_averaging.WeightAverages, lookahead.SlowWeights, muon.KernelMomenta]
    assert [type(hook).__name__ for hook in stack.hooks] == [
        "_SyncReplicasOptimizerHook", "SyncReplicasChiefHook"]


@pytest.mark.parametrize("fields, wrapper", [
    ({}, None),
    ({"muon_learning_rate": 0.05}, "MuonOptimizer"),
    ({"precision": "fp16"}, "LossScaleOptimizer"),
    ({"lookahead_steps": 5}, "LookaheadOptimizer"),
    ({"moving_average_decay": 0.99}, "AveragingOptimizer"),
    ({"sync": True, "num_workers": 2}, "SyncReplicasOptimizer"),
])
def test_a_layer_wraps_the_momentum_optimizer_only_where_its_flag_asks(fields, wrapper):
    fp16 = fields.pop("precision", None) == "fp16"
    with tf.Graph().as_default():
        stack, chain = built_stack(fp16=fp16, is_chief=False, **fields)
    assert [type(optimizer).__name__ for optimizer in chain] == (
        ["MomentumOptimizer"] + ([wrapper] if wrapper else []))
    assert len(stack.holders) == (wrapper in ("MuonOptimizer", "LookaheadOptimizer",
                                              "AveragingOptimizer"))
    # A worker that is not the chief runs the replicas' hook, not the chief's.
    assert [type(hook).__name__ for hook in stack.hooks] == (
        ["_SyncReplicasOptimizerHook"] if wrapper == "SyncReplicasOptimizer" else [])
