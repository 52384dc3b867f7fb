"""A run's schedule: the step it ends at, the learning rate at every step, and the steps
that train on shrunk images.

Given HParams, this module answers every question about the schedule: the last step,
the drops, the rate at any step (the tensor the trainer's optimizer reads, which the
tests evaluate), how many of the first steps train at --low-resolution pixels
(--low-resolution-epochs), and the one line the log prints about it all. Nothing else
computes a rate.

The tutorial trains 80000 global steps and multiplies its base rate by 0.1, 0.01 and
0.002 after epochs 82, 123 and 300: the ResNet paper's drops at 32k and 48k of its 64k
iterations, placed for a 256-epoch run (the third is never reached). With train_epochs
the run is E epochs long and the drops sit in proportion to it (`PROPORTIONAL_DROPS`), as
they do in a train_steps run that names its learning_rate_drops.
That is the "piecewise" shape; "cosine" (a half cosine) and "linear" instead fall
smoothly from the base rate to exactly 0 at the last step. A warm-up of W epochs first
raises the rate linearly from base / warm-up steps to the base rate; cosine and linear
then fall over the steps that remain, while piecewise keeps its drops where they are.
Imports no TensorFlow until a tensor is asked for, so the flags can name these values.
"""

import math

# The tutorial's run when neither train_steps nor train_epochs is given.
TUTORIAL_TRAIN_STEPS = 80000
TUTORIAL_DROP_EPOCHS = (82, 123, 300)
TUTORIAL_DROP_FACTORS = (1.0, 0.1, 0.01, 0.002)

# With train_epochs the drops are placed as fractions of the run's steps: (fractions,
# factors). "paper": He et al. 2016 divide by 10 at 32k and 48k of 64k iterations;
# "tutorial": where the tutorial's drops fall in its 256 epochs (82/256, 123/256).
PROPORTIONAL_DROPS = {
    "paper": ((0.5, 0.75), (1.0, 0.1, 0.01)),
    "tutorial": ((82 / 256, 123 / 256), (1.0, 0.1, 0.01)),
}

# --learning-rate-schedule: the shape of the rate over the run; piecewise is the original's.
SHAPES = ("piecewise", "cosine", "linear")

# Whether the base rate follows the global batch. The reference is the batch the
# tutorial's and the paper's 0.1 is meant for.
LEARNING_RATE_SCALINGS = ("none", "linear")
REFERENCE_BATCH_SIZE = 128


def steps_per_epoch(hparams):
    """Whole global steps in one epoch of the training set (at least 1)."""
    return max(1, hparams.num_train_examples // hparams.examples_per_global_step)


def last_step(hparams):
    """The global step training stops at: train_steps, train_epochs' steps, or the tutorial's."""
    if hparams.train_steps is not None:
        return hparams.train_steps
    if hparams.train_epochs is not None:
        return max(1, int(round(hparams.train_epochs * steps_per_epoch(hparams))))
    return TUTORIAL_TRAIN_STEPS


def warmup_steps(hparams):
    """Global steps of the linear warm-up (0: none)."""
    return int(round(hparams.warmup_epochs * steps_per_epoch(hparams)))


# The phases trained on shrunk images, in their order: the HParams fields of each one's
# side and epochs.
REDUCED_RESOLUTION_PHASES = (("lower_resolution", "lower_resolution_epochs"),
                             ("low_resolution", "low_resolution_epochs"))


def reduced_resolution_settings(hparams):
    """[(side, epochs)] of the phases of REDUCED_RESOLUTION_PHASES that have epochs."""
    settings = [(getattr(hparams, side), getattr(hparams, epochs))
                for side, epochs in REDUCED_RESOLUTION_PHASES]
    return [(side, epochs) for side, epochs in settings if epochs]


def resolution_phases(hparams):
    """[(side, end step)] of the phases trained on shrunk images, in their order: the
    --lower-resolution epochs, then the --low-resolution ones; each phase trains until the
    global step reaches its end step. Empty: every step at full size."""
    phases, epochs = [], 0.0
    for side, phase_epochs in reduced_resolution_settings(hparams):
        epochs += phase_epochs
        phases.append((side, int(round(epochs * steps_per_epoch(hparams)))))
    return phases


def low_resolution_steps(hparams):
    """Global steps trained on shrunk images, every phase of resolution_phases (0: none)."""
    phases = resolution_phases(hparams)
    return phases[-1][1] if phases else 0


def drops(hparams):
    """(boundaries, factors) of the piecewise-constant rate, boundaries in global steps.

    The rate is base x factors[i] after boundaries[i - 1] and up to boundaries[i].
    """
    proportions = proportional_drops(hparams)
    if proportions is None:
        epoch_steps = steps_per_epoch(hparams)
        return [epoch_steps * epoch for epoch in TUTORIAL_DROP_EPOCHS], TUTORIAL_DROP_FACTORS
    fractions, factors = PROPORTIONAL_DROPS[proportions]
    return [int(round(fraction * last_step(hparams))) for fraction in fractions], factors


def proportional_drops(hparams):
    """The PROPORTIONAL_DROPS key the drops follow, or None for the tutorial's epochs.

    learning_rate_drops when given (with train_steps too: --train-steps 64000
    --learning-rate-drops paper drops after steps 32000 and 48000, the paper's run),
    else "paper" for a train_epochs run and the tutorial's epochs otherwise.
    """
    if hparams.learning_rate_drops is not None:
        return hparams.learning_rate_drops
    return "paper" if hparams.train_epochs is not None else None


def unused_fields(hparams):
    """The HParams fields this run's schedule reads nothing from.

    The drops shape only the piecewise rate: a cosine or linear run ignores
    learning_rate_drops, whatever hparams.json records for it.
    """
    return () if hparams.learning_rate_schedule == "piecewise" else ("learning_rate_drops",)


def base_learning_rate(hparams):
    """The rate the schedule starts from: learning_rate, scaled to the global batch if asked.

    'none' keeps hparams.learning_rate (the original); 'linear' multiplies it by the
    global batch over REFERENCE_BATCH_SIZE, Goyal et al. 2017's rule as official/resnet
    applies it.
    """
    if hparams.learning_rate_scaling == "linear":
        return hparams.learning_rate * hparams.examples_per_global_step / REFERENCE_BATCH_SIZE
    return hparams.learning_rate


def _decay_span(hparams):
    """(first, last) step of the smooth shapes' fall: from the warm-up's end to the last step."""
    first = warmup_steps(hparams)
    return first, max(last_step(hparams), first + 1)


def learning_rate_tensor(hparams, global_step):
    """The rate at global_step (an int64 tensor), as a scalar float32 tensor."""
    import numpy as np
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    base = base_learning_rate(hparams)
    if hparams.learning_rate_schedule == "piecewise":
        boundaries, factors = drops(hparams)
        rate = tf.compat.v1.train.piecewise_constant(
            global_step, [np.int64(boundary) for boundary in boundaries],
            [base * factor for factor in factors])
    else:
        first, last = _decay_span(hparams)
        progress = tf.clip_by_value(
            tf.cast(global_step - first, tf.float32) / float(last - first), 0.0, 1.0)
        if hparams.learning_rate_schedule == "cosine":
            rate = base * 0.5 * (1.0 + tf.cos(math.pi * progress))
        else:
            rate = base * (1.0 - progress)
    warmup = warmup_steps(hparams)
    if not warmup:
        return rate
    warming = base * tf.cast(global_step + 1, tf.float32) / float(warmup)
    return tf.where(global_step < warmup, warming, rate)


def label_smoothing(hparams, global_step):
    """The smoothing factor of the training targets at global_step: --label-smoothing F
    as a number, or with --label-smoothing-decay the scalar float32 tensor
    F x (1 - step / last step), which reaches 0 at the last step."""
    if not (hparams.label_smoothing_decay and hparams.label_smoothing):
        return hparams.label_smoothing
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    progress = tf.clip_by_value(
        tf.cast(global_step, tf.float32) / float(last_step(hparams)), 0.0, 1.0)
    return hparams.label_smoothing * (1.0 - progress)


def base_learning_rate_text(hparams):
    """The base rate for the log, with its arithmetic when it was scaled.

    E.g. '0.1', or '0.2 (0.1 x 256/128, --learning-rate-scaling linear)'.
    """
    rate = base_learning_rate(hparams)
    if hparams.learning_rate_scaling == "none":
        return "%g" % rate
    return "%g (%g x %d/%d, --learning-rate-scaling %s)" % (
        rate, hparams.learning_rate, hparams.examples_per_global_step, REFERENCE_BATCH_SIZE,
        hparams.learning_rate_scaling)


def describe(hparams):
    """The log's one line about the run's length and its learning rate."""
    end = last_step(hparams)
    return ("Training to step %d (%.1f epochs of %d examples at %d per step); learning rate "
            "%s%s, %s") % (
        end, end / steps_per_epoch(hparams), hparams.num_train_examples,
        hparams.examples_per_global_step, base_learning_rate_text(hparams),
        _warmup_text(hparams), _shape_text(hparams)) + _low_resolution_text(hparams)


def _warmup_text(hparams):
    warmup = warmup_steps(hparams)
    if not warmup:
        return ""
    return " reached after a linear warm-up of %d steps (%g epochs)" % (
        warmup, hparams.warmup_epochs)


def _low_resolution_text(hparams):
    phases = resolution_phases(hparams)
    if not phases:
        return ""
    return "; images %s, then 32x32" % ", ".join(
        "%dx%d until step %d (%g epochs)" % (side, side, end, epochs)
        for (side, end), (_, epochs) in zip(phases, reduced_resolution_settings(hparams)))


def _shape_text(hparams):
    end = last_step(hparams)
    if hparams.learning_rate_schedule == "piecewise":
        boundaries, factors = drops(hparams)
        drop_text = ", ".join("x%g after step %d" % (factor, boundary)
                              for boundary, factor in zip(boundaries, factors[1:])
                              if boundary < end)
        return drop_text or "never dropped"
    return "%s decay to 0 at step %d" % (hparams.learning_rate_schedule, end)


def never_drops_warning(hparams):
    """A warning when --train-steps ends before the tutorial's first drop, else None."""
    if (hparams.learning_rate_schedule != "piecewise" or hparams.train_steps is None
            or proportional_drops(hparams) is not None):
        return None
    boundaries, _ = drops(hparams)
    if hparams.train_steps > boundaries[0]:
        return None
    return ("--train-steps %d ends before the first learning-rate drop (after step %d, epoch "
            "%d): the rate stays %g for the whole run. To fit the drops into a shorter run, "
            "add --learning-rate-drops paper, or give --train-epochs E instead."
            % (hparams.train_steps, boundaries[0], TUTORIAL_DROP_EPOCHS[0],
               base_learning_rate(hparams)))
