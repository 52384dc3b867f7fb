"""The multi-tower Estimator model_fn: one ResNet tower per device, gradients averaged.

Each global batch arrives split into K shards (see input_fn); on GPUs, training takes
each shard from its tower's device, where the step before staged it
(training.device_prefetch). Tower i runs on device i (a GPU, or a logical CPU device),
shares the variables of tower 0 through variable_scope reuse, and computes its own loss
and gradients (build_towers). Gradients are averaged on the device of their variable
(average_gradients) and one update is applied with tower 0's batch-norm updates
(_training_update), by the optimizer of training.optimizer_stack.
"""

import dataclasses
import typing

import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator import cifar10_model
from cifar10_estimator import cifar10_utils
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn
from cifar10_estimator.run import progress as run_progress
from cifar10_estimator.settings import precision
from cifar10_estimator.settings import schedule
from cifar10_estimator.training import area_resize
from cifar10_estimator.training import compute
from cifar10_estimator.training import device_prefetch
from cifar10_estimator.training import evaluation_views
from cifar10_estimator.training import example_skipping
from cifar10_estimator.training import losses
from cifar10_estimator.training import mixed_precision
from cifar10_estimator.training import optimizer_stack
from cifar10_estimator.training import scaffolds
# What make_model_fn takes, here with the model_fn.
from cifar10_estimator.training.tower_layout import TowerLayout  # noqa: F401

LOSS_LOG_EVERY_N_STEPS = 100
# The progress is reported this often; the console decides what it shows (run.console).
PROGRESS_LOG_EVERY_N_STEPS = 10
EXAMPLES_PER_SEC_LOG_EVERY_N_STEPS = 10
NUM_SUMMARY_IMAGES = 3
# The variable scope of the network's variables, in every mode: the checkpoints' names
# start with it (resnet/conv2d/kernel).
NETWORK_SCOPE = "resnet"


@dataclasses.dataclass(frozen=True)
class OptimisationConfig(job_hparams.ConfigFromHParams):
    """What a training step minimises and how it updates the weights, handed whole to
    the tower's loss (training.losses) and to the optimizer (training.optimizer_stack).
    Each field is the trainer flag of its name (hparams.HParams).

    Attributes:
      weight_decay, weight_decay_scope: the loss's weight decay.
      momentum, nesterov: the momentum optimizer's.
      shift_learning_rate_factor: batch norm's shift variables' rate, relative.
      moving_average_decay: the weights' averages kept beside them (None: none).
      lookahead_steps, lookahead_alpha: Lookahead's slow weights (steps 0: none).
      muon_learning_rate, muon_momentum: Muon for the kernels (rate 0: none).
      sync, num_workers: synchronous replicas, and how many trainers there are.
    """

    weight_decay: float = job_hparams.DEFAULTS.weight_decay
    weight_decay_scope: str = job_hparams.DEFAULTS.weight_decay_scope
    momentum: float = job_hparams.DEFAULTS.momentum
    nesterov: bool = job_hparams.DEFAULTS.nesterov
    shift_learning_rate_factor: float = job_hparams.DEFAULTS.shift_learning_rate_factor
    moving_average_decay: typing.Optional[float] = job_hparams.DEFAULTS.moving_average_decay
    lookahead_steps: int = job_hparams.DEFAULTS.lookahead_steps
    lookahead_alpha: float = job_hparams.DEFAULTS.lookahead_alpha
    muon_learning_rate: float = job_hparams.DEFAULTS.muon_learning_rate
    muon_momentum: float = job_hparams.DEFAULTS.muon_momentum
    sync: bool = job_hparams.DEFAULTS.sync
    num_workers: int = job_hparams.DEFAULTS.num_workers


def make_model_fn(layout, hparams, progress=None, starting_values=None):
    """An Estimator model_fn training `hparams` on the towers of `layout`.

    Args:
      layout: TowerLayout, the towers and variable placement.
      hparams: HParams.
      progress: the run's run.time_to_go.RunProgress, for training to log where it is
        and when it ends; None logs no progress.
      starting_values: {variable name: numpy array}, names as the checkpoints hold them
        (e.g. resnet/conv2d/kernel, see NETWORK_SCOPE): where a job starts (not where it
        resumes) those variables' values (scaffolds.starting_value_feeds).

    Returns:
      model_fn(features, labels, mode, config) for tf.estimator.Estimator, where
      features and labels are lists of one shard per tower (PREDICT: one batch).
    """
    precision_policy = precision.policy(hparams.precision)
    optimisation = OptimisationConfig.from_hparams(hparams)

    def model_fn(features, labels, mode, config):
        if mode == tf.estimator.ModeKeys.PREDICT:
            return _predict_spec(features, hparams)
        is_training = mode == tf.estimator.ModeKeys.TRAIN
        loss_scale = skipping = None
        features, labels, staged = _staged_on_towers(features, labels, layout, is_training,
                                                     hparams.skip_learned)
        if is_training and precision_policy.loss_scaling:
            with tf.device(layout.consolidation_device):
                loss_scale = mixed_precision.DynamicLossScale()
        if is_training and hparams.skip_learned:
            with tf.device(layout.consolidation_device):
                skipping = _learned_example_skipping(hparams)
                features, labels = example_skipping.chosen_examples(features, labels, skipping)
        tower_losses, tower_gradvars, tower_probabilities, update_ops = build_towers(
            features, labels, layout,
            make_resnet_tower_fn(hparams, precision_policy, layout.data_format, skipping),
            is_training,
            None if loss_scale is None else loss_scale.scale)

        with tf.device(layout.consolidation_device):
            # Not named "loss": tf.estimator writes the training loss under that tag,
            # which an op of the name would push to "loss_1", away from the
            # evaluations' "loss" in TensorBoard.
            loss = tf.reduce_mean(tower_losses, name="mean_loss")
            predictions = _predictions(tf.concat(tower_probabilities, axis=0))
            stacked_labels = tf.concat([shard["labels"] if isinstance(shard, dict) else shard
                                        for shard in labels], axis=0)
            if not is_training:
                metrics = {"accuracy": tf.compat.v1.metrics.accuracy(
                    stacked_labels, predictions["classes"])}
                return tf.estimator.EstimatorSpec(
                    mode=mode, loss=loss, predictions=predictions, eval_metric_ops=metrics,
                    scaffold=scaffolds.inference_scaffold(hparams.moving_average_decay))

            train_op, learning_rate, stack = _training_update(
                tower_gradvars, update_ops, hparams, optimisation,
                config.is_chief if config else True, loss_scale)
            if staged is not None:
                train_op = tf.group(train_op, staged.put)
        # Summaries and the Saver are host work (strings, files), whatever the strategy.
        with tf.device("/cpu:0"):
            logged = _training_summaries(learning_rate, loss, stacked_labels,
                                         predictions["classes"], features[0], loss_scale)
            holders = [holder for holder in (loss_scale, skipping)
                       if holder is not None] + stack.holders
            scaffold = scaffolds.training_scaffold(config, holders, input_fn.INPUT_SEEDS_NAME,
                                                   starting_values)

        return tf.estimator.EstimatorSpec(
            mode=mode, loss=loss, train_op=train_op, predictions=predictions,
            training_hooks=stack.hooks + _training_hooks(hparams, logged, progress, config)
            + ([staged.warm_up_hook()] if staged is not None else []),
            scaffold=scaffold)

    return model_fn


def _staged_on_towers(features, labels, layout, is_training, skip_learned):
    """(features, labels, staged): in training where `layout` prefetches, the shards
    staged on their towers' devices a step ahead and their device_prefetch.StagedShards;
    else the shards as they came and None. Not with --skip-learned: its examples are
    chosen on the consolidation device, which gathers them from the shards there."""
    if not (is_training and layout.prefetch_to_devices) or skip_learned:
        return features, labels, None
    staged = device_prefetch.stage_on_devices(features, labels, layout.devices)
    return staged.features, staged.labels, staged


def _learned_example_skipping(hparams):
    """--skip-learned's state, counting the examples of training.compute's phases."""
    phase_ends = [end for _, end in compute.image_size_phases(hparams, cifar10.HEIGHT)[:-1]]
    return example_skipping.LearnedExampleSkipping(
        hparams.skip_learned, hparams.num_train_examples,
        example_skipping.skipping_stop_step(hparams), phase_ends)


def build_towers(image_shards, label_shards, layout, tower_fn, is_training, loss_scale=None):
    """Build one tower per shard on the devices of `layout`, sharing variables.

    Args:
      image_shards, label_shards: lists with one tensor per tower.
      layout: TowerLayout.
      tower_fn: tower_fn(images, labels, is_training) -> (loss, class probabilities
        [N, 10]); it creates its variables with tf.compat.v1.get_variable (or layers),
        so towers after the first reuse them.
      is_training: build for training (gradients, batch-norm updates).
      loss_scale: fp16's scalar every tower multiplies its loss by before
        differentiating (mixed_precision.LossScaleOptimizer), or None.

    Returns:
      (tower_losses, tower_gradvars, tower_probabilities, update_ops): tower_gradvars
      holds one list of (gradient, variable) per tower, empty unless is_training;
      update_ops are tower 0's batch-norm updates.
    """
    tower_losses, tower_gradvars, tower_probabilities = [], [], []
    update_ops = []
    for index, (images, labels) in enumerate(zip(image_shards, label_shards)):
        with tf.compat.v1.variable_scope(NETWORK_SCOPE, reuse=bool(index != 0)):
            with tf.name_scope("tower_%d" % index) as name_scope:
                with tf.compat.v1.device(layout.device_setter(index)):
                    loss, probabilities = tower_fn(images, labels, is_training)
                    tower_losses.append(loss)
                    tower_probabilities.append(probabilities)
                    if is_training:
                        variables = tf.compat.v1.trainable_variables()
                        scaled_loss = loss if loss_scale is None else loss * loss_scale
                        gradients = tf.gradients(scaled_loss, variables)
                        tower_gradvars.append(list(zip(gradients, variables)))
                    if index == 0:
                        # Every tower shares the moving mean/variance variables. Running
                        # each tower's update would apply K updates per step (an effective
                        # decay of decay**K) and write across devices; tower 0's shard is
                        # an unbiased sample of the batch, so its update alone keeps the
                        # statistics the single-device model would have.
                        update_ops = tf.compat.v1.get_collection(
                            tf.compat.v1.GraphKeys.UPDATE_OPS, name_scope)
    return tower_losses, tower_gradvars, tower_probabilities, update_ops


def make_resnet_tower_fn(hparams, precision_policy, data_format, skipping=None):
    """tower_fn(images, labels, is_training) -> (loss, class probabilities [N, 10]) of the
    ResNet of `hparams` (its ModelConfig) computing in `data_format` (TowerLayout's).

    The loss is losses.tower_loss's, of the OptimisationConfig of `hparams`; evaluation's
    probabilities are averaged over the views of its images (evaluation_views). With
    `skipping` (an example_skipping.LearnedExampleSkipping) a training shard's labels are
    example_skipping.chosen_examples' dict, and the loss is losses.skipped_examples_loss's.
    """
    network = _network(cifar10_model.ModelConfig.from_hparams(hparams), data_format)
    optimisation = OptimisationConfig.from_hparams(hparams)
    views = evaluation_views.EvaluationViews.from_hparams(hparams)
    resolution_phases = schedule.resolution_phases(hparams)

    def tower_fn(images, labels, is_training):
        if is_training:
            global_step = tf.compat.v1.train.get_global_step()
            trained_on = area_resize.phase_images(images, resolution_phases, global_step)
            logits = network(trained_on, True, mixed_precision.compute_dtype(precision_policy))
            probabilities = _class_probabilities(logits)
            smoothing = schedule.label_smoothing(hparams, global_step)
            if skipping is not None:
                return losses.skipped_examples_loss(labels, logits, optimisation, smoothing,
                                                    skipping), probabilities
        else:
            dtype = mixed_precision.compute_dtype(precision_policy,
                                                  hparams.eval_in_training_precision)
            logits, probabilities = views.logits_and_probabilities(
                images, lambda batch: network(batch, False, dtype), _class_probabilities)
            smoothing = 0.0
        return losses.tower_loss(labels, logits, optimisation, smoothing), probabilities
    return tower_fn


def _network(config, data_format):
    """logits(images, is_training, dtype): the float32 logits of the ResNet that `config`
    (a cifar10_model.ModelConfig) describes, computing in `data_format` and `dtype`
    (float32, or the precision policy's compute type: see mixed_precision.compute_dtype)."""
    def logits(images, is_training, dtype):
        model = cifar10_model.ResNetCifar10.from_config(config, is_training, data_format)
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                         custom_getter=mixed_precision.float32_variables,
                                         auxiliary_name_scope=False):
            output = model.forward_pass(tf.cast(images, dtype),
                                        input_data_format="channels_last")
        return tf.cast(output, tf.float32)
    return logits


def _class_probabilities(logits):
    """Softmax over CIFAR-10's 10 classes: the network's 11th logit is never a label and
    is left out (cifar10_model.class_logits)."""
    return tf.nn.softmax(cifar10_model.class_logits(logits))


def average_gradients(tower_gradvars):
    """Average each variable's gradient over the towers, on the variable's own device.

    Args:
      tower_gradvars: one list of (gradient, variable) pairs per tower, all in the
        same variable order.

    Returns:
      A list of (averaged gradient, variable) pairs.
    """
    averaged = []
    with tf.name_scope("gradient_averaging"):
        for pairs in zip(*tower_gradvars):
            variable = pairs[0][1]
            if any(other is not variable for _, other in pairs):
                raise ValueError("towers disagree on the variable order")
            gradients = [gradient for gradient, _ in pairs]
            if len(gradients) == 1:
                averaged.append((gradients[0], variable))
                continue
            with tf.device(variable.device):
                mean = tf.multiply(tf.add_n(gradients), 1.0 / len(gradients))
            averaged.append((mean, variable))
    return averaged


def scale_shift_gradients(gradvars, factor):
    """Multiply the gradients of batch norm's shift (beta) variables by `factor`.

    With momentum SGD that is a learning rate `factor` times the others' for those
    variables alone: the few, cheap parameters that airbench (Jordan 2024) trains faster.
    """
    if factor == 1:
        return gradvars
    return [(gradient * factor if variable.op.name.endswith("/beta") else gradient, variable)
            for gradient, variable in gradvars]


def _training_update(tower_gradvars, update_ops, hparams, optimisation, is_chief,
                     loss_scale=None):
    """One step's update: the towers' averaged gradients applied at the schedule's rate
    by the optimizer stack of `optimisation` (an OptimisationConfig), and tower 0's
    batch-norm updates (build_towers' update_ops). Returns (train_op, the learning rate
    tensor, the optimizer_stack.OptimizerStack: the holders of the variables its layers
    added (Muon's momenta, Lookahead's slow weights, the weights' averages), its hooks)."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = schedule.learning_rate_tensor(hparams, global_step)
    stack = optimizer_stack.build(optimizer_stack.UpdateInputs(
        optimisation=optimisation, learning_rate=learning_rate,
        base_learning_rate=schedule.base_learning_rate(hparams), global_step=global_step,
        last_step=schedule.last_step(hparams), variables=tf.compat.v1.trainable_variables(),
        loss_scale=loss_scale, is_chief=is_chief))
    apply_op = stack.optimizer.apply_gradients(
        scale_shift_gradients(average_gradients(tower_gradvars),
                              optimisation.shift_learning_rate_factor),
        global_step=global_step)
    return tf.group(apply_op, *update_ops), learning_rate, stack


def _training_summaries(learning_rate, loss, labels, classes, images, loss_scale=None):
    """TensorBoard's training summaries; returns the tensors the log shows every 100 steps."""
    batch_accuracy = tf.reduce_mean(tf.cast(
        tf.equal(tf.cast(labels, tf.int64), classes), tf.float32))
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)
    # The evaluations' tag for their accuracy, so the curves lie over each other.
    tf.compat.v1.summary.scalar("accuracy", batch_accuracy)
    tf.compat.v1.summary.image("images", tf.cast(images, tf.uint8),
                               max_outputs=NUM_SUMMARY_IMAGES)
    logged = {"learning_rate": learning_rate, "loss": loss}
    if loss_scale is not None:
        tf.compat.v1.summary.scalar("loss_scale", loss_scale.scale)
        logged["loss_scale"] = loss_scale.scale
    return logged


def _training_hooks(hparams, logged, progress, config):
    """The tutorial's logging hooks, and the run's progress where there is one."""
    hooks = [
        tf.compat.v1.train.LoggingTensorHook(logged, every_n_iter=LOSS_LOG_EVERY_N_STEPS),
        cifar10_utils.ExamplesPerSecondHook(
            hparams.train_batch_size, every_n_steps=EXAMPLES_PER_SEC_LOG_EVERY_N_STEPS,
            examples_per_global_step=(
                hparams.examples_per_global_step if hparams.num_workers > 1 else None)),
    ]
    if progress is not None:
        hooks.append(run_progress.ProgressHook(
            progress, every_n_steps=PROGRESS_LOG_EVERY_N_STEPS,
            summary_dir=config.model_dir if config and config.is_chief else None,
            summary_every_n_steps=config.save_summary_steps if config else 100))
    return hooks


def _predictions(probabilities):
    """Predictions of every mode and of the SavedModel signatures, from class
    `probabilities` [N, 10]: classes (int64 [N], the most probable), class_names (string
    [N], from cifar10.CLASS_NAMES) and the probabilities (float32 [N, 10])."""
    classes = tf.argmax(probabilities, axis=1)
    # Strings have no GPU kernels: the names are looked up on the host.
    with tf.device("/cpu:0"):
        class_names = tf.gather(tf.constant(cifar10.CLASS_NAMES), classes)
    return {"classes": classes, "class_names": class_names, "probabilities": probabilities}


def _predict_spec(features, hparams):
    """PREDICT (and SavedModel export): one tower, whatever the number of training towers.

    It names no device and computes channels_last, which every device supports (the
    variables are the same in both layouts): TensorFlow puts it on one device, the
    first GPU if there is one, and an export made on GPUs serves on a CPU too.
    features: images [N, 32, 32, 3] in NHWC with pixel values 0..255 (uint8 or float),
    as a tensor or as a dict with key 'images' (the serving receiver).
    """
    images = features["images"] if isinstance(features, dict) else features
    images = tf.cast(images, tf.float32)
    network = _network(cifar10_model.ModelConfig.from_hparams(hparams), "channels_last")
    with tf.compat.v1.variable_scope(NETWORK_SCOPE):
        _, probabilities = evaluation_views.EvaluationViews.from_hparams(
            hparams).logits_and_probabilities(
            images, lambda batch: network(batch, False, tf.float32), _class_probabilities)
    predictions = _predictions(probabilities)
    return tf.estimator.EstimatorSpec(
        mode=tf.estimator.ModeKeys.PREDICT,
        predictions=predictions,
        export_outputs={tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
                        tf.estimator.export.PredictOutput(predictions)},
        scaffold=scaffolds.inference_scaffold(hparams.moving_average_decay))
