"""Each GPU tower's shard is staged on its device a step ahead, the batches keep their
order (a resumed run still takes batch N at step N), and CPU towers are left as they were.

The staging is device-generic, so its order is tested on logical CPU devices; what a GPU
run builds is checked on its graph (device_bytes), which builds without a GPU.
"""

import shutil

import numpy as np
import pytest
import tensorflow as tf

import device_bytes
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn
from cifar10_estimator import model_fn
from cifar10_estimator.training import device_prefetch

TOWERS = ("/cpu:0", "/cpu:1")
# A step that waited on an empty staging area would block for ever: fail instead.
SESSION_CONFIG = tf.compat.v1.ConfigProto(device_count={"CPU": 2},
                                          operation_timeout_in_ms=60000)


def numbered_batches(first_batch):
    """An iterator's (image shards, label shards) of batches first_batch, first_batch + 1,
    ...: tower i's labels of batch n are [n, i], its images a dict holding n."""
    def shards(number):
        labels = tuple(tf.stack([number, tf.constant(tower, tf.int64)])
                       for tower in range(len(TOWERS)))
        images = tuple({"images": tf.fill([2, 3], tf.cast(number, tf.float32))}
                       for _ in TOWERS)
        return images, labels
    dataset = tf.data.Dataset.range(first_batch, first_batch + 100).map(shards)
    return tf.compat.v1.data.make_initializable_iterator(dataset)


def staged_batch_numbers(first_batch, num_steps):
    """The batches `num_steps` steps of a session take from the staging areas, when its
    iterator starts at first_batch, as [(labels of each tower, images' number)]."""
    with tf.Graph().as_default():
        iterator = numbered_batches(first_batch)
        features, labels = iterator.get_next()
        staged = device_prefetch.stage_on_devices(features, labels, TOWERS)
        assert [shard.device for shard in staged.labels] == [
            tf.DeviceSpec.from_string(device).to_string() for device in TOWERS]
        step = [staged.labels, [shard["images"][0, 0] for shard in staged.features],
                staged.put]
        with tf.compat.v1.Session(config=SESSION_CONFIG) as session:
            session.run(iterator.initializer)
            staged.warm_up_hook().after_create_session(session, None)
            return [([list(tower) for tower in labels_taken], numbers[0])
                    for labels_taken, numbers, _ in (session.run(step)
                                                     for _ in range(num_steps))]


def test_each_step_takes_the_batch_the_input_served_next_on_each_towers_device():
    assert staged_batch_numbers(0, 4) == [
        ([[number, 0], [number, 1]], float(number)) for number in range(4)]
    # A session whose iterator starts at batch 7 (a run resumed at step 7) takes batch 7.
    assert staged_batch_numbers(7, 2) == [
        ([[number, 0], [number, 1]], float(number)) for number in (7, 8)]


def test_the_warm_up_empties_what_a_previous_session_left_staged():
    with tf.Graph().as_default():
        iterator = numbered_batches(0)
        features, labels = iterator.get_next()
        staged = device_prefetch.stage_on_devices(features, labels, TOWERS)
        with tf.compat.v1.Session(config=SESSION_CONFIG) as session:
            session.run(iterator.initializer)
            session.run([features, labels])
            # Batch 1 left staged, as by a session on the same devices that stopped.
            session.run(staged.put)
            session.run(iterator.initializer)
            staged.warm_up_hook().after_create_session(session, None)
            assert [list(tower) for tower in session.run(staged.labels)] == [[0, 0], [0, 1]]


def train_two_cpu_towers(tiny_data_dir, job_dir, max_steps, prefetch_to_devices):
    """Train ResNet-8 with batch 4 on two CPU towers to max_steps (resuming job_dir's
    checkpoint); returns {variable name: value} of the final checkpoint."""
    layout = model_fn.TowerLayout(devices=TOWERS, data_format="channels_last",
                                  prefetch_to_devices=prefetch_to_devices)
    config = tf.estimator.RunConfig(model_dir=str(job_dir), tf_random_seed=5,
                                    save_checkpoints_steps=1, session_config=SESSION_CONFIG)
    estimator = tf.estimator.Estimator(model_fn.make_model_fn(
        layout, job_hparams.HParams(num_layers=8, train_batch_size=4)), config=config)
    estimator.train(input_fn.make_training_input_fn(str(tiny_data_dir), 2, 4, True),
                    max_steps=max_steps)
    checkpoint = tf.train.latest_checkpoint(str(job_dir))
    return {name: tf.train.load_variable(checkpoint, name)
            for name, _ in tf.train.list_variables(checkpoint)}


@pytest.mark.slow
def test_a_staged_run_resumed_midway_trains_what_an_unstaged_run_trains(
        tiny_data_dir, tmp_path):
    # Both start from the checkpoint of step 1: with a graph seed, each op's seed is its
    # number in the graph, so the staging ops would start the weights elsewhere.
    train_two_cpu_towers(tiny_data_dir, tmp_path / "unstaged", 1, False)
    shutil.copytree(str(tmp_path / "unstaged"), str(tmp_path / "staged"))
    unstaged = train_two_cpu_towers(tiny_data_dir, tmp_path / "unstaged", 4, False)
    train_two_cpu_towers(tiny_data_dir, tmp_path / "staged", 2, True)
    staged = train_two_cpu_towers(tiny_data_dir, tmp_path / "staged", 4, True)
    assert "device_prefetch" in (tmp_path / "staged" / "graph.pbtxt").read_text()
    assert staged["global_step"] == unstaged["global_step"] == 4
    assert sorted(staged) == sorted(unstaged)
    for name, value in unstaged.items():
        np.testing.assert_array_equal(staged[name], value, err_msg=name)


def stage_ops(graph):
    return [op for op in graph.get_operations() if op.type in ("Stage", "Unstage")]


def test_gpu_towers_take_their_shards_from_their_devices_where_the_shards_cross(
        tiny_data_dir, tmp_path):
    layout = model_fn.TowerLayout.for_devices(2)
    graph, spec, _ = device_bytes.training_step(
        str(tiny_data_dir), layout, ["--num-layers", "8", "--train-batch-size", "4"],
        tmp_path / "job")
    crossings = device_bytes.step_crossings(graph, spec, layout)
    iterator_outputs = [crossing for crossing in crossings
                        if crossing.tensor.startswith("IteratorGetNext")]
    # Each tower's 2 images and 2 labels cross into the Stage op on its device, nowhere else.
    assert sorted((crossing.destination, crossing.consumers, crossing.num_bytes)
                  for crossing in iterator_outputs) == [
        (device, ("Stage",), num_bytes) for device in ("/gpu:0", "/gpu:1")
        for num_bytes in (2 * 4, 2 * 32 * 32 * 3 * 4)]
    unstaged = [op for op in stage_ops(graph) if op.type == "Unstage"]
    assert sorted(op.device for op in unstaged) == ["/device:GPU:0", "/device:GPU:1"]
    assert any(isinstance(hook, device_prefetch.PrefetchWarmUpHook)
               for hook in spec.training_hooks)


def test_cpu_towers_are_fed_as_before(tiny_data_dir, tmp_path):
    layout = model_fn.TowerLayout.for_devices(0, num_cpu_towers=2)
    assert not layout.prefetch_to_devices
    graph, spec, _ = device_bytes.training_step(
        str(tiny_data_dir), layout, ["--num-layers", "8", "--train-batch-size", "4"],
        tmp_path / "job")
    assert stage_ops(graph) == []
    assert not any(isinstance(hook, device_prefetch.PrefetchWarmUpHook)
                   for hook in spec.training_hooks)
