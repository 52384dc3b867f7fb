"""--moving-average-decay: shadows of the weights next to them, their ramped decay, and the
averaged weights in evaluation and exports, across continuations with the flag on and off."""

import os

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn, model_fn
from cifar10_estimator.training import weight_averaging
from cifar10_estimator.serving import export

from small_jobs import checkpoint_values

DECAY = 0.9
BATCH_SIZE = 4
SHADOW_SUFFIX = "/ExponentialMovingAverage"


def train_graph(layout, decay):
    """The TRAIN spec of ResNet-8 with --moving-average-decay `decay` on `layout`'s towers."""
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=BATCH_SIZE,
                                  moving_average_decay=decay)
    images = tf.random.uniform([BATCH_SIZE, 32, 32, 3], maxval=255.0, seed=1)
    labels = tf.random.uniform([BATCH_SIZE], maxval=10, dtype=tf.int32, seed=2)
    image_shards, label_shards = input_fn.split_batch_into_towers(
        images, labels, layout.num_towers)
    return model_fn.make_model_fn(layout, hparams)(
        image_shards, label_shards, tf.estimator.ModeKeys.TRAIN, None)


@pytest.mark.parametrize("num_gpus, variable_strategy", [(0, "CPU"), (2, "GPU")])
def test_every_trainable_variable_has_a_shadow_on_its_own_device(num_gpus, variable_strategy):
    # Only device strings are built here, so no GPU is needed.
    layout = model_fn.TowerLayout.for_devices(num_gpus, 2, variable_strategy)
    with tf.Graph().as_default() as graph:
        train_graph(layout, DECAY)
        variables = {v.op.name: v for v in graph.get_collection(
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    shadows = {name for name in variables if name.endswith(SHADOW_SUFFIX)}
    assert shadows == {v.op.name + SHADOW_SUFFIX for v in trainable}
    for variable in trainable:
        shadow = variables[variable.op.name + SHADOW_SUFFIX]
        assert shadow.device == variable.device, variable.op.name
        assert not shadow.trainable
    if variable_strategy == "GPU":
        assert {variables[name].device for name in shadows} == {
            "/device:GPU:0", "/device:GPU:1"}
    # Batch-norm statistics are moving averages already: they get no shadow.
    assert not [name for name in shadows if "moving_" in name]


@pytest.mark.parametrize("decay", [0.999, 0.2])
def test_the_decay_ramps_up_with_the_global_step(decay):
    """After the update reaching global step n, shadow -= (1 - d) (shadow - weight) with
    d = min(D, (1 + n) / (10 + n)): 0.18, 0.25, 0.31 at steps 1 to 3, so D = 0.999 is not
    yet reached while D = 0.2 is from step 2 on."""
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=2)
    with tf.Graph().as_default() as graph:
        spec = train_graph(layout, decay)
        variables = {v.op.name: v for v in graph.get_collection(
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        weight = variables["resnet/dense/kernel"]
        shadow = variables["resnet/dense/kernel" + SHADOW_SUFFIX]
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            initial = session.run(weight)
            np.testing.assert_array_equal(session.run(shadow), initial)  # starts at the weight
            expected = initial.copy()
            for step in (1, 2, 3):
                session.run(spec.train_op)
                ramped = min(decay, (1.0 + step) / (10.0 + step))
                expected -= (1 - ramped) * (expected - session.run(weight))
                np.testing.assert_allclose(session.run(shadow), expected, rtol=0, atol=1e-7)
            assert np.abs(session.run(weight) - initial).max() > 1e-3  # the weights moved


def make_estimator(job_dir, num_towers=1, **fields):
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=BATCH_SIZE, **fields)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
    config = tf.estimator.RunConfig(
        model_dir=str(job_dir),
        session_config=tf.compat.v1.ConfigProto(device_count={"CPU": num_towers}))
    return tf.estimator.Estimator(model_fn.make_model_fn(layout, hparams), config=config)


def train(job_dir, max_steps, num_towers=1, **fields):
    make_estimator(job_dir, num_towers, **fields).train(
        input_fn.make_synthetic_input_fn(num_towers, BATCH_SIZE), max_steps=max_steps)


def evaluate(job_dir, **fields):
    return make_estimator(job_dir, **fields).evaluate(
        input_fn.make_synthetic_input_fn(1, BATCH_SIZE, seed=5), steps=1)


def export_latest(job_dir, export_base, **fields):
    """Export the latest checkpoint of job_dir as a model of `fields` would; its path."""
    return make_estimator(job_dir, **fields).export_saved_model(
        str(export_base), export.serving_input_receiver_fn).decode()


def export_values(export_dir):
    return checkpoint_values(os.path.join(export_dir, "variables", "variables"))


def serve(export_dir, images):
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    return signature(images=tf.constant(images))["probabilities"].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("num_towers", [1, 2])
def test_checkpoints_keep_the_averages_and_evaluation_and_exports_use_them(tmp_path,
                                                                          num_towers):
    job_dir = tmp_path / "job"
    train(job_dir, 3, num_towers, moving_average_decay=DECAY)

    saved = checkpoint_values(tf.train.latest_checkpoint(str(job_dir)))
    shadows = {name[:-len(SHADOW_SUFFIX)]: value for name, value in saved.items()
               if name.endswith(SHADOW_SUFFIX)}
    assert len(shadows) > 10
    for name, value in shadows.items():
        assert value.shape == saved[name].shape
    assert max(np.abs(value - saved[name]).max() for name, value in shadows.items()) > 1e-4

    averaged_export = export_latest(job_dir, tmp_path / "averaged", moving_average_decay=DECAY)
    trained_export = export_latest(job_dir, tmp_path / "trained")
    averaged, trained = export_values(averaged_export), export_values(trained_export)
    # The averaged export holds each shadow under its weight's own name; batch-norm
    # statistics and the global step are the checkpoint's own in both.
    assert set(averaged) == set(trained) == {
        name for name in saved if not name.endswith((SHADOW_SUFFIX, "/Momentum"))}
    for name in averaged:
        np.testing.assert_array_equal(averaged[name], shadows.get(name, saved[name]), name)
        np.testing.assert_array_equal(trained[name], saved[name], name)

    images = np.random.RandomState(3).randint(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    assert np.abs(serve(averaged_export, images) - serve(trained_export, images)).max() > 1e-4
    assert evaluate(job_dir, moving_average_decay=DECAY)["loss"] != pytest.approx(
        evaluate(job_dir)["loss"], rel=1e-4)


@pytest.mark.slow
def test_a_job_continues_with_the_flag_switched_off_then_on(tmp_path, tensorflow_info_messages):
    job_dir = tmp_path / "job"
    name = "resnet/dense/kernel"
    train(job_dir, 2, moving_average_decay=DECAY)

    # Off: training restores the weights and its checkpoints hold no averages.
    train(job_dir, 3)
    at_3 = checkpoint_values(str(job_dir / "model.ckpt-3"))
    assert not [key for key in at_3 if key.endswith(SHADOW_SUFFIX)]
    assert weight_averaging.evaluated_weights(DECAY, str(job_dir / "model.ckpt-3")) == "trained"

    # On, before a checkpoint with averages exists: evaluation takes the trained weights
    # and says so.
    assert evaluate(job_dir, moving_average_decay=DECAY)["loss"] == evaluate(job_dir)["loss"]
    assert any(message.endswith("model.ckpt-3 holds no moving averages of the weights "
                                "(trained without --moving-average-decay): evaluating its "
                                "trained weights") for message in tensorflow_info_messages)

    # On, training: each average starts at its weight's restored value.
    train(job_dir, 4, moving_average_decay=DECAY)
    assert any("model.ckpt-3 holds no moving averages" in message
               and message.endswith("each average starts at its weight's restored value")
               for message in tensorflow_info_messages)
    at_4 = checkpoint_values(str(job_dir / "model.ckpt-4"))
    ramped = min(DECAY, 5.0 / 14.0)
    np.testing.assert_allclose(
        at_4[name + SHADOW_SUFFIX], at_3[name] - (1 - ramped) * (at_3[name] - at_4[name]),
        rtol=0, atol=1e-7)
    assert weight_averaging.evaluated_weights(DECAY, str(job_dir / "model.ckpt-4")) == (
        "moving average, decay 0.9")
