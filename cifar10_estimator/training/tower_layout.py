"""TowerLayout: where a model_fn's towers run, where their variables live, and the layout
the network computes in there (the tutorial's choice of devices and variable strategy)."""

import dataclasses

from cifar10_estimator import cifar10_utils


@dataclasses.dataclass(frozen=True)
class TowerLayout:
    """Where towers run, where their variables live, and the layout the network computes
    in there: the run's devices, which hparams.HParams leave out.

    Attributes:
      devices: one device string per tower, e.g. ['/gpu:0', '/gpu:1'] or ['/cpu:0'].
      data_format: the layout inside the network (model_base.DATA_FORMATS); the
        variables, so the checkpoints, are the same in both.
      variable_strategy: 'CPU' keeps every variable on /cpu:0; 'GPU' spreads them
        over the tower devices, each on the least loaded by bytes.
      prefetch_to_devices: training stages each tower's shard on its device a step
        ahead (training.device_prefetch): for GPU towers, whose shards cross from the
        host; CPU towers share the host's memory.
    """

    devices: tuple
    data_format: str
    variable_strategy: str = "CPU"
    prefetch_to_devices: bool = False

    @classmethod
    def for_devices(cls, num_gpus, num_cpu_towers=1, variable_strategy="CPU",
                    data_format=None):
        """num_gpus GPU towers, or (num_gpus == 0) num_cpu_towers logical CPU towers.

        data_format None takes the devices' own: channels_first (NCHW, fastest) on GPUs,
        channels_last on the CPU, the only layout of TensorFlow's stock CPU kernels.
        """
        if num_gpus > 0:
            devices = tuple("/gpu:%d" % i for i in range(num_gpus))
        else:
            devices = tuple("/cpu:%d" % i for i in range(num_cpu_towers))
        return cls(devices=devices, variable_strategy=variable_strategy,
                   data_format=data_format or ("channels_first" if num_gpus > 0
                                               else "channels_last"),
                   prefetch_to_devices=num_gpus > 0)

    @property
    def num_towers(self):
        return len(self.devices)

    @property
    def consolidation_device(self):
        """Device of the averaged update: next to the variables."""
        return "/gpu:0" if self.variable_strategy == "GPU" else "/cpu:0"

    def device_setter(self, tower_index):
        """Device function for tower `tower_index`: its ops on its device, variables per strategy."""
        worker_device = self.devices[tower_index]
        if self.variable_strategy == "CPU":
            return cifar10_utils.local_device_setter(worker_device=worker_device)
        strategy = cifar10_utils.GreedyLoadBalancingStrategy(
            self.num_towers, cifar10_utils.byte_size_load_fn)
        device_type = worker_device.split(":")[0].lstrip("/")
        return cifar10_utils.local_device_setter(
            num_devices=self.num_towers, ps_device_type=device_type,
            worker_device=worker_device, ps_strategy=strategy)
