"""The multi-tower machinery: shards, towers on logical CPU devices, gradient averaging,
and towers inside the workers of a --sync cluster."""

import dataclasses
import random
import threading
import types

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import cifar10, cifar10_model, input_fn, model_fn
from cifar10_estimator.settings import precision, schedule
from cifar10_estimator.training import area_resize, losses
from cifar10_estimator.distributed import local_cluster


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


LAYER_CONFIGS = [cifar10_model.ModelConfig, cifar10.AugmentationConfig,
                 model_fn.OptimisationConfig]


@pytest.mark.parametrize("config_class", LAYER_CONFIGS)
def test_a_layers_config_is_hyper_parameters_of_their_names_and_defaults(config_class):
    hyper_parameters = {field.name: field for field in dataclasses.fields(job_hparams.HParams)}
    fields = dataclasses.fields(config_class)
    assert fields and {field.name for field in fields} <= set(hyper_parameters)
    assert config_class() == config_class.from_hparams(job_hparams.DEFAULTS)
    changed = job_hparams.HParams(num_layers=20, zero_init_residual=True, train_max_shift=2,
                                  alternating_flips=True, momentum=0.8, sync=True,
                                  num_workers=3, moving_average_decay=0.99)
    config = config_class.from_hparams(changed)
    assert {field.name: getattr(config, field.name) for field in fields} == {
        field.name: getattr(changed, field.name) for field in fields}
    assert config != config_class()


def test_each_hyper_parameter_goes_to_one_layers_config_at_most():
    names = [field.name for config_class in LAYER_CONFIGS
             for field in dataclasses.fields(config_class)]
    assert len(names) == len(set(names))


def test_tower_layout_devices():
    assert model_fn.TowerLayout.for_devices(2, 5).devices == ("/gpu:0", "/gpu:1")
    cpu = model_fn.TowerLayout.for_devices(0, 3)
    assert cpu.devices == ("/cpu:0", "/cpu:1", "/cpu:2")
    assert cpu.consolidation_device == "/cpu:0"
    assert model_fn.TowerLayout.for_devices(2, 1, "GPU").consolidation_device == "/gpu:0"


def test_the_layout_inside_the_network_is_the_devices_own_unless_given():
    assert model_fn.TowerLayout.for_devices(2).data_format == "channels_first"
    assert model_fn.TowerLayout.for_devices(0, 3).data_format == "channels_last"
    assert model_fn.TowerLayout.for_devices(
        0, data_format="channels_first").data_format == "channels_first"
    assert model_fn.TowerLayout.for_devices(
        1, data_format="channels_last").data_format == "channels_last"


def test_split_batch_into_towers_keeps_order():
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        images = tf.reshape(tf.range(6 * 2, dtype=tf.float32), [6, 2])
        labels = tf.range(6)
        image_shards, label_shards = session.run(
            input_fn.split_batch_into_towers(images, labels, 3))
    assert [list(s) for s in label_shards] == [[0, 1], [2, 3], [4, 5]]
    np.testing.assert_array_equal(np.concatenate(image_shards), np.arange(12).reshape(6, 2))


def resnet8_train_spec(num_towers, batch_size=4, hparams=None, starting_values=None):
    """The real model_fn's TRAIN spec for ResNet-8 on `num_towers` logical CPU towers."""
    hparams = hparams or job_hparams.HParams(num_layers=8, train_batch_size=batch_size)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
    images = tf.random.uniform([batch_size, 32, 32, 3], maxval=255.0, seed=1)
    labels = tf.random.uniform([batch_size], maxval=10, dtype=tf.int32, seed=2)
    image_shards, label_shards = input_fn.split_batch_into_towers(images, labels, num_towers)
    return model_fn.make_model_fn(layout, hparams, starting_values=starting_values)(
        image_shards, label_shards, tf.estimator.ModeKeys.TRAIN, None)


FIRST_KERNEL = "resnet/conv2d/kernel"


def first_kernel_of_a_session(checkpoint_dir, starting_kernel):
    """The first convolution's kernel and its moving average as a two-tower ResNet-8 job's
    training session starts in checkpoint_dir, given starting_kernel as its starting value
    (the session saves a checkpoint as it starts, as the Estimator's does)."""
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=4, moving_average_decay=0.9)
    with tf.Graph().as_default():
        spec = resnet8_train_spec(2, hparams=hparams,
                                  starting_values={FIRST_KERNEL: starting_kernel})
        variables = {variable.op.name: variable for variable in tf.compat.v1.global_variables()}
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=str(checkpoint_dir), scaffold=spec.scaffold,
                save_summaries_steps=None, save_summaries_secs=None,
                config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})) as session:
            return session.run([variables[FIRST_KERNEL],
                                variables[FIRST_KERNEL + "/ExponentialMovingAverage"]])


def test_starting_values_start_a_job_and_a_resumed_job_keeps_its_checkpoints(tmp_path):
    first, second = np.random.RandomState(3).normal(size=[2, 3, 3, 3, 16]).astype(np.float32)
    kernel, average = first_kernel_of_a_session(tmp_path, first)
    # The variable both towers share, and its average, which starts from it.
    np.testing.assert_array_equal(kernel, first)
    np.testing.assert_array_equal(average, first)
    kernel, average = first_kernel_of_a_session(tmp_path, second)
    np.testing.assert_array_equal(kernel, first)  # restored, not started again
    np.testing.assert_array_equal(average, first)


@pytest.mark.slow
def test_the_estimator_starts_a_job_from_the_starting_values_and_resumes_it_from_its_checkpoint(
        tmp_path):
    def train(starting_kernel, max_steps):
        layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=2)
        hparams = job_hparams.HParams(num_layers=8, train_batch_size=4)
        config = tf.estimator.RunConfig(
            model_dir=str(tmp_path), save_checkpoints_steps=1,
            session_config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}))
        estimator = tf.estimator.Estimator(model_fn.make_model_fn(
            layout, hparams, starting_values={FIRST_KERNEL: starting_kernel}), config=config)
        estimator.train(input_fn.make_synthetic_input_fn(2, 4), max_steps=max_steps)
        return {step: tf.train.load_variable(str(tmp_path / ("model.ckpt-%d" % step)),
                                             FIRST_KERNEL) for step in range(max_steps + 1)}

    first, second = np.random.RandomState(4).normal(size=[2, 3, 3, 3, 16]).astype(np.float32)
    kernels = train(first, 1)
    np.testing.assert_array_equal(kernels[0], first)  # the checkpoint of the start
    assert np.abs(kernels[1] - first).max() > 0
    resumed = train(second, 2)
    np.testing.assert_array_equal(resumed[1], kernels[1])  # restored, not started again
    assert np.abs(resumed[2] - kernels[1]).max() < np.abs(second - kernels[1]).max() / 10


@pytest.mark.parametrize("name, shape, message", [
    ("resnet/conv2d/kernels", [3, 3, 3, 16], "no variable resnet/conv2d/kernels"),
    (FIRST_KERNEL, [3, 3, 3, 8], r"shape \(3, 3, 3, 8\), the variable \(3, 3, 3, 16\)"),
])
def test_a_starting_value_for_no_variable_or_of_another_shape_is_refused(name, shape, message):
    with tf.Graph().as_default(), pytest.raises(ValueError, match=message):
        resnet8_train_spec(1, starting_values={name: np.zeros(shape, np.float32)})


def test_batch_norm_statistics_are_updated_by_tower_0_only():
    with tf.Graph().as_default() as graph:
        spec = resnet8_train_spec(num_towers=2)
        update_ops = graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        ran_by_train_op = {op.name for op in spec.train_op.control_inputs}
    tower_0 = {op.name for op in update_ops if "/tower_0/" in op.name}
    tower_1 = {op.name for op in update_ops if "/tower_1/" in op.name}
    assert tower_0 and len(tower_0) == len(tower_1)  # both towers have batch norms
    assert tower_0 <= ran_by_train_op
    assert not tower_1 & ran_by_train_op


def test_gradients_are_averaged_on_their_variables_device_and_summaries_written():
    with tf.Graph().as_default() as graph:
        resnet8_train_spec(num_towers=2)
        averaging = [op for op in graph.get_operations()
                     if op.name.startswith("gradient_averaging/") and op.type == "AddN"]
        summaries = {tensor.op.name.split("/")[-1]
                     for tensor in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)}
    variables_count = len(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    assert len(averaging) == variables_count
    assert all(op.device.lower().endswith("cpu:0") for op in averaging)
    assert {"learning_rate", "accuracy"} <= summaries
    assert any(name.startswith("images") for name in summaries), summaries


def test_variable_strategy_gpu_spreads_variables_over_the_towers_by_size():
    # Only device strings are built here, so no GPU is needed.
    with tf.Graph().as_default() as graph:
        layout = model_fn.TowerLayout.for_devices(num_gpus=2, variable_strategy="GPU")
        hparams = job_hparams.HParams(num_layers=20)
        images = tf.zeros([4, 32, 32, 3])
        labels = tf.zeros([4], tf.int32)
        image_shards, label_shards = input_fn.split_batch_into_towers(images, labels, 2)
        tower_fn = model_fn.make_resnet_tower_fn(hparams, precision.policy("fp32"), "channels_last")
        model_fn.build_towers(image_shards, label_shards, layout, tower_fn, is_training=True)
        variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    bytes_on = {}
    for variable in variables:
        device = variable.device.lower()
        assert device.endswith(("gpu:0", "gpu:1")), (variable.op.name, device)
        size = int(np.prod(variable.shape)) * variable.dtype.size
        bytes_on[device[-5:]] = bytes_on.get(device[-5:], 0) + size
    largest = max(int(np.prod(v.shape)) * v.dtype.size for v in variables)
    assert set(bytes_on) == {"gpu:0", "gpu:1"}
    assert abs(bytes_on["gpu:0"] - bytes_on["gpu:1"]) <= largest


def resnet8_logits(images, hparams):
    """The logits of the ResNet-8 already built under 'resnet', in training mode."""
    with tf.compat.v1.variable_scope("resnet", reuse=True):
        return cifar10_model.ResNetCifar10(
            8, is_training=True, batch_norm_decay=hparams.batch_norm_decay,
            batch_norm_epsilon=hparams.batch_norm_epsilon,
            data_format="channels_last").forward_pass(images)


def resnet8_tower_loss(hparams, decayed_of):
    """One ResNet-8 tower's loss beside its parts, built again by hand: the cross entropy
    of the same logits and the sum of squares of `decayed_of(trainable variables)`."""
    with tf.Graph().as_default():
        images = tf.random.uniform([2, 32, 32, 3], maxval=255.0, seed=1)
        labels = tf.constant([3, 7])
        with tf.compat.v1.variable_scope("resnet"):
            tower_fn = model_fn.make_resnet_tower_fn(hparams, precision.policy("fp32"),
                                                     "channels_last")
            loss, probabilities = tower_fn(images, labels, True)
        trainable = tf.compat.v1.trainable_variables()
        decayed = decayed_of(trainable)
        logits = resnet8_logits(images, hparams)
        cross_entropy = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        squares = tf.add_n([tf.reduce_sum(tf.square(v)) for v in decayed])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = session.run(dict(loss=loss, probabilities=probabilities, logits=logits,
                                      cross_entropy=cross_entropy, squares=squares))
    values["trainable"] = [v.op.name for v in trainable]
    values["decayed"] = sorted(v.op.name for v in decayed)
    return types.SimpleNamespace(**values)


def test_tower_loss_is_cross_entropy_plus_weight_decay_of_every_trainable_variable():
    hparams = job_hparams.HParams(num_layers=8, weight_decay=0.01)
    tower = resnet8_tower_loss(hparams, lambda trainable: trainable)
    assert tower.squares > 0
    np.testing.assert_allclose(
        tower.loss, tower.cross_entropy + 0.01 * tower.squares / 2, rtol=1e-5)
    # The tower's predictions: the softmax over the 10 classes, without the 11th logit.
    class_logits = tower.logits[:, :10]
    np.testing.assert_allclose(
        tower.probabilities,
        np.exp(class_logits) / np.exp(class_logits).sum(axis=1, keepdims=True), rtol=1e-5)


def test_kernels_scope_decays_the_convolution_and_dense_kernels_only():
    hparams = job_hparams.HParams(num_layers=8, weight_decay=0.01, weight_decay_scope="kernels")
    tower = resnet8_tower_loss(
        hparams, lambda trainable: losses.decayed_variables(trainable, "kernels"))
    names = tower.decayed
    # Every convolution's kernel and the dense one; no gamma, beta or bias.
    assert names == sorted(name for name in tower.trainable if name.endswith("/kernel"))
    assert "resnet/dense/kernel" in names
    assert len(names) == sum(1 for name in tower.trainable if "conv2d" in name) + 1
    assert not [name for name in names if "BatchNorm" in name or name.endswith("bias")]
    np.testing.assert_allclose(
        tower.loss, tower.cross_entropy + 0.01 * tower.squares / 2, rtol=1e-5)


def test_an_unknown_weight_decay_scope_is_refused():
    with pytest.raises(ValueError, match="biases"):
        losses.decayed_variables([], "biases")


def test_a_global_step_is_every_workers_batch_with_sync_and_one_batch_without():
    sync = job_hparams.HParams(train_batch_size=128, num_workers=3, sync=True)
    asynchronous = job_hparams.HParams(train_batch_size=128, num_workers=3, sync=False)
    assert sync.examples_per_global_step == 384
    assert asynchronous.examples_per_global_step == 128


def sync_cluster_update(worker_batches, num_towers, moving_average_decay,
                        starting_values=None):
    """Trainable variables before and after one --sync update of an in-process cluster.

    A ps, a chief and a worker run as TensorFlow servers in this process; each trainer
    builds its own graph with the real model_fn under the Estimator's default device
    function and runs one step through a MonitoredTrainingSession with the model_fn's
    training hooks, each on its own batch of worker_batches, split over num_towers
    logical CPU devices, keeping moving averages of the weights with
    --moving-average-decay moving_average_decay; both trainers' graphs are given
    starting_values, which the chief's session starts the ps's variables from.

    Returns:
      ({name: value} before, {name: value} after, {name: value of its average} after).
    """
    jobs = ["chief", "worker"]
    spec = local_cluster.make_cluster(1, 1, local_cluster.free_ports(3))
    cluster_spec = tf.train.ClusterSpec(spec)
    device_config = tf.compat.v1.ConfigProto(device_count={"CPU": num_towers})
    tf.distribute.Server(cluster_spec, job_name="ps", task_index=0)
    servers = [tf.distribute.Server(cluster_spec, job_name=job, task_index=0, config=device_config)
               for job in jobs]
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=len(worker_batches[0][0]),
                                  num_workers=len(jobs), sync=True,
                                  moving_average_decay=moving_average_decay)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
    defaults = tf.estimator.RunConfig()  # what the RunConfig the model_fn reads would say
    sessions, train_ops = [], []
    for job, server, (images, labels) in zip(jobs, servers, worker_batches):
        with tf.Graph().as_default():
            # What tf.estimator.Estimator wraps the model_fn in when there is a ps.
            with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                    ps_tasks=1, worker_device="/job:%s/task:0" % job, merge_devices=True,
                    cluster=cluster_spec)):
                image_shards, label_shards = input_fn.split_batch_into_towers(
                    tf.constant(images), tf.constant(labels), num_towers)
                estimator_spec = model_fn.make_model_fn(
                    layout, hparams, starting_values=starting_values)(
                    image_shards, label_shards, tf.estimator.ModeKeys.TRAIN,
                    types.SimpleNamespace(
                        is_chief=job == "chief",
                        keep_checkpoint_max=defaults.keep_checkpoint_max,
                        keep_checkpoint_every_n_hours=defaults.keep_checkpoint_every_n_hours))
            variables = tf.compat.v1.trainable_variables()
            # The chief first: it initializes the variables the worker waits for.
            sessions.append(tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=job == "chief",
                hooks=estimator_spec.training_hooks, scaffold=estimator_spec.scaffold,
                config=tf.compat.v1.ConfigProto(allow_soft_placement=True)))
            train_ops.append(estimator_spec.train_op)
            if job == "chief":
                chief_variables = variables
                chief_globals = {variable.op.name: variable
                                 for variable in tf.compat.v1.global_variables()}
    chief_session = sessions[0]

    def read_variables(suffix=""):
        read = [chief_globals[variable.op.name + suffix] for variable in chief_variables]
        values = chief_session.run_step_fn(lambda step_context: step_context.session.run(read))
        return {variable.op.name: value for variable, value in zip(chief_variables, values)}

    before = read_variables()
    steps = [threading.Thread(target=session.run, args=(train_op,))
             for session, train_op in zip(sessions, train_ops)]
    for step in steps:
        step.start()
    for step in steps:
        step.join(120)
        assert not step.is_alive(), "the synchronous update never came"
    after = read_variables()
    averages = read_variables("/ExponentialMovingAverage")
    for session in reversed(sessions):
        session.close()
    return before, after, averages


def one_process_update(initial_values, images, labels, num_towers):
    """Trainable variables after one update of a single process from initial_values."""
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=len(images))
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
    with tf.Graph().as_default():
        image_shards, label_shards = input_fn.split_batch_into_towers(
            tf.constant(images), tf.constant(labels), num_towers)
        estimator_spec = model_fn.make_model_fn(layout, hparams)(
            image_shards, label_shards, tf.estimator.ModeKeys.TRAIN, None)
        variables = tf.compat.v1.trainable_variables()
        config = tf.compat.v1.ConfigProto(device_count={"CPU": num_towers})
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for variable in variables:
                variable.load(initial_values[variable.op.name], session)
            session.run(estimator_spec.train_op)
            return {variable.op.name: value
                    for variable, value in zip(variables, session.run(variables))}


@pytest.mark.slow
def test_sync_update_of_workers_with_towers_is_the_one_process_update_of_the_global_batch():
    """Two workers of two towers each, --sync: the update is the mean of the 4 towers' gradients.

    Each worker averages the gradients of its towers (model_fn.average_gradients) and
    SyncReplicasOptimizer averages one such gradient per worker into the update the
    chief applies on the ps. With equal shards that is the mean over all 4 towers, the
    update one process computes with 4 towers on the concatenated global batch. The
    ResNet's batch norm depends on the batch, but per tower: each tower sees the same
    2-example shard in both runs, so the two updates agree up to float rounding. The
    chief's batch alone gives another update, so a worker's gradient left out would
    show.

    The first convolution starts from a starting value: the chief's session gives it
    to the variable on the ps.

    With --moving-average-decay the chief averages once per aggregated update, before
    the workers' tokens for the next step go out: as the step ends, each average has
    moved from its weight's start once, with the decay of global step 1.
    """
    rng = np.random.RandomState(0)
    batches = [(rng.randint(0, 256, size=(4, 32, 32, 3)).astype(np.float32),
                rng.randint(0, 10, size=4).astype(np.int32)) for _ in range(2)]
    decay = 0.9
    starting_kernel = rng.normal(size=[3, 3, 3, 16]).astype(np.float32)
    before, after, averages = sync_cluster_update(
        batches, num_towers=2, moving_average_decay=decay,
        starting_values={FIRST_KERNEL: starting_kernel})
    np.testing.assert_array_equal(before[FIRST_KERNEL], starting_kernel)

    global_images = np.concatenate([images for images, _ in batches])
    global_labels = np.concatenate([labels for _, labels in batches])
    expected = one_process_update(before, global_images, global_labels, num_towers=4)
    chief_alone = one_process_update(before, *batches[0], num_towers=2)

    assert sorted(after) == sorted(expected) and len(after) > 10
    largest_change = max(np.abs(expected[name] - before[name]).max() for name in expected)
    assert largest_change > 1e-3
    # Float32 sums in another order differ in the last bits (measured: 1.5e-8 for a
    # largest change of 0.04); leaving out a worker's gradient changes the update
    # by a sizeable part of itself (measured: 0.027).
    for name in expected:
        np.testing.assert_allclose(after[name], expected[name], rtol=0,
                                   atol=1e-5 * largest_change, err_msg=name)
    assert max(np.abs(chief_alone[name] - expected[name]).max()
               for name in expected) > 0.1 * largest_change

    ramped = min(decay, 2.0 / 11.0)
    for name in expected:
        np.testing.assert_allclose(
            averages[name], before[name] - (1 - ramped) * (before[name] - after[name]),
            rtol=0, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_label_smoothing_spreads_over_the_10_classes_and_never_targets_the_11th_logit(
        label_smoothing):
    logits_value = np.random.RandomState(4).normal(size=(3, 11)).astype(np.float32)
    labels_value = np.array([0, 9, 4])
    with tf.Graph().as_default():
        logits = tf.constant(logits_value)
        loss = losses.mean_cross_entropy(tf.constant(labels_value), logits, label_smoothing)
        # d loss / d logits = (softmax - target) / N: the targets the loss trains towards.
        (gradient,) = tf.gradients(loss, [logits])
        with tf.compat.v1.Session() as session:
            loss_value, gradient_value = session.run([loss, gradient])
    softmax = np.exp(logits_value) / np.exp(logits_value).sum(axis=1, keepdims=True)
    targets = softmax - gradient_value * len(labels_value)
    expected = np.full((3, 11), label_smoothing / 10)
    expected[:, 10] = 0.0
    expected[np.arange(3), labels_value] += 1 - label_smoothing
    np.testing.assert_allclose(targets, expected, atol=1e-6)
    np.testing.assert_allclose(loss_value, -np.mean(np.sum(expected * np.log(softmax), axis=1)),
                               rtol=1e-5)


def tower_losses_sharing_variables(is_training, *smoothings, at_steps=(0,)):
    """The ResNet-8 tower's loss on one batch for each of `smoothings` (a label smoothing,
    or a dict of HParams fields), with the same weights, at each global step of
    `at_steps`: [[loss of each smoothing] at each step]."""
    with tf.Graph().as_default():
        # Fixed initial weights: at some random ones the two training losses differ by
        # less than the test's tolerance. The layers' initializers draw their seeds from
        # Python's random module, not from the graph seed, so both are set.
        tf.compat.v1.set_random_seed(0)
        random.seed(0)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        images = tf.random.uniform([4, 32, 32, 3], maxval=255.0, seed=2)
        labels = tf.constant([1, 2, 3, 4])
        losses = []
        for index, smoothing in enumerate(smoothings):
            fields = smoothing if isinstance(smoothing, dict) else {"label_smoothing": smoothing}
            hparams = job_hparams.HParams(num_layers=8, train_steps=10, **fields)
            tower_fn = model_fn.make_resnet_tower_fn(hparams, precision.policy("fp32"),
                                                     "channels_last")
            with tf.compat.v1.variable_scope("resnet", reuse=bool(index)):
                losses.append(tower_fn(images, labels, is_training)[0])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = []
            for step in at_steps:
                global_step.load(step, session)
                values.append(session.run(losses))
            return values


def test_label_smoothing_is_for_training_only():
    [(smooth, plain)] = tower_losses_sharing_variables(False, 0.2, 0.0)
    assert smooth == pytest.approx(plain)  # the evaluation loss compares across runs
    [(smooth, plain)] = tower_losses_sharing_variables(True, 0.2, 0.0)
    assert smooth != pytest.approx(plain, rel=1e-3)


def test_a_decaying_label_smoothing_falls_from_its_factor_to_none_at_the_last_step():
    decaying = {"label_smoothing": 0.2, "label_smoothing_decay": True}
    # The run's last step is 10: the factor is 0.2 at step 0, 0.1 at 5, none at 10.
    at_0, at_5, at_10 = tower_losses_sharing_variables(True, decaying, 0.2, 0.1, 0.0,
                                                       at_steps=(0, 5, 10))
    assert at_0[0] == pytest.approx(at_0[1], rel=1e-6)
    assert at_5[0] == pytest.approx(at_5[2], rel=1e-6)
    assert at_10[0] == pytest.approx(at_10[3], rel=1e-6)
    assert len({round(value, 4) for value in at_0[1:]}) == 3  # the three factors differ
    # Evaluation never smooths.
    [(evaluated, plain)] = tower_losses_sharing_variables(False, decaying, 0.0)
    assert evaluated == pytest.approx(plain)


def train_graph(**fields):
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=4, **fields)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0)
    with tf.Graph().as_default() as graph:
        images = tf.zeros([4, 32, 32, 3])
        labels = tf.constant([1, 2, 3, 4])
        model_fn.make_model_fn(layout, hparams)([images], [labels], tf.estimator.ModeKeys.TRAIN,
                                                None)
    return graph


@pytest.mark.parametrize("nesterov", [False, True])
def test_nesterov_flag_reaches_the_momentum_update(nesterov):
    updates = [op for op in train_graph(nesterov=nesterov).get_operations()
               if "ApplyMomentum" in op.type]
    assert updates and all(op.get_attr("use_nesterov") is nesterov for op in updates)


def eval_spec(hparams, images, labels, num_towers=2):
    """The real model_fn's EVAL spec for `images` on `num_towers` logical CPU towers."""
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
    image_shards, label_shards = input_fn.split_batch_into_towers(images, labels, num_towers)
    return model_fn.make_model_fn(layout, hparams)(
        image_shards, label_shards, tf.estimator.ModeKeys.EVAL, None)


def test_eval_flips_average_each_image_with_its_mirror_and_keep_the_plain_loss():
    images_value = np.random.RandomState(5).randint(0, 256, (4, 32, 32, 3)).astype(np.float32)
    with tf.Graph().as_default():
        images = tf.constant(images_value)
        labels = tf.constant([1, 2, 3, 4])
        flips_spec = eval_spec(job_hparams.HParams(num_layers=8, eval_flips=True), images,
                               labels)
        # The same variables, evaluated without flips on the images and on their mirrors.
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            plain_spec = eval_spec(job_hparams.HParams(num_layers=8), images, labels)
            mirrored_spec = eval_spec(job_hparams.HParams(num_layers=8),
                                      tf.constant(images_value[:, :, ::-1, :]), labels)
        accuracy, update_accuracy = flips_spec.eval_metric_ops["accuracy"]
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            flips, plain, mirrored, _ = session.run(
                [{"loss": spec.loss, **spec.predictions}
                 for spec in (flips_spec, plain_spec, mirrored_spec)] + [update_accuracy])
            accuracy = session.run(accuracy)
    mean = (plain["probabilities"] + mirrored["probabilities"]) / 2
    np.testing.assert_allclose(flips["probabilities"], mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(flips["classes"], mean.argmax(axis=1))
    assert accuracy == pytest.approx(np.mean(mean.argmax(axis=1) == [1, 2, 3, 4]))
    assert np.abs(plain["probabilities"] - mean).max() > 1e-4  # the mirror made a difference
    # The loss stays the cross entropy of the images alone, comparable across runs.
    assert flips["loss"] == pytest.approx(plain["loss"], rel=1e-6)


def shifted(images, down, right):
    """images [N, H, W, C] moved down and right (negative: up, left), zero fill."""
    size = images.shape[1]
    padded = np.pad(images, [(0, 0), (8, 8), (8, 8), (0, 0)])
    return padded[:, 8 - down:8 - down + size, 8 - right:8 - right + size, :]


def test_eval_shifts_average_the_shifted_images_and_their_mirrors():
    images_value = np.random.RandomState(6).randint(0, 256, (4, 32, 32, 3)).astype(np.float32)
    views = [images_value] + [shifted(images_value, down, right)
                              for down, right in ((0, 2), (0, -2), (2, 0), (-2, 0))]
    views += [view[:, :, ::-1, :] for view in views]
    with tf.Graph().as_default():
        labels = tf.constant([1, 2, 3, 4])
        views_spec = eval_spec(job_hparams.HParams(num_layers=8, eval_flips=True, eval_shifts=2),
                               tf.constant(images_value), labels)
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            plain_specs = [eval_spec(job_hparams.HParams(num_layers=8), tf.constant(view), labels)
                           for view in views]
        with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(
                device_count={"CPU": 2})) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            averaged, plain = session.run(
                [{"loss": views_spec.loss, **views_spec.predictions},
                 [{"loss": spec.loss, **spec.predictions} for spec in plain_specs]])
    mean = np.mean([view["probabilities"] for view in plain], axis=0)
    np.testing.assert_allclose(averaged["probabilities"], mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(averaged["classes"], mean.argmax(axis=1))
    assert averaged["loss"] == pytest.approx(plain[0]["loss"], rel=1e-6)


def test_shift_learning_rate_factor_multiplies_the_batch_norm_shift_gradients_alone():
    with tf.Graph().as_default():
        beta = tf.compat.v1.get_variable("resnet/BatchNorm/beta", initializer=[0.0])
        gamma = tf.compat.v1.get_variable("resnet/BatchNorm/gamma", initializer=[1.0])
        kernel = tf.compat.v1.get_variable("resnet/conv2d/kernel", initializer=[1.0])
        gradvars = [(tf.constant([2.0]), beta), (tf.constant([3.0]), gamma),
                    (tf.constant([5.0]), kernel)]
        scaled = model_fn.scale_shift_gradients(gradvars, 4.0)
        with tf.compat.v1.Session() as session:
            values = session.run([gradient for gradient, _ in scaled])
    assert [variable for _, variable in scaled] == [beta, gamma, kernel]
    assert [float(value[0]) for value in values] == [8.0, 3.0, 5.0]
    assert model_fn.scale_shift_gradients(gradvars, 1.0) is gradvars


def training_images_at_steps(images, hparams, steps):
    """{global step: what area_resize.phase_images makes of `images` at that step, in the
    image-size phases of `hparams`}."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        trained_on = area_resize.phase_images(tf.constant(images),
                                              schedule.resolution_phases(hparams), global_step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            outputs = {}
            for step in steps:
                session.run(global_step.assign(step))
                outputs[step] = session.run(trained_on)
    return outputs


def area_means(images, side):
    """32x32 images [N, 32, 32, 3] as side x side means of their pixel blocks."""
    block = 32 // side
    return images.reshape(len(images), side, block, side, block, 3).mean(axis=(2, 4))


def test_low_resolution_images_are_area_means_until_the_switch_step_then_the_originals():
    images = np.random.RandomState(7).uniform(0, 255, [2, 32, 32, 3]).astype(np.float32)
    # 45000 examples at 64 a step: 703 steps an epoch, so 0.5 epochs end at step 352.
    hparams = job_hparams.HParams(num_train_examples=45000, train_batch_size=64,
                                  low_resolution_epochs=0.5, low_resolution=16)
    outputs = training_images_at_steps(images, hparams, (0, 351, 352, 5000))
    for step in (0, 351):
        np.testing.assert_allclose(outputs[step], area_means(images, 16), rtol=1e-5)
    for step in (352, 5000):
        np.testing.assert_array_equal(outputs[step], images)


def test_lower_resolution_images_come_first_then_the_low_resolution_ones_then_the_originals():
    images = np.random.RandomState(7).uniform(0, 255, [2, 32, 32, 3]).astype(np.float32)
    # 703 steps an epoch: 8 pixels until step 352 (0.5 epochs, rounded), 16 until 1054.
    hparams = job_hparams.HParams(num_train_examples=45000, train_batch_size=64,
                                  lower_resolution_epochs=0.5, lower_resolution=8,
                                  low_resolution_epochs=1.0, low_resolution=16)
    outputs = training_images_at_steps(images, hparams, (0, 351, 352, 1053, 1054, 5000))
    for step, side in ((0, 8), (351, 8), (352, 16), (1053, 16)):
        np.testing.assert_allclose(outputs[step], area_means(images, side), rtol=1e-5)
    for step in (1054, 5000):
        np.testing.assert_array_equal(outputs[step], images)


def test_without_low_resolution_epochs_the_training_images_are_left_alone():
    images = tf.zeros([2, 32, 32, 3])
    assert area_resize.phase_images(
        images, schedule.resolution_phases(job_hparams.HParams()), None) is images
