"""The training job's hyper-parameters: their defaults, and job-dir/hparams.json.

Each default is written once, here; the trainer's flags take theirs from `DEFAULTS`.
Training writes the values it used to job-dir/hparams.json so that a checkpoint can be
rebuilt later (the evaluate command reads it).
"""

import dataclasses
import json
import os
import typing
import uuid

from cifar10_estimator.errors import Cifar10EstimatorError

HPARAMS_FILENAME = "hparams.json"
HPARAMS_FORMAT = "cifar10_estimator.hparams/1"

# With --train-epochs the drops are placed in proportion to the run, as fractions of
# its steps. "paper": He et al. 2016 divide by 10 at 32k and 48k of 64k iterations;
# "tutorial": where the tutorial's drops fall in its 256 epochs (82/256, 123/256).
PROPORTIONAL_SCHEDULES = {
    "paper": ((0.5, 0.75), (1.0, 0.1, 0.01)),
    "tutorial": ((82 / 256, 123 / 256), (1.0, 0.1, 0.01)),
}
# --learning-rate-scaling: whether model_fn.effective_learning_rate scales the base rate
# to the global batch; the reference is the batch the tutorial's and the paper's 0.1 is for.
LEARNING_RATE_SCALINGS = ("none", "linear")
LEARNING_RATE_REFERENCE_BATCH_SIZE = 128
# --precision: what the towers compute in while training (see precision.py).
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class HParams:
    """Hyper-parameters of the model and its optimisation (the tutorial's defaults).

    train_batch_size is the batch of one worker over all its towers; the
    learning-rate schedule counts epochs in examples_per_global_step.
    """

    num_layers: int = 44
    weight_decay: float = 2e-4
    momentum: float = 0.9
    learning_rate: float = 0.1
    batch_norm_decay: float = 0.997
    batch_norm_epsilon: float = 1e-5
    train_batch_size: int = 128
    num_train_examples: int = 40000
    num_workers: int = 1
    data_format: str = "channels_last"
    sync: bool = False
    # None: the tutorial's schedule in epochs; E: a run of E epochs whose learning-rate
    # drops sit in proportion to it, as learning_rate_drops (a key of
    # PROPORTIONAL_SCHEDULES) says.
    train_epochs: typing.Optional[float] = None
    learning_rate_drops: str = "paper"
    # One of LEARNING_RATE_SCALINGS, applied by model_fn.effective_learning_rate.
    learning_rate_scaling: str = "none"
    # One of PRECISIONS; fp32 is the original's. Evaluation and exports are float32.
    precision: str = "fp32"

    @property
    def examples_per_global_step(self):
        """Examples behind one global step: the global batch of every worker with --sync.

        Without --sync each worker's update is a global step of its own batch (the
        original counted batch x workers here too, so its rate fell W times too soon
        in epochs of data with W asynchronous workers).
        """
        return self.train_batch_size * (self.num_workers if self.sync else 1)

    @classmethod
    def from_flags(cls, flags, **derived):
        """HParams from parsed flags named like the fields, plus values derived elsewhere.

        Args:
          flags: an argparse.Namespace; its attributes named like a field fill that field.
          **derived: the fields that are not flags (e.g. num_train_examples).
        """
        values = {field.name: getattr(flags, field.name)
                  for field in dataclasses.fields(cls) if hasattr(flags, field.name)}
        values.update(derived)
        return cls(**values)


DEFAULTS = HParams()


def save(job_dir, hparams):
    """Write `hparams` to job-dir/hparams.json, replacing any older file."""
    import tensorflow as tf  # here: the trainer parses its flags before TensorFlow loads
    tf.io.gfile.makedirs(job_dir)
    path = os.path.join(job_dir, HPARAMS_FILENAME)
    # A unique temporary: a restarted chief may write while its old self still does.
    temporary = "%s.tmp-%s" % (path, uuid.uuid4().hex)
    with tf.io.gfile.GFile(temporary, "w") as stream:
        json.dump({"format": HPARAMS_FORMAT, "hparams": dataclasses.asdict(hparams)},
                  stream, indent=2, sort_keys=True)
        stream.write("\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


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
