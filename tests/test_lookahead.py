"""--lookahead-steps: slow copies of the weights, their synchronisation every K steps and
at the last, and continuations from checkpoints with and without them."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn, model_fn
from cifar10_estimator.training import lookahead

from small_jobs import BATCH_SIZE, checkpoint_values, train

SLOW_SUFFIX = "/" + lookahead.SLOW_NAME


def test_the_slow_weights_move_alpha_of_the_way_every_k_steps_and_at_the_last():
    """A weight that each update raises by 1, K = 2, alpha = 0.5, last step 5: the slow
    copy moves half way at steps 2, 4 and 5, and the weight restarts from it."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weight = tf.compat.v1.Variable([0.0, 10.0], name="weight")
        slow_weights = lookahead.SlowWeights(2, 0.5, [weight], global_step, last_step=5)
        with tf.control_dependencies([weight.assign_add([1.0, 1.0])]):
            update = global_step.assign_add(1)
        step_op = slow_weights.update_after(update)
        slow = slow_weights.optional_variables().var_list["weight" + SLOW_SUFFIX]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(session.run(slow), [0.0, 10.0])
            seen = []
            for _ in range(5):
                session.run(step_op)
                seen.append((session.run(weight)[0], session.run(slow)[0]))
    # step 1: 1, slow 0; step 2: 2 -> slow 1, weight 1; step 3: 2; step 4: 3 -> slow 2,
    # weight 2; step 5 (the last): 3 -> slow 2.5, weight 2.5.
    assert seen == [(1.0, 0.0), (1.0, 1.0), (2.0, 1.0), (2.0, 2.0), (2.5, 2.5)]


@pytest.mark.parametrize("num_gpus, variable_strategy", [(0, "CPU"), (2, "GPU")])
def test_every_trainable_variable_has_a_slow_copy_on_its_own_device(num_gpus, variable_strategy):
    # Only device strings are built here, so no GPU is needed.
    layout = model_fn.TowerLayout.for_devices(num_gpus, 2, variable_strategy)
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=BATCH_SIZE,
                                  lookahead_steps=5, moving_average_decay=0.9)
    with tf.Graph().as_default() as graph:
        images = tf.zeros([BATCH_SIZE, 32, 32, 3])
        labels = tf.zeros([BATCH_SIZE], tf.int32)
        model_fn.make_model_fn(layout, hparams)(
            *input_fn.split_batch_into_towers(images, labels, layout.num_towers),
            tf.estimator.ModeKeys.TRAIN, None)
        variables = {v.op.name: v for v in graph.get_collection(
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    slow = {name for name in variables if name.endswith(SLOW_SUFFIX)}
    assert slow == {v.op.name + SLOW_SUFFIX for v in trainable}
    for variable in trainable:
        copy = variables[variable.op.name + SLOW_SUFFIX]
        assert copy.device == variable.device, variable.op.name
        assert not copy.trainable
        # The moving averages are of the weights, not of their slow copies.
        assert variable.op.name + "/ExponentialMovingAverage" in variables
        assert copy.op.name + "/ExponentialMovingAverage" not in variables


@pytest.mark.slow
def test_a_job_ends_on_its_slow_weights_and_continues_from_a_checkpoint_without_them(
        tmp_path, tensorflow_info_messages):
    job_dir = tmp_path / "job"
    train(job_dir, 2)
    at_2 = checkpoint_values(str(job_dir / "model.ckpt-2"))
    assert not [name for name in at_2 if name.endswith(SLOW_SUFFIX)]

    # With the flag the slow copies start at the restored weights; K = 2 synchronises
    # at step 4, and the run's last step, 5, too.
    train(job_dir, 5, lookahead_steps=2, train_steps=5)
    assert any("model.ckpt-2 holds no Lookahead slow weights" in message
               and message.endswith("each starts at its weight's restored value")
               for message in tensorflow_info_messages)
    at_5 = checkpoint_values(str(job_dir / "model.ckpt-5"))
    slow = {name[:-len(SLOW_SUFFIX)]: value for name, value in at_5.items()
            if name.endswith(SLOW_SUFFIX)}
    assert len(slow) > 10
    for name, value in slow.items():
        np.testing.assert_array_equal(value, at_5[name], name)
    # They moved: half way from the restored weights at step 4, and again at step 5.
    assert max(np.abs(value - at_2[name]).max() for name, value in slow.items()) > 1e-4
