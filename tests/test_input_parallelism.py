"""The training pipeline assembles as many batches at once as a GPU box has cores, and
keeps more ready, where the run trains on GPUs; on the CPU it keeps its two and two."""

import dataclasses
import threading
import time

import tensorflow as tf

from cifar10_estimator import flags
from cifar10_estimator import main as trainer


def constant_input(nodes, node, argument_index):
    """The value of the Const that feeds input `argument_index` of `node`, among `nodes`."""
    source = nodes[node.input[argument_index].split(":")[0]]
    assert source.op == "Const", source
    return int(tf.make_ndarray(source.attr["value"].tensor))


def pipeline_sizes(graph):
    """(the batches' map's num_parallel_calls, the prefetch's buffer_size) of the graph's
    pipeline, where the map runs inside the pipeline's flat_map function."""
    graph_def = graph.as_graph_def()
    sizes = {}
    for nodes in [graph_def.node] + [function.node_def for function in graph_def.library.function]:
        by_name = {node.name: node for node in nodes}
        for node in nodes:
            if node.op == "ParallelMapDatasetV2":
                sizes["parallel"] = constant_input(by_name, node, -1)
            elif node.op == "PrefetchDataset":
                sizes["prefetch"] = constant_input(by_name, node, 1)
    return sizes["parallel"], sizes["prefetch"]


def training_pipeline_sizes(data_dir, job_dir, num_gpus):
    """pipeline_sizes of the trainer's training input_fn for a run on num_gpus GPUs."""
    settings = flags.parse(["--data-dir", str(data_dir), "--job-dir", str(job_dir),
                            "--num-gpus", "0", "--train-batch-size", "16"])
    # The flags would look for the GPUs; the input function only reads their number.
    settings = dataclasses.replace(settings, num_gpus=num_gpus)
    graph = tf.Graph()
    with graph.as_default():
        trainer.make_train_input_fn(settings)()
    return pipeline_sizes(graph)


def test_the_cpus_pipeline_keeps_its_sizes_and_gpus_get_one_batch_per_core(
        tiny_data_dir, tmp_path):
    assert training_pipeline_sizes(tiny_data_dir, tmp_path / "job", 0) == (2, 2)
    for num_gpus in (1, 4):
        assert training_pipeline_sizes(tiny_data_dir, tmp_path / "job", num_gpus) == (
            tf.data.AUTOTUNE, 8)


def most_calls_at_once(num_threads):
    """The most calls a map with num_parallel_calls AUTOTUNE runs at once, the autotuner
    off (as the pipeline's options have it), on a tf.data thread pool of num_threads."""
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def call(value):
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.02)
        with lock:
            running["now"] -= 1
        return value

    options = tf.data.Options()
    options.autotune.enabled = False
    options.threading.private_threadpool_size = num_threads
    dataset = tf.data.Dataset.range(4 * num_threads).map(
        lambda value: tf.py_function(call, [value], tf.int64),
        num_parallel_calls=tf.data.AUTOTUNE).with_options(options)
    list(dataset.as_numpy_iterator())
    return running["most"]


def test_autotune_with_the_autotuner_off_runs_one_call_per_thread_of_the_pool():
    # tf.data's pool has a thread per core unless told otherwise: what GPU_PARALLELISM
    # relies on.
    assert most_calls_at_once(6) == 6
