"""Train and evaluate a CIFAR-10 ResNet with tf.estimator on CPU, GPUs or a TF_CONFIG cluster.

    python -m cifar10_estimator.main --data-dir DATA --job-dir JOB --num-gpus 0

The run, top to bottom: flags (parsed and checked by `flags` before TensorFlow builds a
graph; a user error ends with one line on stderr and exit status 2) -> the job dir, held
by the process that writes its checkpoints -> the data files this process reads, each
read once and checked (one line and exit status 1 when one is damaged) -> HParams (saved
to job-dir/hparams.json) -> RunConfig -> tf.estimator.train_and_evaluate -> the one
test evaluation and the closing report.
"""

import contextlib
import os
import random
import sys

from cifar10_estimator import flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.training import precision
from cifar10_estimator import report
from cifar10_estimator.training import schedule
from cifar10_estimator.training import job_dir_lock
from cifar10_estimator.cli import invoked_program, run_command, stderr_dropped_on_user_error
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.distributed import cluster
from cifar10_estimator.errors import Cifar10EstimatorError


def main(argv):
    parser, args = flags.parse(argv)
    if args.log_device_placement:
        # Placements are logged by TensorFlow's C++ runtime at INFO level.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    task = cluster.task_from_tf_config(os.environ.get("TF_CONFIG"))
    with stderr_dropped_on_user_error():
        flags.validate(args, task)
    with hold_job_dir(args.job_dir, task):
        with stderr_dropped_on_user_error():
            # Before any graph: the reader would fail only inside training, after the
            # first checkpoint, or read a file cut short without a word.
            for subset in flags.subsets_read(args, task):
                tfrecord_format.check_tfrecords(args.data_dir, subset)
        if args.precision == precision.AUTO:
            args.precision = choose_precision(args.num_gpus, task)
        train_and_evaluate(args, flags.hparams_of(parser, args, task), task)


def hold_job_dir(job_dir, task=None):
    """The job dir's lock for the process that writes its checkpoints (see job_dir_lock).

    The other tasks of a cluster (workers, ps, the evaluator) share the directory with
    their chief, so they take nothing.
    """
    if task and not task.writes_checkpoints:
        return contextlib.nullcontext()
    return job_dir_lock.JobDirLock(job_dir)


def choose_precision(num_gpus, task=None):
    """--precision auto: the precision this process trains in, logged in one line.

    The ps and the evaluator train nothing (evaluation computes in float32) and take
    fp32 without measuring.
    """
    if task and not task.is_trainer:
        return "fp32"
    import tensorflow as tf
    from cifar10_estimator.machine import hardware, precision_speed
    name, line = precision_speed.fastest_precision(
        num_gpus, hardware.cpu_flags(), hardware.onednn_enabled())
    tf.compat.v1.logging.info(line)
    return name


def make_run_config(args, task=None):
    """RunConfig from the flags; the cluster, if any, comes from TF_CONFIG.

    Args:
      args: the parsed flags.
      task: the cluster.ClusterTask this process runs (from TF_CONFIG), or None.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2
    session_config = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=args.log_device_placement,
        intra_op_parallelism_threads=args.num_intra_threads,
        inter_op_parallelism_threads=args.num_inter_threads,
        gpu_options=tf.compat.v1.GPUOptions(force_gpu_compatible=True))
    if args.num_gpus == 0:
        session_config.device_count["CPU"] = args.num_cpu_towers
    filters = cluster.device_filters(task) if task else None
    if filters:
        # What tf.estimator's own distributed session config has: these filters and
        # one pass of graph rewrites.
        session_config.device_filters.extend(filters)
        session_config.graph_options.rewrite_options.meta_optimizer_iterations = (
            rewriter_config_pb2.RewriterConfig.ONE)
    checkpoint_schedule = (
        {"save_checkpoints_steps": args.save_checkpoints_steps}
        if args.save_checkpoints_steps else {"save_checkpoints_secs": 600})
    return tf.estimator.RunConfig(
        model_dir=args.job_dir, session_config=session_config,
        tf_random_seed=graph_seed(args.seed, task), **checkpoint_schedule)


def graph_seed(seed, task=None):
    """The graph-level seed of this process for --seed: the seed plus the trainer's rank.

    The rank (chief 0, worker i: i + 1) keeps the workers of a cluster from drawing the
    same batches in the same order; the ps and evaluator draw nothing that matters.
    """
    if seed is None:
        return None
    if task is None or task.task_type != cluster.WORKER:
        return seed
    return seed + 1 + task.task_index


def make_train_input_fn(args, num_towers):
    """The training input_fn from the flags: TFRecords, or synthetic batches."""
    from cifar10_estimator import input_fn
    if args.use_synthetic_data:
        return input_fn.make_synthetic_input_fn(num_towers, args.train_batch_size)
    return input_fn.make_tfrecord_input_fn(args.data_dir, "train", num_towers,
                                           args.train_batch_size, args.use_distortion_for_training)


def make_eval_input_fn(args, num_towers, subset):
    """The input_fn evaluating `subset` ('validation' or 'eval'), or synthetic batches."""
    from cifar10_estimator import input_fn
    if args.use_synthetic_data:
        return input_fn.make_synthetic_input_fn(num_towers, args.eval_batch_size)
    return input_fn.make_tfrecord_input_fn(args.data_dir, subset, num_towers,
                                           args.eval_batch_size, False)


def _prepare_cluster_task(run_config, task, ps_timeout_secs):
    """For a chief or worker of a TF_CONFIG cluster: start its server and the ps watchdog."""
    if not (task and task.is_trainer):
        return
    if run_config.master:  # empty when the chief is the cluster's only task: no server
        cluster.start_trainer_server(run_config)
    if task.ps_addresses:
        cluster.ParameterServerWatchdog(
            task.ps_addresses, ps_timeout_secs, _exit_with_error).start()


def train_and_evaluate(args, hparams, task=None):
    """Build the Estimator from validated flags and run tf.estimator.train_and_evaluate.

    An evaluator task runs evaluation.evaluate_until_final instead, which evaluates the
    final checkpoint as soon as it is written; where this process ran the final
    evaluation, it then evaluates that checkpoint once on the test set.

    Args:
      args: the validated flags.
      hparams: the run's HParams (flags.hparams_of).
      task: the cluster.ClusterTask this process runs (from TF_CONFIG), or None.

    Returns:
      The final evaluation metrics (dict) where this task ran the final evaluation, else None.
    """
    flags.quiet_tensorflow_logs()
    import tensorflow as tf
    from cifar10_estimator import model_fn
    from cifar10_estimator.training import progress as run_progress

    run_config = make_run_config(args, task)
    if run_config.tf_random_seed is not None:
        # The Keras layers under tf.compat.v1.layers draw their initializers' seeds from
        # Python's random module, not from the graph seed.
        random.seed(run_config.tf_random_seed)
    if not task or task.is_trainer:
        log_precision_speed(precision.policy(args.precision), args.num_gpus)
    if run_config.is_chief:
        job_hparams.save(args.job_dir, hparams)
    log_schedule(hparams)
    layout = model_fn.TowerLayout.for_devices(
        args.num_gpus, args.num_cpu_towers, args.variable_strategy)
    last_step = schedule.last_step(hparams)
    # One per process: it spans the training sessions and the evaluations between them.
    progress = run_progress.RunProgress(last_step, hparams.examples_per_global_step)
    estimator = tf.estimator.Estimator(
        model_fn=model_fn.make_model_fn(layout, hparams, progress), config=run_config)
    _prepare_cluster_task(run_config, task, args.ps_timeout_secs)
    train_spec = tf.estimator.TrainSpec(
        make_train_input_fn(args, layout.num_towers), max_steps=last_step,
        saving_listeners=[run_progress.ProgressCheckpointListener(progress)])
    eval_spec = make_eval_spec(args, layout.num_towers)
    if task and task.task_type == cluster.EVALUATOR:
        from cifar10_estimator import evaluation
        metrics = evaluation.evaluate_until_final(estimator, eval_spec, last_step)
    else:
        result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
        metrics = result[0] if result else None
    if metrics is None and not task:
        # Training was already done, so train_and_evaluate skipped the final evaluation
        # too: the run that trained may have been killed before it evaluated.
        metrics = evaluate_and_export_latest(estimator, eval_spec)
    if metrics:
        summary = ", ".join("%s = %s" % (key, metrics[key]) for key in sorted(metrics))
        tf.compat.v1.logging.info("Final evaluation: %s", summary)
        report_on_test(estimator, args, hparams, layout.num_towers, eval_spec, metrics)
    return metrics


def log_precision_speed(precision_policy, num_gpus):
    """On the CPU, say in one line how a mixed precision's speed compares with fp32's here:
    a warning where it is slower (measured once per machine, see precision_speed)."""
    if not precision_policy.is_mixed or num_gpus:
        return
    import tensorflow as tf
    from cifar10_estimator.machine import precision_speed
    speeds = precision_speed.measured_speeds(precision_policy)
    warning = precision_speed.slower_than_fp32_warning(precision_policy, speeds)
    if warning:
        tf.compat.v1.logging.warning(warning)
    else:
        tf.compat.v1.logging.info(
            "--precision %s trains at %.2fx the speed of fp32 on this machine (measured %s)",
            precision_policy.name, speeds[precision_policy.name] / speeds["fp32"],
            speeds.get("measured", "earlier"))


def log_schedule(hparams):
    """Log the run's length and learning rate once; warn if the rate never drops."""
    import tensorflow as tf
    tf.compat.v1.logging.info("Recipe %s. %s", hparams.recipe, schedule.describe(hparams))
    warning = schedule.never_drops_warning(hparams)
    if warning:
        tf.compat.v1.logging.warning(warning)


def make_eval_spec(args, num_towers):
    """The EvalSpec of the evaluations during training, with its exporters.

    On the validation set they are a named evaluation (job-dir/eval_validation/) and
    export/best keeps the model of the highest validation accuracy; on the test set
    (--eval-subset eval, or data without a validation set) they go to job-dir/eval/ as
    in the original, and no best export is kept: never select a model on test data.
    """
    import tensorflow as tf
    from cifar10_estimator.serving import export
    subset = flags.periodic_eval_subset(args)
    if subset == "validation":
        name = "validation"
        exporters = [export.latest_exporter(), export.best_exporter(name)]
    else:
        name, exporters = None, [export.latest_exporter()]
        tf.compat.v1.logging.info(
            "Evaluating on the test set during training (%s); no best export is kept, as "
            "choosing a model on test data would make its test accuracy optimistic.",
            "--eval-subset eval" if args.eval_subset == "eval"
            else "%s has no validation set" % args.data_dir)
    return tf.estimator.EvalSpec(
        make_eval_input_fn(args, num_towers, subset), steps=flags.eval_steps(args, subset),
        name=name, start_delay_secs=0, throttle_secs=args.eval_every_secs, exporters=exporters)


def report_on_test(estimator, args, hparams, num_towers, eval_spec, final_metrics):
    """Evaluate the final checkpoint once on the test set; log, save and summarise it.

    Args:
      hparams: the run's HParams (which weights are evaluated).
      final_metrics: the final evaluation of eval_spec, which already is the test
        evaluation when eval_spec evaluates the test set.
    """
    import tensorflow as tf
    from cifar10_estimator.training import weight_averaging
    checkpoint = estimator.latest_checkpoint()
    steps = flags.eval_steps(args, "eval")
    if eval_spec.name is None:
        metrics, validation_metrics = final_metrics, None
    else:
        metrics = estimator.evaluate(
            make_eval_input_fn(args, num_towers, "eval"), steps=steps,
            checkpoint_path=checkpoint, name=report.TEST_EVAL_NAME)
        validation_metrics = final_metrics
    results = report.test_results(
        metrics, steps * args.eval_batch_size, checkpoint,
        weight_averaging.evaluated_weights(hparams.moving_average_decay, checkpoint))
    report.write_test_results(args.job_dir, results)
    tf.compat.v1.logging.info(report.test_accuracy_line(results))
    print(report.summary(args.job_dir, None if args.use_synthetic_data else args.data_dir,
                               validation_metrics, results), flush=True)


def evaluate_and_export_latest(estimator, eval_spec):
    """Evaluate the latest checkpoint and run the exporters on it, as a final evaluation.

    Returns:
      The metrics (dict), or None where there is no checkpoint.
    """
    import tensorflow as tf
    from cifar10_estimator import evaluation
    checkpoint = estimator.latest_checkpoint()
    if checkpoint is None:
        return None
    tf.compat.v1.logging.info("Evaluating %s, the final checkpoint", checkpoint)
    return evaluation.evaluate_and_export(estimator, eval_spec, checkpoint,
                                         is_the_final_export=True)


def _exit_with_error(message):
    # Called by the ps watchdog while the main thread may wait inside TensorFlow's C++
    # runtime, which no Python exception interrupts: end the process from here.
    print("%s: error: %s" % (invoked_program(), message), file=sys.stderr, flush=True)
    os._exit(Cifar10EstimatorError.exit_status)


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
