"""The bytes one training step sends between devices, for each variable strategy and
number of GPU towers: counted on the graph tf.estimator builds (nothing runs, so no GPU
is needed) and checked against what the towers need, derived from the model's variables.

What a step needs, per tower: its shard of the batch (float32 images and int32 labels);
each trainable variable twice, once for the network and once for weight decay
(ReadVariableOp is stateful, so TensorFlow keeps both reads); batch norm's moving
statistics, which the fused training kernel takes as inputs; and its gradient of each
trainable variable, back to the variable. Tower 0 also sends its batch statistics to the
moving statistics. Each of these crosses where the variable is on another device than the
tower: with --variable-strategy CPU for every tower, with GPU for all towers but the one
that holds the variable.
"""

import pytest
import tensorflow as tf

import device_bytes
from test_docs import marked_table
from cifar10_estimator import cifar10
from cifar10_estimator import model_fn

BATCH_SIZE = 128
TOWER_COUNTS = [1, 2, 4, 8]
STRATEGIES = ["CPU", "GPU"]
# Rank-0 tensors cross too (each tower's loss, the global step, the learning rate): a few
# hundred bytes a step, counted but left out of the derivation.
SCALAR_BYTES_BOUND = 1024


def shard_bytes(batch_size):
    """float32 images [B, 32, 32, 3] and int32 labels [B]: a global batch's bytes."""
    return batch_size * (cifar10.HEIGHT * cifar10.WIDTH * cifar10.DEPTH * 4 + 4)


def variable_bytes(variables):
    return sum(variable.shape.num_elements() * variable.dtype.base_dtype.size
               for variable in variables)


def step_bytes(num_towers, variable_strategy, trainable_bytes, statistics_bytes,
               statistics_away_from_tower_0_bytes):
    """The bytes a step sends between devices, as the module docstring derives them."""
    # How many towers each variable crosses to: all, or all but the one holding it.
    copies = num_towers - (variable_strategy == "GPU")
    return (shard_bytes(BATCH_SIZE) + copies * (3 * trainable_bytes + statistics_bytes)
            + statistics_away_from_tower_0_bytes)


def derived_step_bytes(graph, layout):
    """step_bytes of `layout`, from the variables of `graph` and where they live."""
    with graph.as_default():
        trainable = tf.compat.v1.trainable_variables()
        statistics = [variable for variable in tf.compat.v1.global_variables()
                      if "/moving_" in variable.op.name]
    first_tower = tf.DeviceSpec.from_string(layout.devices[0])
    away_from_tower_0 = [variable for variable in statistics
                         if tf.DeviceSpec.from_string(variable.device) != first_tower]
    return step_bytes(layout.num_towers, layout.variable_strategy, variable_bytes(trainable),
                      variable_bytes(statistics), variable_bytes(away_from_tower_0))


def counted_bytes(crossings):
    """(bytes of tensors with elements, bytes of scalars) the crossings carry."""
    scalars = sum(crossing.num_bytes for crossing in crossings if crossing.is_scalar)
    return sum(crossing.num_bytes for crossing in crossings) - scalars, scalars


def gpu_training_step(tiny_data_dir, tmp_path, num_gpus, variable_strategy, num_layers):
    layout = model_fn.TowerLayout.for_devices(num_gpus, variable_strategy=variable_strategy)
    graph, spec, _ = device_bytes.training_step(
        str(tiny_data_dir), layout,
        ["--num-layers", str(num_layers), "--train-batch-size", str(BATCH_SIZE)],
        tmp_path / "job")
    return graph, layout, device_bytes.step_crossings(graph, spec, layout)


# The network's depth changes the variables' bytes, not what crosses: ResNet-8 checks
# every tower count, the tutorial's ResNet-44 the figures of two towers.
@pytest.mark.parametrize("variable_strategy", STRATEGIES)
@pytest.mark.parametrize("num_gpus", TOWER_COUNTS)
def test_a_steps_bytes_between_devices_are_the_shards_variables_and_gradients(
        tiny_data_dir, tmp_path, num_gpus, variable_strategy):
    graph, layout, crossings = gpu_training_step(
        tiny_data_dir, tmp_path, num_gpus, variable_strategy, num_layers=8)
    with_elements, scalars = counted_bytes(crossings)
    assert with_elements == derived_step_bytes(graph, layout)
    assert scalars < SCALAR_BYTES_BOUND


@pytest.fixture(scope="module")
def resnet44_two_gpu_steps(tiny_data_dir, tmp_path_factory):
    """{variable strategy: (graph, layout, crossings)} of the tutorial's ResNet-44 on two GPUs."""
    return {strategy: gpu_training_step(tiny_data_dir, tmp_path_factory.mktemp(strategy), 2,
                                        strategy, num_layers=44)
            for strategy in STRATEGIES}


def test_the_tutorials_resnet44_on_two_gpus_sends_the_derived_bytes(resnet44_two_gpu_steps):
    for graph, layout, crossings in resnet44_two_gpu_steps.values():
        with_elements, scalars = counted_bytes(crossings)
        assert with_elements == derived_step_bytes(graph, layout)
        assert scalars < SCALAR_BYTES_BOUND


BYTES_TABLE_PAGE = "docs/training.md"
BYTES_TABLE_BEGIN = "<!-- The bytes table:"
BYTES_TABLE_END = "<!-- End of the bytes table. -->"


def test_the_manuals_table_states_each_steps_bytes_for_resnet44(resnet44_two_gpu_steps):
    graph, _, _ = resnet44_two_gpu_steps["CPU"]
    with graph.as_default():
        trainable = variable_bytes(tf.compat.v1.trainable_variables())
        statistics = variable_bytes([variable for variable in tf.compat.v1.global_variables()
                                     if "/moving_" in variable.op.name])
    header, *rows = [cells for _, cells in marked_table(
        BYTES_TABLE_PAGE, BYTES_TABLE_BEGIN, BYTES_TABLE_END)]
    assert [int(cells[0]) for cells in rows] == TOWER_COUNTS
    for cells in rows:
        for strategy, stated in zip(STRATEGIES, cells[1:3]):
            num_towers = int(cells[0])
            # With GPU, which moving statistics tower 0 holds depends on the balancing:
            # the figure must be the same whichever it holds.
            bounds = [step_bytes(num_towers, strategy, trainable, statistics, away)
                      for away in ((statistics,) if strategy == "CPU" else (0, statistics))]
            assert {"%.1f MB" % (bytes_ / 1e6) for bytes_ in bounds} == {stated}, cells


def test_the_count_sends_a_tensor_once_to_each_other_device_that_consumes_it():
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/cpu:0"):
            variable = tf.compat.v1.get_variable("weights", [3, 4], use_resource=True)
            batch = tf.zeros([5, 3])
        with tf.device("/gpu:0"):
            # The read is asked for on the GPU; TensorFlow reads next to the variable.
            product = tf.matmul(batch, variable.read_value())
            twice = tf.reduce_sum(product + tf.reduce_sum(batch))
        with tf.device("/gpu:1"):
            other = tf.reduce_sum(batch * 2.0)
        total = twice + other
    crossings = device_bytes.crossings(graph, [total], "/gpu:0")
    assert sorted((crossing.source, crossing.destination, crossing.num_bytes)
                  for crossing in crossings) == [
        ("/cpu:0", "/gpu:0", 3 * 4 * 4),   # the variable's value
        ("/cpu:0", "/gpu:0", 5 * 3 * 4),   # batch, once for its two consumers
        ("/cpu:0", "/gpu:1", 5 * 3 * 4),   # batch again, to another device
        ("/gpu:1", "/gpu:0", 4),           # other, consumed by `total` on the default device
    ]
