"""The FLOPs a run trains with, counted from the network's shapes: the plan line's, the
closing summary's and test_results.json's TFLOP, and the curves' TFLOP axis.

training.compute holds the accounting (the image-size phases, their examples, the
records); this module gives it the FLOPs of one example: the network's passes at the
phase's image size (cifar10_model.training_flops_per_example) and the update's own work
beyond them (Muon's orthogonalisations, per step, shared over the step's examples).
"""

from cifar10_estimator import cifar10
from cifar10_estimator import cifar10_model
from cifar10_estimator.training import compute
from cifar10_estimator.training import muon


def training_compute(hparams):
    """The run's training.compute.TrainingCompute: the examples of each image-size phase
    and the training FLOPs of one example at its size, its update's included."""
    return compute.TrainingCompute.of_run(
        hparams, cifar10.HEIGHT,
        lambda side: cifar10_model.training_flops_per_example(
            hparams.num_layers, side) + update_flops_per_example(hparams))


def update_flops_per_example(hparams):
    """FLOPs of a step's update beyond the network's passes, per example of the step:
    with --muon-learning-rate, its orthogonalisations (muon.step_flops); else none."""
    if not hparams.muon_learning_rate:
        return 0.0
    return (muon.step_flops(cifar10_model.kernel_shapes(hparams.num_layers))
            / hparams.examples_per_global_step)
