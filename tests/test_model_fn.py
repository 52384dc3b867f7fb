"""The multi-tower machinery: shards, towers on logical CPU devices, gradient averaging, LR."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import input_fn, model_fn


def linear_tower_fn(images, labels, is_training):
    """A softmax regression: no batch-dependent layer, so shard means average exactly."""
    flat = tf.reshape(images, [-1, 32 * 32 * 3]) / 255.0
    weights = tf.compat.v1.get_variable(
        "weights", [32 * 32 * 3, 10], initializer=tf.compat.v1.random_normal_initializer(seed=3))
    bias = tf.compat.v1.get_variable("bias", [10], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(flat, weights) + bias
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
        labels=labels, logits=logits, loss_collection=None)
    return loss, logits


def averaged_gradients(images, labels, num_towers):
    """Gradients of the full batch through `num_towers` towers, evaluated in a session."""
    graph = tf.Graph()
    with graph.as_default():
        layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
        image_shards, label_shards = input_fn.split_batch_into_towers(
            tf.constant(images), tf.constant(labels), num_towers)
        _, tower_gradvars, _, _ = model_fn.build_towers(
            image_shards, label_shards, layout, linear_tower_fn, is_training=True)
        gradvars = model_fn.average_gradients(tower_gradvars)
        config = tf.compat.v1.ConfigProto(device_count={"CPU": num_towers})
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = session.run([g for g, _ in gradvars])
        names = [v.op.name for _, v in gradvars]
        devices = {op.name: op.device for op in graph.get_operations()}
    return dict(zip(names, values)), devices


def test_k_towers_average_to_the_one_tower_full_batch_gradient():
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, size=(12, 32, 32, 3)).astype(np.float32)
    labels = rng.randint(0, 10, size=12).astype(np.int32)

    one_tower, _ = averaged_gradients(images, labels, 1)
    for num_towers in (2, 3):
        towers, devices = averaged_gradients(images, labels, num_towers)
        assert sorted(towers) == sorted(one_tower) == ["resnet/bias", "resnet/weights"]
        for name in one_tower:
            np.testing.assert_allclose(towers[name], one_tower[name], rtol=1e-4, atol=1e-6)
        assert np.abs(one_tower["resnet/weights"]).max() > 0
        tower_matmuls = {name: device for name, device in devices.items()
                         if name.endswith("/MatMul") and "gradients" not in name}
        assert len(tower_matmuls) == num_towers
        for index in range(num_towers):
            (device,) = [d for n, d in tower_matmuls.items() if "tower_%d/" % index in n]
            assert device.lower().endswith("cpu:%d" % index), (index, device)
        assert devices["resnet/weights"].lower().endswith("cpu:0")


def test_average_gradients_rejects_towers_with_other_variables():
    with tf.Graph().as_default():
        first = tf.Variable(1.0)
        second = tf.Variable(2.0)
        with pytest.raises(ValueError, match="variable order"):
            model_fn.average_gradients([[(tf.constant(1.0), first)], [(tf.constant(1.0), second)]])


def learning_rates_at(steps, base, num_train_examples, global_batch_size):
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = model_fn.learning_rate_schedule(step, base, num_train_examples, global_batch_size)
        with tf.compat.v1.Session() as session:
            return [session.run(rate, {step: s}) for s in steps]


def test_learning_rate_drops_at_epochs_82_123_300_of_the_global_batch():
    # 1000 examples, 2 workers x 10 = 20 per global step: 50 steps per epoch.
    steps = [0, 4100, 4101, 6150, 6151, 15000, 15001, 10 ** 7]
    rates = learning_rates_at(steps, 0.1, 1000, 20)
    np.testing.assert_allclose(rates, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.0002, 0.0002],
                               rtol=1e-6)


def test_learning_rate_epochs_count_the_real_number_of_examples():
    # The full data set: 40000 / 128 = 312 whole steps per epoch.
    rates = learning_rates_at([82 * 312, 82 * 312 + 1], 0.1, 40000, 128)
    np.testing.assert_allclose(rates, [0.1, 0.01], rtol=1e-6)


def test_tower_layout_devices():
    assert model_fn.TowerLayout.for_devices(2, 5).devices == ("/gpu:0", "/gpu:1")
    cpu = model_fn.TowerLayout.for_devices(0, 3)
    assert cpu.devices == ("/cpu:0", "/cpu:1", "/cpu:2")
    assert cpu.consolidation_device == "/cpu:0"
    assert model_fn.TowerLayout.for_devices(2, 1, "GPU").consolidation_device == "/gpu:0"


def test_split_batch_into_towers_keeps_order():
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        images = tf.reshape(tf.range(6 * 2, dtype=tf.float32), [6, 2])
        labels = tf.range(6)
        image_shards, label_shards = session.run(
            input_fn.split_batch_into_towers(images, labels, 3))
    assert [list(s) for s in label_shards] == [[0, 1], [2, 3], [4, 5]]
    np.testing.assert_array_equal(np.concatenate(image_shards), np.arange(12).reshape(6, 2))
