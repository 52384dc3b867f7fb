"""Each tower's shard copied to its device a step ahead: one StagingArea per tower.

The input function makes every batch on the CPU. Without prefetching, a GPU tower's
first op waits each step for its shard to cross from the host. Here each step takes the
shards staged on the towers' devices by the step before and stages the next batch's, so
the copy runs beside the step's computation (tf_cnn_benchmarks' staging; tf.data's
prefetch_to_device serves one device, and the Estimator's input function is one Dataset
of every tower's shards).

The order of the batches is the input's: a session first stages the batch the input
serves next (PrefetchWarmUpHook, after the Estimator has initialized the iterator at the
global step), and step N trains on the batch staged before it, so a resumed run still
takes batch N at step N. The batch staged by a session's last step is never trained on:
the next session stages anew from its global step.
"""

import dataclasses

import tensorflow as tf
from tensorflow.python.ops import data_flow_ops


@dataclasses.dataclass(frozen=True)
class StagedShards:
    """The towers' shards as a step takes them from their devices' staging areas.

    Attributes:
      features, labels: one shard per tower, as the input function's, each on its
        tower's device.
      put: the op staging the next batch's shards; every step runs it.
      clear: the op emptying every staging area.
    """

    features: list
    labels: list
    put: tf.Operation
    clear: tf.Operation

    def warm_up_hook(self):
        """The SessionRunHook staging a session's first batch (it must follow the input's
        hooks, which initialize the iterator)."""
        return PrefetchWarmUpHook(self.clear, self.put)


def stage_on_devices(features, labels, devices):
    """Stage each tower's (features, labels) shard on its device.

    Args:
      features, labels: one shard per tower (a tensor, or a structure of them with static
        shapes), as the input function returns them.
      devices: one device per tower.

    Returns:
      StagedShards.
    """
    staged_features, staged_labels, puts, clears = [], [], [], []
    for shard, device in zip(zip(features, labels), devices):
        tensors = tf.nest.flatten(shard)
        with tf.device(device), tf.name_scope("device_prefetch"):
            area = data_flow_ops.StagingArea(
                [tensor.dtype for tensor in tensors], [tensor.shape for tensor in tensors])
            puts.append(area.put(tensors))
            clears.append(area.clear())
            tower_features, tower_labels = tf.nest.pack_sequence_as(shard, area.get())
        staged_features.append(tower_features)
        staged_labels.append(tower_labels)
    return StagedShards(staged_features, staged_labels,
                        tf.group(*puts, name="stage_next_shards"),
                        tf.group(*clears, name="clear_staged_shards"))


class PrefetchWarmUpHook(tf.compat.v1.train.SessionRunHook):
    """Stages the first batch of a session, which its first step trains on.

    The staging areas are emptied first: where they outlive a session (a server's
    devices, in a cluster), one holding the previous session's last batch would put every
    step a batch behind.
    """

    def __init__(self, clear, put):
        self._clear = clear
        self._put = put

    def after_create_session(self, session, coord):
        del coord
        session.run(self._clear)
        session.run(self._put)
