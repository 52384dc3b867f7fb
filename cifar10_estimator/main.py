"""Train and evaluate a CIFAR-10 ResNet with tf.estimator on CPU, GPUs or a TF_CONFIG cluster.

    python -m cifar10_estimator.main --data-dir DATA --job-dir JOB --num-gpus 0

Flags keep the original tutorial's names and defaults. Everything is validated before
TensorFlow builds a graph; a user error ends with one line on stderr and exit status 2.
"""

import argparse
import os
import sys

from cifar10_estimator.distributed import cluster
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import tfrecord_format
from cifar10_estimator.cli import (ArgumentParser, invoked_program, non_negative_int, parse_bool,
                                   positive_float, positive_int, quiet_tensorflow_logs, run_command,
                                   stderr_dropped_on_user_error)
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.serving import final_report

DEFAULT_TRAIN_STEPS = 80000


def build_parser():
    parser = ArgumentParser(
        description="Train a ResNet on CIFAR-10 with tf.estimator.train_and_evaluate: "
                    "one tower per GPU (or per logical CPU device), gradients averaged.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = parser.add_argument_group("data and output")
    data.add_argument("--data-dir", help="Directory with train/eval TFRecords written by "
                      "python -m cifar10_estimator.generate_tfrecords. "
                      "Not needed with --use-synthetic-data.")
    data.add_argument("--job-dir", required=True,
                      help="Directory for checkpoints, TensorBoard events and eval results "
                           "(job-dir/eval). Rerunning with the same job-dir resumes.")
    data.add_argument("--use-synthetic-data", action="store_true",
                      help="Train on one constant random batch held in memory instead of "
                           "TFRecords: no data files, no decoding; the throughput ceiling. "
                           "Evaluation then runs a single batch.")
    data.add_argument("--use-distortion-for-training", type=parse_bool, default=True,
                      metavar="BOOL", help="Pad, random-crop and flip training images "
                                           "(true/false).")

    devices = parser.add_argument_group("devices")
    devices.add_argument("--num-gpus", type=non_negative_int, default=1,
                         help="GPUs to use, one tower each; 0 trains on the CPU.")
    devices.add_argument("--num-cpu-towers", type=positive_int, default=1, metavar="K",
                         help="With --num-gpus 0: K towers on K logical CPU devices "
                              "(the multi-tower code path on any machine).")
    devices.add_argument("--variable-strategy", choices=["CPU", "GPU"], default="CPU",
                         help="Where variables live: CPU, or spread over the GPUs by size.")
    devices.add_argument("--data-format", choices=["channels_first", "channels_last"],
                         default=None, help="Layout inside the model; default channels_first "
                                            "on GPUs, channels_last on the CPU.")
    devices.add_argument("--precision", choices=job_hparams.PRECISIONS,
                         default=job_hparams.DEFAULTS.precision,
                         help="What training computes in. fp32: float32 throughout (the "
                              "original). bf16: mixed bfloat16, for CPUs with bfloat16 "
                              "instructions (avx512_bf16, amx_bf16) and GPUs from Ampere on. "
                              "fp16: mixed float16 with dynamic loss scaling, for GPUs. "
                              "Variables stay float32; evaluation and exports compute in "
                              "float32.")
    devices.add_argument("--num-intra-threads", type=non_negative_int, default=0,
                         help="Threads inside one op; 0 lets TensorFlow choose.")
    devices.add_argument("--num-inter-threads", type=non_negative_int, default=0,
                         help="Ops run in parallel; 0 lets TensorFlow choose.")
    devices.add_argument("--log-device-placement", action="store_true",
                         help="Log the device of every op.")

    model = parser.add_argument_group("model and optimisation")
    model.add_argument("--num-layers", type=int, default=job_hparams.DEFAULTS.num_layers,
                       help="ResNet depth, 6n+2 (20, 32, 44, 56, 110, ...).")
    length = model.add_mutually_exclusive_group()
    length.add_argument("--train-steps", type=positive_int, default=None,
                        help="Global step at which training stops (default: the tutorial's "
                             "%d). The learning rate drops at epochs 82, 123 and 300 "
                             "whatever this is." % DEFAULT_TRAIN_STEPS)
    length.add_argument("--train-epochs", type=positive_float, default=None, metavar="E",
                        help="Train E epochs of the training set (at the global batch) and "
                             "place the learning-rate drops in proportion to the run (see "
                             "--learning-rate-drops). Use this for runs shorter than the "
                             "tutorial's 256 epochs.")
    model.add_argument("--learning-rate-drops", choices=sorted(job_hparams.PROPORTIONAL_SCHEDULES),
                       default=job_hparams.DEFAULTS.learning_rate_drops,
                       help="With --train-epochs: where the rate drops. paper: /10 at 50%% "
                            "and 75%% of the run (He et al. 2016); tutorial: /10 at 32%% and "
                            "48%% (the tutorial's epochs 82 and 123 of 256).")
    model.add_argument("--train-batch-size", type=positive_int,
                       default=job_hparams.DEFAULTS.train_batch_size,
                       help="Batch of one worker, split evenly over its towers.")
    model.add_argument("--eval-batch-size", type=positive_int, default=100,
                       help="Eval batch, split over the towers; must divide the validation "
                            "and test sets.")
    model.add_argument("--momentum", type=float, default=job_hparams.DEFAULTS.momentum,
                       help="Momentum of the optimizer.")
    model.add_argument("--weight-decay", type=float, default=job_hparams.DEFAULTS.weight_decay,
                       help="L2 weight decay factor.")
    model.add_argument("--learning-rate", type=positive_float,
                       default=job_hparams.DEFAULTS.learning_rate,
                       help="Initial learning rate; x0.1, x0.01, x0.002 from epochs 82, 123, "
                            "300 (with --train-epochs: see --learning-rate-drops).")
    model.add_argument("--learning-rate-scaling", choices=job_hparams.LEARNING_RATE_SCALINGS,
                       default=job_hparams.DEFAULTS.learning_rate_scaling,
                       help="none: --learning-rate as given, whatever the global batch (the "
                            "original). linear: --learning-rate x global batch / %d, the "
                            "global batch being --train-batch-size x workers with --sync "
                            "(Goyal et al. 2017)."
                            % job_hparams.LEARNING_RATE_REFERENCE_BATCH_SIZE)
    model.add_argument("--batch-norm-decay", type=float,
                       default=job_hparams.DEFAULTS.batch_norm_decay,
                       help="Decay of the batch-norm moving averages.")
    model.add_argument("--batch-norm-epsilon", type=positive_float,
                       default=job_hparams.DEFAULTS.batch_norm_epsilon,
                       help="Epsilon of batch norm.")
    model.add_argument("--sync", action="store_true",
                       help="Distributed only: synchronous updates with SyncReplicasOptimizer.")

    schedule = parser.add_argument_group("checkpoints and evaluation")
    schedule.add_argument("--save-checkpoints-steps", type=positive_int, default=None, metavar="N",
                          help="Checkpoint every N steps (default: every 600 seconds). "
                               "A checkpoint is always written at the last step.")
    schedule.add_argument("--eval-every-secs", type=positive_int, default=600, metavar="S",
                          help="Evaluate a new checkpoint at most every S seconds; the final "
                               "checkpoint is always evaluated, as soon as it is written.")
    schedule.add_argument("--eval-subset", choices=["validation", "eval"], default="validation",
                          help="What the evaluations during training use. validation (into "
                               "job-dir/eval_validation/) picks export/best; eval is the test "
                               "set, as the original did: then no best export is kept, since "
                               "choosing a model on test data makes its test accuracy "
                               "optimistic. Either way the final checkpoint is evaluated once "
                               "on the test set (job-dir/eval_test/, job-dir/%s)."
                               % final_report.TEST_RESULTS_FILENAME)

    distributed = parser.add_argument_group(
        "cluster", "With TF_CONFIG set, this command runs as the ps, chief, worker or evaluator "
                   "task it names (see cifar10_estimator/cluster.py).")
    distributed.add_argument("--ps-timeout-secs", type=positive_int, default=600, metavar="S",
                             help="Chief and workers exit with an error once a parameter server "
                                  "has been unreachable for S seconds, at start or during "
                                  "training (TensorFlow alone would wait forever).")
    return parser


def validate_flags(args, task=None):
    """Check flags, their combinations, the GPUs and the data files. Raises UsageError.

    Args:
      args: the parsed flags.
      task: the cluster.ClusterTask this process runs, if any. A ps task needs
        neither the GPUs nor the data, so only the flags themselves are checked.
    """
    builds_towers = task is None or task.task_type != cluster.PS
    _quiet_tensorflow_logs()
    from cifar10_estimator import cifar10_model, precision
    try:
        cifar10_model.num_units_per_stage(args.num_layers)
    except ValueError as error:
        raise UsageError("--num-layers: %s" % error)
    if args.num_gpus > 0 and builds_towers:
        _check_gpus_present(args.num_gpus)
    if args.num_gpus > 0 and args.num_cpu_towers != 1:
        raise UsageError("--num-cpu-towers applies only with --num-gpus 0")
    if args.num_gpus == 0 and args.variable_strategy == "GPU":
        raise UsageError("--variable-strategy GPU needs GPUs; with --num-gpus 0 use "
                         "--variable-strategy CPU")
    if (args.num_gpus == 0 and args.data_format == "channels_first"
            and not precision.onednn_enabled()):
        raise UsageError("--data-format channels_first on the CPU needs TensorFlow's oneDNN "
                         "kernels, which are off here: set TF_ENABLE_ONEDNN_OPTS=1, or use "
                         "channels_last (TensorFlow's other CPU kernels are channels_last only)")
    if builds_towers:
        _check_precision_supported(args.precision, args.num_gpus)
    num_towers = args.num_gpus or args.num_cpu_towers
    for flag in ("train-batch-size", "eval-batch-size"):
        batch_size = getattr(args, flag.replace("-", "_"))
        if batch_size % num_towers != 0:
            raise UsageError("--%s %d must be divisible by the number of towers (%d)"
                             % (flag, batch_size, num_towers))
    if not args.use_synthetic_data and builds_towers:
        _validate_data_dir(args.data_dir)
        for subset in dict.fromkeys([periodic_eval_subset(args), "eval"]):
            eval_steps(args, subset)


def _validate_data_dir(data_dir):
    from cifar10_estimator import cifar10
    if not data_dir:
        raise UsageError("--data-dir is required (or pass --use-synthetic-data); write the "
                         "TFRecords with: " + tfrecord_format.generate_command("DIR"))
    try:
        cifar10.check_tfrecords_exist(data_dir, ["train", "eval"])
    except Cifar10EstimatorError as error:
        raise UsageError(str(error))


def periodic_eval_subset(args):
    """The subset evaluated during training: --eval-subset, or the test set ('eval') when
    the data has no validation set (converted with --validation-examples 0)."""
    if (args.eval_subset == "validation" and not args.use_synthetic_data
            and not tfrecord_format.has_subset(args.data_dir, "validation")):
        return "eval"
    return args.eval_subset


def eval_steps(args, subset):
    """Steps that evaluate each example of `subset` once (one batch with synthetic data)."""
    if args.use_synthetic_data:
        return 1
    count = tfrecord_format.num_examples(subset, args.data_dir)
    if count % args.eval_batch_size != 0:
        raise UsageError("--eval-batch-size %d does not divide the %d %s examples; every "
                         "example is evaluated exactly once, so pick a divisor of %d"
                         % (args.eval_batch_size, count, subset, count))
    return count // args.eval_batch_size


def _quiet_tensorflow_logs():
    # The training log is TensorFlow's Python INFO lines; keep C++ warnings and errors.
    quiet_tensorflow_logs("1", "INFO")


def _check_precision_supported(precision_name, num_gpus):
    if precision_name == "fp32":
        return
    from cifar10_estimator import precision
    reason = precision.unsupported_reason(
        precision_name, num_gpus, precision.cpu_flags(), precision.onednn_enabled(),
        _gpu_compute_capabilities(num_gpus))
    if reason:
        raise UsageError(reason)


def _gpu_compute_capabilities(num_gpus):
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")[:num_gpus]
    return [tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0))
            for gpu in gpus]


def _check_gpus_present(num_gpus):
    _quiet_tensorflow_logs()
    import tensorflow as tf
    available = len(tf.config.list_physical_devices("GPU"))
    if num_gpus > available:
        raise UsageError("--num-gpus %d asked, but %d GPU%s visible to TensorFlow; use "
                         "--num-gpus %d (0 trains on the CPU)"
                         % (num_gpus, available, " is" if available == 1 else "s are", available))


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
        model_dir=args.job_dir, session_config=session_config, **checkpoint_schedule)


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


def train_and_evaluate(args, task=None):
    """Build the Estimator from validated flags and run tf.estimator.train_and_evaluate.

    An evaluator task runs evaluator.evaluate_until_final instead, which evaluates the
    final checkpoint as soon as it is written; where this process ran the final
    evaluation, it then evaluates that checkpoint once on the test set.

    Args:
      args: the validated flags.
      task: the cluster.ClusterTask this process runs (from TF_CONFIG), or None.

    Returns:
      The final evaluation metrics (dict) where this task ran the final evaluation, else None.
    """
    _quiet_tensorflow_logs()
    import tensorflow as tf
    from cifar10_estimator import model_fn

    run_config = make_run_config(args, task)
    layout = model_fn.TowerLayout.for_devices(
        args.num_gpus, args.num_cpu_towers, args.variable_strategy)
    data_format = args.data_format or ("channels_first" if args.num_gpus else "channels_last")
    hparams = job_hparams.HParams.from_flags(
        args, data_format=data_format, num_workers=task.num_trainers if task else 1,
        num_train_examples=tfrecord_format.num_examples(
            "train", None if args.use_synthetic_data else args.data_dir))
    if run_config.is_chief:
        job_hparams.save(args.job_dir, hparams)
    train_steps = train_steps_of(args, hparams)
    log_schedule(hparams, train_steps, args.train_steps is not None)

    estimator = tf.estimator.Estimator(
        model_fn=model_fn.make_model_fn(layout, hparams), config=run_config)
    _prepare_cluster_task(run_config, task, args.ps_timeout_secs)
    train_spec = tf.estimator.TrainSpec(
        make_train_input_fn(args, layout.num_towers), max_steps=train_steps)
    eval_spec = make_eval_spec(args, layout.num_towers)
    if task and task.task_type == cluster.EVALUATOR:
        from cifar10_estimator.distributed import evaluator
        metrics = evaluator.evaluate_until_final(estimator, eval_spec, train_steps)
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
        report_on_test(estimator, args, layout.num_towers, eval_spec, metrics)
    return metrics


def train_steps_of(args, hparams):
    """The global step to stop at: --train-steps, --train-epochs' steps, or the default."""
    from cifar10_estimator import model_fn
    if args.train_steps is not None:
        return args.train_steps
    if hparams.train_epochs is not None:
        return model_fn.train_steps_for_epochs(hparams)
    return DEFAULT_TRAIN_STEPS


def log_schedule(hparams, train_steps, steps_given):
    """Log the run's length and learning-rate drops once; warn if the rate never drops."""
    import tensorflow as tf
    from cifar10_estimator import model_fn
    boundaries, factors = model_fn.learning_rate_drops(hparams)
    drops = ", ".join("x%g after step %d" % (factor, boundary)
                      for boundary, factor in zip(boundaries, factors[1:])
                      if boundary < train_steps)
    tf.compat.v1.logging.info(
        "Training to step %d (%.1f epochs of %d examples at %d per step); learning rate %s, %s",
        train_steps, train_steps / model_fn.steps_per_epoch(hparams), hparams.num_train_examples,
        hparams.examples_per_global_step, learning_rate_text(hparams), drops or "never dropped")
    if steps_given and train_steps <= boundaries[0]:
        tf.compat.v1.logging.warning(
            "--train-steps %d ends before the first learning-rate drop (after step %d, epoch "
            "%d): the rate stays %g for the whole run. To fit the drops into a shorter run, "
            "give --train-epochs E instead of --train-steps.", train_steps, boundaries[0],
            model_fn.LEARNING_RATE_BOUNDARY_EPOCHS[0], model_fn.effective_learning_rate(hparams))


def learning_rate_text(hparams):
    """The base learning rate for the log, with its arithmetic when it was scaled.

    E.g. '0.1', or '0.2 (0.1 x 256/128, --learning-rate-scaling linear)'.
    """
    from cifar10_estimator import model_fn
    rate = model_fn.effective_learning_rate(hparams)
    if hparams.learning_rate_scaling == "none":
        return "%g" % rate
    return "%g (%g x %d/%d, --learning-rate-scaling %s)" % (
        rate, hparams.learning_rate, hparams.examples_per_global_step,
        job_hparams.LEARNING_RATE_REFERENCE_BATCH_SIZE, hparams.learning_rate_scaling)


def make_eval_spec(args, num_towers):
    """The EvalSpec of the evaluations during training, with its exporters.

    On the validation set they are a named evaluation (job-dir/eval_validation/) and
    export/best keeps the model of the highest validation accuracy; on the test set
    (--eval-subset eval, or data without a validation set) they go to job-dir/eval/ as
    in the original, and no best export is kept: never select a model on test data.
    """
    import tensorflow as tf
    from cifar10_estimator.serving import export
    subset = periodic_eval_subset(args)
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
        make_eval_input_fn(args, num_towers, subset), steps=eval_steps(args, subset), name=name,
        start_delay_secs=0, throttle_secs=args.eval_every_secs, exporters=exporters)


def report_on_test(estimator, args, num_towers, eval_spec, final_metrics):
    """Evaluate the final checkpoint once on the test set; log, save and summarise it.

    Args:
      final_metrics: the final evaluation of eval_spec, which already is the test
        evaluation when eval_spec evaluates the test set.
    """
    import tensorflow as tf
    checkpoint = estimator.latest_checkpoint()
    steps = eval_steps(args, "eval")
    if eval_spec.name is None:
        metrics, validation_metrics = final_metrics, None
    else:
        metrics = estimator.evaluate(
            make_eval_input_fn(args, num_towers, "eval"), steps=steps,
            checkpoint_path=checkpoint, name=final_report.TEST_EVAL_NAME)
        validation_metrics = final_metrics
    results = final_report.test_results(metrics, steps * args.eval_batch_size, checkpoint)
    final_report.write_test_results(args.job_dir, results)
    tf.compat.v1.logging.info(final_report.test_accuracy_line(results))
    print(final_report.summary(args.job_dir, None if args.use_synthetic_data else args.data_dir,
                               validation_metrics, results), flush=True)


def evaluate_and_export_latest(estimator, eval_spec):
    """Evaluate the latest checkpoint and run the exporters on it, as a final evaluation.

    Returns:
      The metrics (dict), or None where there is no checkpoint.
    """
    import tensorflow as tf
    from cifar10_estimator.distributed import evaluator
    checkpoint = estimator.latest_checkpoint()
    if checkpoint is None:
        return None
    tf.compat.v1.logging.info("Evaluating %s, the final checkpoint", checkpoint)
    return evaluator.evaluate_and_export(estimator, eval_spec, checkpoint,
                                         is_the_final_export=True)


def _exit_with_error(message):
    # Called by the ps watchdog while the main thread may wait inside TensorFlow's C++
    # runtime, which no Python exception interrupts: end the process from here.
    print("%s: error: %s" % (invoked_program(), message), file=sys.stderr, flush=True)
    os._exit(Cifar10EstimatorError.exit_status)


def main(argv):
    args = build_parser().parse_args(argv)
    if args.log_device_placement:
        # Placements are logged by TensorFlow's C++ runtime at INFO level.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    task = cluster.task_from_tf_config(os.environ.get("TF_CONFIG"))
    with stderr_dropped_on_user_error():
        validate_flags(args, task)
    train_and_evaluate(args, task)


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
