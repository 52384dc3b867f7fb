"""The bytes a training step sends between devices, counted on its graph (no device needed).

TensorFlow sends a tensor once to each device that has an op consuming it, so one step's
traffic between devices is, for each tensor the step computes, its size once per other
device it feeds. Where an op runs is where TensorFlow's placer would put it: beside the
variable (or iterator) whose resource it takes, else on its requested device, else beside
the op it is colocated with.
"""

import collections
import dataclasses

import tensorflow as tf

# Ops that pass resources on rather than reading them, which the placer does not put
# beside their resource inputs (TensorFlow's input colocation exemptions).
_RESOURCE_FORWARDING_OPS = frozenset(
    ["If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall",
     "StatefulPartitionedCall"])


@dataclasses.dataclass(frozen=True)
class Crossing:
    """One tensor sent from its producer's device to a device that consumes it."""

    tensor: str
    source: str
    destination: str
    num_bytes: int
    is_scalar: bool
    consumers: tuple


def step_ops(fetches):
    """Every op that running `fetches` (tensors or ops) runs: their inputs and control
    inputs, transitively."""
    ops = set()
    pending = [getattr(fetch, "op", fetch) for fetch in fetches]
    while pending:
        op = pending.pop()
        if op not in ops:
            ops.add(op)
            pending += [tensor.op for tensor in op.inputs] + list(op.control_inputs)
    return ops


def _canonical(device):
    spec = tf.DeviceSpec.from_string(device)
    return "/%s:%d" % (spec.device_type.lower(), spec.device_index or 0) if device else ""


class Placement:
    """The device of each op of a graph, as TensorFlow's placer would choose it."""

    def __init__(self, graph, default_device):
        self._graph = graph
        self._default_device = default_device
        self._devices = {}

    def device(self, op):
        if op not in self._devices:
            self._devices[op] = self._place(op)
        return self._devices[op]

    def _place(self, op):
        resources = [tensor for tensor in op.inputs if tensor.dtype == tf.resource]
        if resources and op.type not in _RESOURCE_FORWARDING_OPS:
            return self.device(resources[0].op)
        if op.device:
            return _canonical(op.device)
        groups = [group.decode()[len("loc:@"):] for group in op.colocation_groups()]
        if groups != [op.name]:
            return self.device(self._graph.get_operation_by_name(groups[0]))
        datasets = [tensor for tensor in op.inputs if tensor.dtype == tf.variant]
        if datasets:
            return self.device(datasets[0].op)
        return self._default_device


def tensor_bytes(tensor):
    """The static size of `tensor` in bytes (its shape must be fully known)."""
    return tensor.shape.num_elements() * tensor.dtype.size


def crossings(graph, fetches, default_device):
    """Every tensor a run of `fetches` sends between devices, once per destination."""
    placement = Placement(graph, default_device)
    consumers = collections.defaultdict(list)
    for op in step_ops(fetches):
        for tensor in op.inputs:
            destination = placement.device(op)
            if placement.device(tensor.op) != destination:
                consumers[tensor, destination].append(op.type)
    return [Crossing(tensor.name, placement.device(tensor.op), destination,
                     tensor_bytes(tensor), tensor.shape.rank == 0, tuple(sorted(types)))
            for (tensor, destination), types in consumers.items()]


def training_step(data_dir, layout, argv, job_dir):
    """(graph, EstimatorSpec, input hooks) of the training of trainer flags `argv` on the
    towers of `layout` (a model_fn.TowerLayout), built as tf.estimator builds it: the
    global step, the training input_fn's Dataset on the CPU with its iterator, the
    model_fn. Nothing runs, so a GPU layout builds on any machine."""
    from cifar10_estimator import flags, input_fn, model_fn

    hparams = flags.parse(argv + ["--num-gpus", "0", "--job-dir", str(job_dir)]).hparams
    estimator = tf.estimator.Estimator(model_fn.make_model_fn(layout, hparams),
                                       model_dir=str(job_dir))
    graph = tf.Graph()
    with graph.as_default():
        # The Estimator's own steps, so that the input's ops are placed as in a run.
        estimator._create_and_assert_global_step(graph)
        features, labels, input_hooks = estimator._get_features_and_labels_from_input_fn(
            input_fn.make_training_input_fn(data_dir, layout.num_towers,
                                            hparams.train_batch_size, True),
            tf.estimator.ModeKeys.TRAIN)
        spec = estimator._call_model_fn(features, labels, tf.estimator.ModeKeys.TRAIN,
                                        estimator.config)
    return graph, spec, input_hooks


def step_crossings(graph, spec, layout):
    """The crossings of one training step of `spec` on the towers of `layout`: the train
    op and the loss, which tf.estimator runs at every step (summaries and logged tensors
    come every 100 steps).

    An op no device was asked for (the global step's, in a tf.estimator graph) goes to
    the first tower's device: TensorFlow's placer prefers a GPU where the op has a kernel.
    """
    return crossings(graph, [spec.train_op, spec.loss], _canonical(layout.devices[0]))
