"""Which GPUs a process computes on, and how it takes their memory.

TensorFlow left to itself makes a device of every GPU it sees and reserves most of each
one's memory at its first session: `--num-gpus 1` on a box of four would hold all four,
and the second process of a cluster on one machine would find no memory left. So a
process with N towers sees GPUs 0..N-1 of those CUDA_VISIBLE_DEVICES leaves it and takes
their memory as it grows; TF_FORCE_GPU_ALLOW_GROWTH=false, which TensorFlow reads over
the session's option, makes it reserve the memory at start instead. The tasks of a
cluster on one machine are each given their own GPUs through CUDA_VISIBLE_DEVICES
(gpus_of_tasks), so each sees its own as 0..N-1.
"""

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_device_list(num_gpus):
    """The session's visible_device_list of num_gpus towers: '0,1,...,N-1'."""
    return ",".join(str(index) for index in range(num_gpus))


def take_gpus(session_config, num_gpus):
    """Make a session of `session_config` (a tf.compat.v1.ConfigProto) compute on GPUs
    0..num_gpus-1 of those visible, taking their memory as it grows; with 0, on no GPU
    (no GPU device is made, so none of their memory is taken).

    tf.estimator hands the GPU options to the servers of a cluster's tasks too
    (cluster.start_trainer_server copies the device counts as well).
    """
    gpu_options = session_config.gpu_options
    gpu_options.visible_device_list = visible_device_list(num_gpus)
    gpu_options.allow_growth = True
    # Host buffers the GPUs copy from are pinned: the input pipeline's batches reach them
    # without a staging copy.
    gpu_options.force_gpu_compatible = True
    if not num_gpus:
        session_config.device_count["GPU"] = 0


def take_gpus_in_tensorflows_context(num_gpus):
    """Make TensorFlow's own context see the sessions' GPUs (take_gpus), 0..num_gpus-1, and
    take their memory as it grows.

    A summary writer or a dataset made outside a session starts that context, and the
    first to start a GPU decides for the whole process how its memory is taken: left to
    its defaults the context would reserve every visible GPU's memory before the first
    session. Call it before anything runs on a device; calling it again with the same
    number does nothing.
    """
    import tensorflow as tf  # lazy: the launcher deals out GPUs without loading it
    gpus = tf.config.list_physical_devices("GPU")[:num_gpus]
    tf.config.set_visible_devices(gpus, "GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)


def gpus_of_tasks(wanted, visible_gpus):
    """The GPUs of each task of a cluster on one machine, none shared: the tasks take theirs
    from `visible_gpus` in turn.

    Args:
      wanted: [(task name, number of GPUs)], in the order they are dealt.
      visible_gpus: the CUDA_VISIBLE_DEVICES entries naming the machine's GPUs
        (hardware.visible_gpu_entries).

    Returns:
      {task name: its CUDA_VISIBLE_DEVICES value}, '' for a task without GPUs.

    Raises:
      ValueError: the tasks want more GPUs than there are, naming how many each wants.
    """
    needed = sum(count for _, count in wanted)
    if needed > len(visible_gpus):
        raise ValueError("%s need %d GPUs, and %d %s visible" % (
            ", ".join("%s %d" % (name, count) for name, count in wanted if count), needed,
            len(visible_gpus), "is" if len(visible_gpus) == 1 else "are"))
    gpus, start = {}, 0
    for name, count in wanted:
        gpus[name] = ",".join(visible_gpus[start:start + count])
        start += count
    return gpus
