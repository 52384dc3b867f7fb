"""The training job's hyper-parameters: their defaults, and job-dir/hparams.json.

Each default is written once, here; the trainer's flags take theirs from `DEFAULTS`.
Training writes the values it used to job-dir/hparams.json so that a checkpoint can be
rebuilt later (the evaluate command reads it).
"""

import dataclasses
import json
import os
import typing

from cifar10_estimator import json_file
from cifar10_estimator.errors import Cifar10EstimatorError

HPARAMS_FILENAME = "hparams.json"
HPARAMS_FORMAT = "cifar10_estimator.hparams/1"

# Which trainable variables weight decay pulls towards 0. all: every one, as the tutorial
# (convolution and dense kernels, the dense bias, batch norm's gamma and beta); kernels:
# the convolution and dense kernels only, leaving the scale and shift parameters free.
WEIGHT_DECAY_SCOPES = ("all", "kernels")


@dataclasses.dataclass(frozen=True)
class HParams:
    """Hyper-parameters of the model and its optimisation (the tutorial's defaults).

    train_batch_size is the batch of one worker over all its towers; the
    learning-rate schedule counts epochs in examples_per_global_step.
    """

    # The --recipe the other values started from (training.recipes), before explicit flags.
    recipe: str = "tutorial"
    num_layers: int = 44
    # Factor of the sum of tf.nn.l2_loss (half the squared norm) of the decayed variables
    # added to the loss, so its gradient adds weight_decay * w: the same convention as
    # the paper's weight decay (He et al. 2016: 1e-4), which the tutorial doubled.
    weight_decay: float = 2e-4
    # One of WEIGHT_DECAY_SCOPES.
    weight_decay_scope: str = "all"
    momentum: float = 0.9
    learning_rate: float = 0.1
    batch_norm_decay: float = 0.997
    batch_norm_epsilon: float = 1e-5
    train_batch_size: int = 128
    num_train_examples: int = 40000
    num_workers: int = 1
    data_format: str = "channels_last"
    sync: bool = False
    # The run's length (see schedule.last_step): train_steps global steps, or
    # train_epochs epochs; neither: the tutorial's 80000 steps. learning_rate_drops (a
    # key of schedule.PROPORTIONAL_DROPS) places the drops in proportion to the run;
    # None: "paper" with train_epochs, else the tutorial's drops at epochs 82, 123, 300.
    train_steps: typing.Optional[int] = None
    train_epochs: typing.Optional[float] = None
    learning_rate_drops: typing.Optional[str] = None
    # One of schedule.LEARNING_RATE_SCALINGS.
    learning_rate_scaling: str = "none"
    # One of schedule.SHAPES, after a linear warm-up of warmup_epochs (0: none).
    learning_rate_schedule: str = "piecewise"
    warmup_epochs: float = 0.0
    # Nesterov momentum instead of the original's plain momentum.
    nesterov: bool = False
    # Training targets: 1 - label_smoothing on the label, the rest spread evenly over
    # CIFAR-10's 10 classes (never the 11th logit). Evaluation loss stays plain.
    label_smoothing: float = 0.0
    # One of precision.PRECISIONS; fp32 is the original's. Evaluation and exports are float32.
    precision: str = "fp32"
    # Decay D in (0, 1) of the exponential moving average of the trainable weights that
    # evaluation, prediction and exports use (see weight_averaging); None: the trained
    # weights, as the original.
    moving_average_decay: typing.Optional[float] = None
    # Evaluation, prediction and exports average the class probabilities of each image
    # and its left-right mirror (twice the inference work); training is unaffected.
    eval_flips: bool = False
    # Evaluation, prediction and exports also average over the images shifted by this
    # many pixels right, left, down and up (0: none); with eval_flips, their mirrors too.
    eval_shifts: int = 0
    # The scale of each residual unit's last batch norm starts at 0 (Goyal et al. 2017).
    zero_init_residual: bool = False
    # Batch norm's shift (beta) variables learn at this multiple of the learning rate.
    shift_learning_rate_factor: float = 1.0
    # Graph-level random seed of the run (weights' initial values, the training data's
    # order and augmentation), None: a new draw every run, as the original.
    seed: typing.Optional[int] = None

    # Fields no flag sets: the trainer derives them from the data, the devices and the
    # cluster (from_flags insists on exactly these).
    DERIVED_FIELDS: typing.ClassVar[tuple] = ("num_train_examples", "num_workers",
                                              "data_format")

    @property
    def examples_per_global_step(self):
        """Examples behind one global step: the global batch of every worker with --sync.

        Without --sync each worker's update is a global step of its own batch (the
        original counted batch x workers here too, so its rate fell W times too soon
        in epochs of data with W asynchronous workers).
        """
        return self.train_batch_size * (self.num_workers if self.sync else 1)

    @classmethod
    def from_flags(cls, flag_values, **derived):
        """HParams from the trainer's hyper-parameter flags and the fields derived elsewhere.

        Every field must come from exactly one of the two, so a flag renamed without its
        field (which would silently train on the default) fails here.

        Args:
          flag_values: dict flag destination -> value, of the flags that are fields.
          **derived: exactly the DERIVED_FIELDS.

        Raises:
          ValueError: a flag names no field, a field is set by no flag, or derived is
            not DERIVED_FIELDS.
        """
        fields = {field.name for field in dataclasses.fields(cls)}
        problems = []
        if set(derived) != set(cls.DERIVED_FIELDS):
            problems.append("derived %s, expected %s" % (sorted(derived),
                                                         sorted(cls.DERIVED_FIELDS)))
        without_field = sorted(set(flag_values) - fields)
        if without_field:
            problems.append("flags with no HParams field: %s" % ", ".join(without_field))
        without_flag = sorted(fields - set(flag_values) - set(cls.DERIVED_FIELDS))
        if without_flag:
            problems.append("HParams fields no flag sets: %s" % ", ".join(without_flag))
        if problems:
            raise ValueError("; ".join(problems))
        return cls(**dict(flag_values, **derived))


DEFAULTS = HParams()


def save(job_dir, hparams):
    """Write `hparams` to job-dir/hparams.json, replacing any older file."""
    import tensorflow as tf  # here: the trainer parses its flags before TensorFlow loads
    tf.io.gfile.makedirs(job_dir)
    json_file.write_atomically(
        os.path.join(job_dir, HPARAMS_FILENAME),
        {"format": HPARAMS_FORMAT, "hparams": dataclasses.asdict(hparams)})


def load(job_dir):
    """The HParams that training saved in job-dir/hparams.json.

    Raises:
      Cifar10EstimatorError: the file is missing or not ours.
    """
    import tensorflow as tf
    if not tf.io.gfile.isdir(job_dir):
        raise Cifar10EstimatorError("job directory %s does not exist" % job_dir)
    path = os.path.join(job_dir, HPARAMS_FILENAME)
    if not tf.io.gfile.exists(path):
        raise Cifar10EstimatorError(
            "%s is missing: it is written when training starts; pass the --job-dir that "
            "python -m cifar10_estimator.main trained in" % path)
    known = {field.name for field in dataclasses.fields(HParams)}
    try:
        with tf.io.gfile.GFile(path) as stream:
            content = json.load(stream)
        if content["format"] != HPARAMS_FORMAT:
            raise ValueError("format %r, expected %r" % (content["format"], HPARAMS_FORMAT))
        values = content["hparams"]
        return HParams(**{name: values[name] for name in known if name in values})
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            tf.errors.OpError) as error:
        raise Cifar10EstimatorError("cannot read %s (%s)" % (path, error))
