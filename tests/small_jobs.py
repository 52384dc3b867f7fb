"""Small jobs trained in process: ResNet-8 on synthetic batches through the Estimator, and
what their checkpoints hold. For the tests of optional training variables (Lookahead's
slow weights, Muon's momenta, the weights' averages) and their continuations."""

import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn, model_fn

BATCH_SIZE = 4


def train(job_dir, max_steps, **fields):
    """Train ResNet-8 with the HParams `fields` in job_dir up to global step max_steps."""
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=BATCH_SIZE, **fields)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=1)
    estimator = tf.estimator.Estimator(model_fn.make_model_fn(layout, hparams),
                                       config=tf.estimator.RunConfig(model_dir=str(job_dir)))
    estimator.train(input_fn.make_synthetic_input_fn(1, BATCH_SIZE), max_steps=max_steps)


def checkpoint_values(checkpoint):
    """{name: value} of a checkpoint's variables (or an export's: EXPORT/variables/variables)."""
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
