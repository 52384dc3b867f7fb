"""The multi-tower Estimator model_fn: one ResNet tower per device, gradients averaged.

Each global batch arrives split into K shards (see input_fn); on GPUs, training takes
each shard from its tower's device, where the step before staged it
(training.device_prefetch). Tower i runs on device i (a GPU, or a logical CPU device),
shares the variables of tower 0 through variable_scope reuse, and computes its own loss
and gradients. Gradients are averaged on the device of their variable and one optimizer
update is applied.
"""

import dataclasses
import typing

import numpy as np
import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator import cifar10_model
from cifar10_estimator import cifar10_utils
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn
from cifar10_estimator.training import area_resize
from cifar10_estimator.training import checkpoint_saver
from cifar10_estimator.training import compute
from cifar10_estimator.training import device_prefetch
from cifar10_estimator.training import example_skipping
from cifar10_estimator.training import lookahead
from cifar10_estimator.training import mixed_precision
from cifar10_estimator.training import muon
from cifar10_estimator.settings import precision
from cifar10_estimator.run import progress as run_progress
from cifar10_estimator.settings import schedule
from cifar10_estimator.training import weight_averaging

LOSS_LOG_EVERY_N_STEPS = 100
# The progress is reported this often; the console decides what it shows (run.console).
PROGRESS_LOG_EVERY_N_STEPS = 10
EXAMPLES_PER_SEC_LOG_EVERY_N_STEPS = 10
NUM_SUMMARY_IMAGES = 3
# The variable scope of the network's variables, in every mode: the checkpoints' names
# start with it (resnet/conv2d/kernel).
NETWORK_SCOPE = "resnet"


@dataclasses.dataclass(frozen=True)
class TowerLayout:
    """Where towers run, where their variables live, and the layout the network computes
    in there: the run's devices, which hparams.HParams leave out.

    Attributes:
      devices: one device string per tower, e.g. ['/gpu:0', '/gpu:1'] or ['/cpu:0'].
      data_format: the layout inside the network (model_base.DATA_FORMATS); the
        variables, so the checkpoints, are the same in both.
      variable_strategy: 'CPU' keeps every variable on /cpu:0; 'GPU' spreads them
        over the tower devices, each on the least loaded by bytes.
      prefetch_to_devices: training stages each tower's shard on its device a step
        ahead (training.device_prefetch): for GPU towers, whose shards cross from the
        host; CPU towers share the host's memory.
    """

    devices: tuple
    data_format: str
    variable_strategy: str = "CPU"
    prefetch_to_devices: bool = False

    @classmethod
    def for_devices(cls, num_gpus, num_cpu_towers=1, variable_strategy="CPU",
                    data_format=None):
        """num_gpus GPU towers, or (num_gpus == 0) num_cpu_towers logical CPU towers.

        data_format None takes the devices' own: channels_first (NCHW, fastest) on GPUs,
        channels_last on the CPU, the only layout of TensorFlow's stock CPU kernels.
        """
        if num_gpus > 0:
            devices = tuple("/gpu:%d" % i for i in range(num_gpus))
        else:
            devices = tuple("/cpu:%d" % i for i in range(num_cpu_towers))
        return cls(devices=devices, variable_strategy=variable_strategy,
                   data_format=data_format or ("channels_first" if num_gpus > 0
                                               else "channels_last"),
                   prefetch_to_devices=num_gpus > 0)

    @property
    def num_towers(self):
        return len(self.devices)

    @property
    def consolidation_device(self):
        """Device of the averaged update: next to the variables."""
        return "/gpu:0" if self.variable_strategy == "GPU" else "/cpu:0"

    def device_setter(self, tower_index):
        """Device function for tower `tower_index`: its ops on its device, variables per strategy."""
        worker_device = self.devices[tower_index]
        if self.variable_strategy == "CPU":
            return cifar10_utils.local_device_setter(worker_device=worker_device)
        strategy = cifar10_utils.GreedyLoadBalancingStrategy(
            self.num_towers, cifar10_utils.byte_size_load_fn)
        device_type = worker_device.split(":")[0].lstrip("/")
        return cifar10_utils.local_device_setter(
            num_devices=self.num_towers, ps_device_type=device_type,
            worker_device=worker_device, ps_strategy=strategy)


@dataclasses.dataclass(frozen=True)
class OptimisationConfig(job_hparams.ConfigFromHParams):
    """What a training step minimises and how it updates the weights, handed whole to
    the tower's loss and to the optimizer; make_model_fn builds it from its HParams.
    Each field is the trainer flag of its name (hparams.HParams).

    Attributes:
      weight_decay, weight_decay_scope: the loss (tower_loss; its label smoothing at a
        step is schedule.label_smoothing's).
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


def _training_resolution(images, hparams):
    """The training images, area-resized to the side of the phase of
    schedule.resolution_phases the global step is in, else (after them) as they are.
    Read from the global step, the switches hold across restarts; the resize runs on the
    tower's device (area_resize)."""
    global_step = tf.compat.v1.train.get_global_step()
    trained_on = images
    # From the last phase back: each phase's images where the step is below its end,
    # else those of the phases after it.
    for side, end in reversed(schedule.resolution_phases(hparams)):
        trained_on = tf.cond(
            global_step < end,
            lambda side=side: area_resize.area_resize(images, side),
            lambda later=trained_on: later)
    return trained_on


def training_compute(hparams):
    """The run's training.compute.TrainingCompute: the examples of each image-size phase
    (_training_resolution's) and the training FLOPs of one at its size
    (cifar10_model.training_flops_per_example), with --muon-learning-rate each step's
    orthogonalisations shared over its examples."""
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


def _class_probabilities(logits):
    """Softmax over CIFAR-10's 10 classes: the network's 11th logit is never a label and
    is left out (cifar10_model.class_logits)."""
    return tf.nn.softmax(cifar10_model.class_logits(logits))


def _inference(images, network, hparams, dtype):
    """(logits of `images`, class probabilities [N, 10]) of evaluation and prediction by
    `network` (_network's), computing in `dtype`.

    With --eval-flips and --eval-shifts the network runs once on every view of the images
    (see _views) and the probabilities are the mean over each image's views. The logits
    stay those of the images alone: the evaluation loss is their plain cross entropy,
    comparable with that of runs without test-time views.
    """
    views = _views(images, hparams.eval_shifts, hparams.eval_flips)
    if len(views) == 1:
        logits = network(images, False, dtype)
        return logits, _class_probabilities(logits)
    all_logits = tf.split(network(tf.concat(views, axis=0), False, dtype), len(views), axis=0)
    probabilities = tf.add_n([_class_probabilities(logits) for logits in all_logits])
    return all_logits[0], probabilities / float(len(views))


# The shifted views' (top, left) offsets in the padded image, in units of the shift:
# right, left, down and up.
SHIFT_OFFSETS = ((1, 0), (1, 2), (0, 1), (2, 1))


def num_views(hparams):
    """How many views of each image an evaluation or prediction averages (_views)."""
    return (1 + (len(SHIFT_OFFSETS) if hparams.eval_shifts else 0)) * (
        2 if hparams.eval_flips else 1)


def _views(images, shift, flips):
    """The images first, then each shifted by `shift` pixels right, left, down and up
    (zero fill, as the training crops' padding), then every one of those mirrored."""
    views = [images]
    if shift:
        padded = tf.pad(images, [[0, 0], [shift, shift], [shift, shift], [0, 0]])
        height, width = images.shape[1], images.shape[2]
        for top, left in SHIFT_OFFSETS:
            views.append(padded[:, top * shift:top * shift + height,
                                left * shift:left * shift + width, :])
    if flips:
        views += [tf.image.flip_left_right(view) for view in views]
    return views


def mean_cross_entropy(labels, logits, label_smoothing=0.0):
    """Mean cross entropy of labels [N] against logits [N, 11], optionally label-smoothed.

    The softmax runs over all the network's logits, as the original's loss did. With
    label_smoothing F the target is 1 - F on the label plus F / 10 on each of CIFAR-10's
    classes; the 11th logit, never a label, gets no target mass. F may be a tensor (a
    smoothing that changes with the step).
    """
    if not tf.is_tensor(label_smoothing) and not label_smoothing:
        return tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels=labels, logits=logits, loss_collection=None)
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=_smoothed_targets(labels, logits, label_smoothing), logits=logits))


def _smoothed_targets(labels, logits, label_smoothing):
    """The targets [N, 11] of labels [N] smoothed by `label_smoothing` (mean_cross_entropy's)."""
    class_targets = (tf.one_hot(labels, cifar10.NUM_CLASSES) * (1.0 - label_smoothing)
                     + label_smoothing / cifar10.NUM_CLASSES)
    return tf.pad(class_targets, [[0, 0], [0, logits.shape[-1] - cifar10.NUM_CLASSES]])


def cross_entropies(labels, logits, label_smoothing=0.0):
    """float32 [N]: each example's cross entropy, as mean_cross_entropy averages them."""
    if not tf.is_tensor(label_smoothing) and not label_smoothing:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.nn.softmax_cross_entropy_with_logits(
        labels=_smoothed_targets(labels, logits, label_smoothing), logits=logits)


def make_resnet_tower_fn(hparams, precision_policy, data_format, skipping=None):
    """tower_fn(images, labels, is_training) -> (loss, class probabilities) of the ResNet
    of `hparams` (its ModelConfig) computing in `data_format` (TowerLayout's).

    The loss is tower_loss's, of the OptimisationConfig of `hparams`; the probabilities
    [N, 10] are those the predictions come from (see _inference for evaluation). With
    `skipping` (an example_skipping.LearnedExampleSkipping) a training shard's labels are
    chosen_examples' dict, and the loss is skipped_examples_loss's.
    """
    network = _network(cifar10_model.ModelConfig.from_hparams(hparams), data_format)
    optimisation = OptimisationConfig.from_hparams(hparams)

    def tower_fn(images, labels, is_training):
        if is_training:
            logits = network(_training_resolution(images, hparams), True,
                             mixed_precision.compute_dtype(precision_policy))
            probabilities = _class_probabilities(logits)
            smoothing = schedule.label_smoothing(hparams, tf.compat.v1.train.get_global_step())
            if skipping is not None:
                return skipped_examples_loss(labels, logits, optimisation, smoothing,
                                             skipping), probabilities
        else:
            logits, probabilities = _inference(
                images, network, hparams, mixed_precision.compute_dtype(
                    precision_policy, hparams.eval_in_training_precision))
            smoothing = 0.0
        return tower_loss(labels, logits, optimisation, smoothing), probabilities
    return tower_fn


def tower_loss(labels, logits, optimisation, label_smoothing):
    """The mean cross entropy of a shard, its targets smoothed by `label_smoothing` (0.0
    in evaluation, schedule.label_smoothing in training), plus weight decay over the
    trainable variables --weight-decay-scope names (decayed_variables; all of them, as in
    the tutorial, by default); optimisation: an OptimisationConfig."""
    return mean_cross_entropy(labels, logits, label_smoothing) + weight_decay_loss(optimisation)


def weight_decay_loss(optimisation):
    """--weight-decay times the squared norms (halved) of the variables it decays."""
    decayed = decayed_variables(tf.compat.v1.trainable_variables(),
                                optimisation.weight_decay_scope)
    return optimisation.weight_decay * tf.add_n([tf.nn.l2_loss(variable) for variable in decayed])


def chosen_examples(features, labels, skipping):
    """The training shards cut to the examples `skipping` (an
    example_skipping.LearnedExampleSkipping) trains this step.

    Args:
      features: per tower a dict of "images" and their "example_indices" (the training
        input_fn's with_example_indices).
      labels: per tower the labels [B].

    Returns:
      (image shards, label shards): per tower the chosen images, and a dict of their
      "labels", "example_indices" and "loss_weights".
    """
    global_step = tf.compat.v1.train.get_global_step()
    image_shards, label_shards = [], []
    for shard, shard_labels in zip(features, labels):
        positions, weights = skipping.choose(shard["example_indices"], global_step)
        image_shards.append(tf.gather(shard["images"], positions))
        label_shards.append({"labels": tf.gather(shard_labels, positions),
                             "example_indices": tf.gather(shard["example_indices"], positions),
                             "loss_weights": weights})
    return image_shards, label_shards


def skipped_examples_loss(chosen, logits, optimisation, label_smoothing, skipping):
    """tower_loss of the examples of `chosen` (chosen_examples' label dict) with their
    weights, after keeping each one's cross entropy for the next steps' choice."""
    losses = cross_entropies(chosen["labels"], logits, label_smoothing)
    record = skipping.record(chosen["example_indices"], losses,
                             tf.compat.v1.train.get_global_step())
    with tf.control_dependencies([record]):
        cross_entropy = tf.math.divide_no_nan(tf.reduce_sum(losses * chosen["loss_weights"]),
                                              tf.reduce_sum(chosen["loss_weights"]))
    return cross_entropy + weight_decay_loss(optimisation)


def decayed_variables(variables, weight_decay_scope):
    """The variables that weight decay applies to, for a hparams.WEIGHT_DECAY_SCOPES entry.

    kernels keeps the convolution and dense kernels (`.../kernel`), leaving batch norm's
    gamma and beta and the dense bias undecayed: the "no bias decay" of He et al. 2019
    (Bag of Tricks).
    """
    if weight_decay_scope == "all":
        return list(variables)
    if weight_decay_scope == "kernels":
        return [v for v in variables if v.op.name.rsplit("/", 1)[-1] == "kernel"]
    raise ValueError("weight_decay_scope %r is not one of %s"
                     % (weight_decay_scope, job_hparams.WEIGHT_DECAY_SCOPES))


def build_towers(image_shards, label_shards, layout, tower_fn, is_training, loss_scale=None):
    """Build one tower per shard on the devices of `layout`, sharing variables.

    Args:
      image_shards, label_shards: lists with one tensor per tower.
      layout: TowerLayout.
      tower_fn: tower_fn(images, labels, is_training) -> (loss, class probabilities
        [N, 10]); it creates its variables with tf.compat.v1.get_variable (or layers),
        so towers after the first reuse them.
      is_training: build for training (gradients, batch-norm updates).
      loss_scale: with loss scaling (fp16), the scalar every tower multiplies its loss by
        before differentiating (see mixed_precision.LossScaleOptimizer); None
        differentiates the loss.

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


def _make_optimizer(learning_rate, optimisation, is_chief, loss_scale=None,
                    weight_averages=None, slow_weights=None, kernel_momenta=None):
    """The momentum optimizer of `optimisation` (an OptimisationConfig), updating the
    kernels of `kernel_momenta` (a muon.KernelMomenta, or None) by Muon, unscaling fp16
    gradients with `loss_scale` (a mixed_precision.DynamicLossScale, or None),
    synchronising `slow_weights` (a lookahead.SlowWeights, or None) and then updating
    `weight_averages` (a weight_averaging.WeightAverages, or None) after each update, and
    wrapped for synchronous replicas with --sync.

    Returns:
      (optimizer, hooks) where hooks must run on every worker.
    """
    optimizer = tf.compat.v1.train.MomentumOptimizer(
        learning_rate, momentum=optimisation.momentum, use_nesterov=optimisation.nesterov)
    if kernel_momenta is not None:
        optimizer = muon.MuonOptimizer(optimizer, kernel_momenta)
    if loss_scale is not None:
        optimizer = mixed_precision.LossScaleOptimizer(optimizer, loss_scale)
    if slow_weights is not None:
        optimizer = lookahead.LookaheadOptimizer(optimizer, slow_weights)
    if weight_averages is not None:
        optimizer = weight_averaging.AveragingOptimizer(optimizer, weight_averages)
    if not optimisation.sync:
        return optimizer, []
    optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
        optimizer,
        replicas_to_aggregate=optimisation.num_workers,
        total_num_replicas=optimisation.num_workers)
    hooks = [optimizer.make_session_run_hook(is_chief=False)]
    if is_chief:
        hooks.append(cifar10_utils.SyncReplicasChiefHook(optimizer))
    return optimizer, hooks


def _predictions(probabilities):
    """Predictions of every mode and of the SavedModel signatures, over CIFAR-10's 10 classes.

    Args:
      probabilities: class probabilities [N, 10] (_class_probabilities, or with
        --eval-flips and --eval-shifts their mean over each image's views, see
        _inference).

    Returns:
      dict with classes (int64 [N], the most probable), class_names (string [N], from
      cifar10.CLASS_NAMES) and probabilities (float32 [N, 10]).
    """
    classes = tf.argmax(probabilities, axis=1)
    # Strings have no GPU kernels: the names are looked up on the host.
    with tf.device("/cpu:0"):
        class_names = tf.gather(tf.constant(cifar10.CLASS_NAMES), classes)
    return {"classes": classes, "class_names": class_names, "probabilities": probabilities}


def _inference_scaffold(hparams):
    """The Scaffold of EVAL and PREDICT (so of exports): with --moving-average-decay its
    Saver restores the averaged weights (weight_averaging.evaluation_saver)."""
    if hparams.moving_average_decay is None:
        return None
    with tf.device("/cpu:0"):  # a Saver's ops are file and string work
        return tf.compat.v1.train.Scaffold(
            saver=weight_averaging.evaluation_saver(tf.compat.v1.trainable_variables()))


def _predict_spec(features, hparams):
    """PREDICT (and SavedModel export): one tower, whatever the number of training towers.

    It names no device and computes channels_last, which every device supports (the
    variables are the same in both layouts): TensorFlow puts it on one device, the
    first GPU if there is one, and an export made on GPUs serves on a CPU too.

    Args:
      features: images [N, 32, 32, 3] in NHWC with pixel values 0..255 (uint8 or
        float), as a tensor or as a dict with key 'images' (the serving receiver).
    """
    images = features["images"] if isinstance(features, dict) else features
    images = tf.cast(images, tf.float32)
    with tf.compat.v1.variable_scope(NETWORK_SCOPE):
        _, probabilities = _inference(
            images, _network(cifar10_model.ModelConfig.from_hparams(hparams), "channels_last"),
            hparams, tf.float32)
    predictions = _predictions(probabilities)
    return tf.estimator.EstimatorSpec(
        mode=tf.estimator.ModeKeys.PREDICT,
        predictions=predictions,
        export_outputs={tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
                        tf.estimator.export.PredictOutput(predictions)},
        scaffold=_inference_scaffold(hparams))


def make_model_fn(layout, hparams, progress=None, starting_values=None):
    """An Estimator model_fn training `hparams` on the towers of `layout`.

    Args:
      layout: TowerLayout, the towers and variable placement.
      hparams: HParams.
      progress: the run's run.time_to_go.RunProgress, for training to log where it is
        and when it ends; None logs no progress.
      starting_values: {variable name: numpy array}, names as the checkpoints hold them
        (e.g. resnet/conv2d/kernel, see NETWORK_SCOPE): where a job's training starts
        those variables instead of at their initializers' draws (see
        starting_value_feeds). A job resumed from a checkpoint restores them instead.

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
        features, labels, staged = _staged_on_towers(features, labels, layout, hparams,
                                                     is_training)
        if is_training and precision_policy.loss_scaling:
            with tf.device(layout.consolidation_device):
                loss_scale = mixed_precision.DynamicLossScale()
        if is_training and hparams.skip_learned:
            with tf.device(layout.consolidation_device):
                skipping = example_skipping.LearnedExampleSkipping(
                    hparams.skip_learned, hparams.num_train_examples,
                    example_skipping.skipping_stop_step(hparams),
                    [phase.end_step for phase in training_compute(hparams).phases[:-1]])
                features, labels = chosen_examples(features, labels, skipping)
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
                    scaffold=_inference_scaffold(hparams))

            train_op, learning_rate, update_holders, optimizer_hooks = _training_update(
                tower_gradvars, update_ops, hparams, optimisation,
                config.is_chief if config else True, loss_scale)
            if staged is not None:
                train_op = tf.group(train_op, staged.put)
        # Summaries and the Saver are host work (strings, files), whatever the strategy.
        with tf.device("/cpu:0"):
            logged = _training_summaries(learning_rate, loss, stacked_labels,
                                         predictions["classes"], features[0], loss_scale)
            holders = [holder for holder in (loss_scale, skipping)
                       if holder is not None] + update_holders
            scaffold = _training_scaffold(config, holders, starting_values)

        return tf.estimator.EstimatorSpec(
            mode=mode, loss=loss, train_op=train_op, predictions=predictions,
            training_hooks=optimizer_hooks + _training_hooks(hparams, logged, progress, config)
            + ([staged.warm_up_hook()] if staged is not None else []),
            scaffold=scaffold)

    return model_fn


def _staged_on_towers(features, labels, layout, hparams, is_training):
    """(features, labels, staged): in training where `layout` prefetches, the shards
    staged on their towers' devices a step ahead and their device_prefetch.StagedShards;
    else the shards as they came and None.

    Not with --skip-learned: the examples a tower trains are chosen from the step's state
    on the consolidation device, which gathers them from the shards there.
    """
    if not (is_training and layout.prefetch_to_devices) or hparams.skip_learned:
        return features, labels, None
    staged = device_prefetch.stage_on_devices(features, labels, layout.devices)
    return staged.features, staged.labels, staged


def _training_update(tower_gradvars, update_ops, hparams, optimisation, is_chief,
                     loss_scale=None):
    """One step's update: the towers' averaged gradients applied at the schedule's rate
    by the optimizer of `optimisation` (an OptimisationConfig), and tower 0's batch-norm
    updates (build_towers' update_ops).

    Returns:
      (train_op, the learning rate tensor, the holders of the optional variables the
      update made (weight_averaging.WeightAverages, lookahead.SlowWeights), the
      optimizer's hooks, which must run on every worker).
    """
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = schedule.learning_rate_tensor(hparams, global_step)
    variables = tf.compat.v1.trainable_variables()
    weight_averages = slow_weights = kernel_momenta = None
    if optimisation.muon_learning_rate:
        # Muon's rate follows the schedule: R x the rate at the step / the base rate.
        kernel_momenta = muon.KernelMomenta(
            variables, optimisation.muon_momentum, learning_rate * (
                optimisation.muon_learning_rate / schedule.base_learning_rate(hparams)))
    if optimisation.moving_average_decay is not None:
        weight_averages = weight_averaging.WeightAverages(
            optimisation.moving_average_decay, variables, global_step)
    if optimisation.lookahead_steps:
        slow_weights = lookahead.SlowWeights(
            optimisation.lookahead_steps, optimisation.lookahead_alpha, variables,
            global_step, schedule.last_step(hparams))
    optimizer, hooks = _make_optimizer(learning_rate, optimisation, is_chief, loss_scale,
                                       weight_averages, slow_weights, kernel_momenta)
    apply_op = optimizer.apply_gradients(
        scale_shift_gradients(average_gradients(tower_gradvars),
                              optimisation.shift_learning_rate_factor),
        global_step=global_step)
    holders = [holder for holder in (weight_averages, slow_weights, kernel_momenta)
               if holder is not None]
    return tf.group(apply_op, *update_ops), learning_rate, holders, hooks


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


def _training_scaffold(config, holders, starting_values=None):
    """The training Scaffold, or None: a Saver that resumes checkpoints lacking the
    optional variables (those of `holders`: fp16's loss scale, the weights' averages,
    Lookahead's slow weights; and the stream's seeds), and the starting values of the
    variables (starting_value_feeds)."""
    optional_variables = [
        holder.optional_variables() for holder in holders] + _input_seeds_optional()
    feeds = starting_value_feeds(starting_values or {})
    if not optional_variables and not feeds:
        return None
    return tf.compat.v1.train.Scaffold(
        saver=_checkpoint_saver(config, optional_variables) if optional_variables else None,
        init_feed_dict=feeds or None)


def starting_value_feeds(starting_values):
    """{tensor: value} that make the graph's initializers start variables at
    `starting_values` ({variable name: numpy array}) instead of at their draws.

    The Scaffold's init op runs the initializers with these feeds only where a job
    starts: on the chief (the other workers wait for it), and never when a checkpoint is
    restored, so a resumed job keeps what it trained. The initial value is fed rather
    than assigned afterwards because the weights' moving averages start from it too.

    Raises:
      ValueError: no global variable of the graph has a name, or a value's shape is not
        its variable's.
    """
    variables = {variable.op.name: variable for variable in tf.compat.v1.global_variables()}
    feeds = {}
    for name, value in sorted(starting_values.items()):
        if name not in variables:
            raise ValueError("no variable %s to give a starting value" % name)
        variable = variables[name]
        if not variable.shape.is_compatible_with(np.shape(value)):
            raise ValueError("the starting value of %s has shape %s, the variable %s"
                             % (name, np.shape(value), variable.shape))
        feeds[variable.initial_value] = np.asarray(value, variable.dtype.base_dtype.as_numpy_dtype)
    return feeds


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


def _input_seeds_optional():
    """The training stream's seeds (input_fn.INPUT_SEEDS_NAME) as optional variables of
    the checkpoints, where the input_fn made them: a checkpoint written before they
    existed resumes with new ones."""
    seeds = [variable for variable in tf.compat.v1.global_variables()
             if variable.op.name == input_fn.INPUT_SEEDS_NAME]
    return [checkpoint_saver.OptionalVariables(
        var_list={input_fn.INPUT_SEEDS_NAME: variable},
        missing="no seeds of the training stream (an earlier version wrote it): the "
                "stream starts from new seeds") for variable in seeds]


def _checkpoint_saver(config, optional_variables):
    """The Saver tf.estimator would make, resuming checkpoints without `optional_variables`
    (checkpoint_saver.OptionalVariables: fp16's loss scale, the weights' moving averages).

    config: the Estimator's RunConfig, or None (then RunConfig's defaults).
    """
    config = config or tf.estimator.RunConfig()
    return checkpoint_saver.TolerantSaver(
        optional_variables, sharded=True, max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
        defer_build=True, save_relative_paths=True)
