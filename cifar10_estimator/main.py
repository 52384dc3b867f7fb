"""Train and evaluate a CIFAR-10 ResNet with tf.estimator on CPU, GPUs or a TF_CONFIG cluster.

    python -m cifar10_estimator.main --data-dir DATA --job-dir JOB --num-gpus 0

The run, top to bottom: flags (parsed and checked by `flags` before TensorFlow builds a
graph; a user error ends with one line on stderr and exit status 2) -> the job dir, held
by the process that writes its checkpoints -> the data files this process reads, each
read once and checked (one line and exit status 1 when one is damaged) -> the run's
Settings, resolved once -> RunConfig -> on a rerun, the job's newest checkpoint that reads
(damaged ones set aside) and the run's variables checked against it, before anything is
written -> the HParams of a run that trains added to job-dir/hparams.json ->
tf.estimator.train_and_evaluate -> the one test evaluation and the closing report.
SIGTERM and Ctrl-C end it after the step in flight with that step saved (exit status 143,
130; run.stop_signals); a diverging loss or a full job dir ends it with one line
(run.faults). The console shows what a person watches, and job-dir/train.log
gets TensorFlow's whole log (run.console).
"""

import contextlib
import dataclasses
import math
import os
import random
import sys

from cifar10_estimator import files
from cifar10_estimator import flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import report
from cifar10_estimator.run import evaluation_dirs
from cifar10_estimator.run import job_dir_lock
from cifar10_estimator.settings import precision
from cifar10_estimator.settings import schedule
from cifar10_estimator.cli.command import (invoked_program, run_command,
                                           stderr_dropped_on_user_error, stderr_held_for_the_log)
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.distributed import cluster
from cifar10_estimator.distributed import evaluator_wait
from cifar10_estimator.errors import Cifar10EstimatorError


def main(argv):
    settings = flags.parse(argv)
    if settings.log_device_placement:
        # Placements are logged by TensorFlow's C++ runtime at INFO level.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    task = cluster.task_from_tf_config(os.environ.get("TF_CONFIG"))
    with stderr_held_for_the_log() as startup_output:
        # TensorFlow's import notices are dropped with a user error's one line, else
        # they go to the log file.
        flags.quiet_tensorflow_logs()
        flags.validate(settings, task)
        # Loaded here, once the flags are good: what its C++ side prints at start-up
        # is held with the rest for the log file.
        import tensorflow  # noqa: F401  lazy: keeps the trainer's --help and flag errors fast
    with disk_faults_named(settings.job_dir), hold_job_dir(settings.job_dir, task), \
            stop_signals_of(task) as signals:
        with stderr_dropped_on_user_error():
            # Before any graph: the reader would fail only inside training, after the
            # first checkpoint, or read a file cut short without a word. Before the log
            # file too: damaged data leaves the job dir as it was.
            for subset in flags.subsets_read(settings, task):
                tfrecord_format.check_tfrecords(settings.data_dir, subset)
        with run_console_of(settings, task, startup_output.text) as run_console:
            train_and_evaluate(flags.resolve(settings, task), task, signals, run_console)


@contextlib.contextmanager
def run_console_of(settings, task, startup_output):
    """The RunConsole of this process (run.console): its log file in the job dir,
    one per task of a cluster; a job dir that is not a local directory gets none."""
    from cifar10_estimator.run import console
    log_path = None
    if not files.is_url(settings.job_dir):
        os.makedirs(settings.job_dir, exist_ok=True)
        log_path = os.path.join(settings.job_dir, console.log_file_name(task))
    with console.RunConsole(log_path, verbose=settings.verbose) as run_console:
        run_console.startup_output(startup_output)
        yield run_console


def stop_signals_of(task=None):
    """The StopSignals this process answers SIGTERM and Ctrl-C with (stop_signals).

    A ps serves variables from TensorFlow's C++ runtime until it is killed and runs no
    Python in between, so it keeps the signals' default action: a SIGTERM ends it at once
    (exit status 143 in a container); restarted, it comes back empty, and the chief's
    session restores its last checkpoint into it (docs/distributed.md).
    """
    from cifar10_estimator.run import stop_signals
    if task and task.task_type == cluster.PS:
        return contextlib.nullcontext()
    return stop_signals.StopSignals(invoked_program())


@contextlib.contextmanager
def disk_faults_named(job_dir):
    """Turn an error of a full or read-only disk under job_dir into its one line."""
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator.run import faults
    try:
        yield
    except (OSError, tf.errors.OpError, Cifar10EstimatorError) as error:
        fault = faults.disk_fault(error, job_dir)
        if fault is None:
            raise
        raise fault from error


def hold_job_dir(job_dir, task=None):
    """The job dir's lock for the process that writes its checkpoints (see job_dir_lock).

    The other tasks of a cluster (workers, ps, the evaluator) share the directory with
    their chief, so they take nothing.
    """
    if task and not task.writes_checkpoints:
        return contextlib.nullcontext()
    return job_dir_lock.JobDirLock(job_dir)


def make_run_config(settings, task=None):
    """RunConfig from the settings; the cluster, if any, comes from TF_CONFIG. The session
    computes on GPUs 0..N-1 of those visible, their memory taken as it grows (gpu_devices).

    Args:
      settings: the run's flags.Settings.
      task: the cluster.ClusterTask this process runs (from TF_CONFIG), or None.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from tensorflow.core.protobuf import rewriter_config_pb2
    from cifar10_estimator.machine import gpu_devices
    session_config = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=settings.log_device_placement,
        intra_op_parallelism_threads=settings.num_intra_threads,
        inter_op_parallelism_threads=settings.num_inter_threads)
    gpu_devices.take_gpus(session_config, num_gpus_of_this_process(settings, task))
    if settings.num_gpus == 0:
        session_config.device_count["CPU"] = settings.num_cpu_towers
    filters = cluster.device_filters(task) if task else None
    if filters:
        # What tf.estimator's own distributed session config has: these filters and
        # one pass of graph rewrites.
        session_config.device_filters.extend(filters)
        session_config.graph_options.rewrite_options.meta_optimizer_iterations = (
            rewriter_config_pb2.RewriterConfig.ONE)
    checkpoint_schedule = (
        {"save_checkpoints_steps": settings.save_checkpoints_steps}
        if settings.save_checkpoints_steps else {"save_checkpoints_secs": 600})
    return tf.estimator.RunConfig(
        model_dir=settings.job_dir, session_config=session_config,
        tf_random_seed=graph_seed(settings.hparams.seed, task), **checkpoint_schedule)


def num_gpus_of_this_process(settings, task=None):
    """GPUs this process computes on: --num-gpus, none on a ps, which only serves variables."""
    return settings.num_gpus if not task or task.builds_towers else 0


def graph_seed(seed, task=None):
    """The graph-level seed of this process for --seed: the seed plus the trainer's rank.

    The rank keeps the workers of a cluster from drawing the same starting values; the
    ps and evaluator draw nothing that matters.
    """
    if seed is None:
        return None
    return seed + trainer_rank(task)


def trainer_rank(task=None):
    """The rank of this process among a cluster's trainers: chief 0, worker i: i + 1.

    Each trainer draws a stream of training batches of its own (input_fn)."""
    if task is None or task.task_type != cluster.WORKER:
        return 0
    return 1 + task.task_index


def starting_values(settings, task=None):
    """{variable name: numpy array} where training starts those variables instead of at
    random (model_fn.make_model_fn): with --patch-pca-init the first convolution's
    kernel; else none.

    They are only computed for a trainer that starts a job: a checkpoint already holds
    the variables, and they are restored from it instead.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    if (not settings.hparams.patch_pca_init or (task and not task.is_trainer)
            or tf.train.latest_checkpoint(settings.job_dir)):
        return {}
    from cifar10_estimator import cifar10, cifar10_model, model_fn
    from cifar10_estimator.training import patch_pca
    images, _ = cifar10.Cifar10DataSet(settings.data_dir, "train").read_all_examples(
        patch_pca.MAX_IMAGES)
    kernel = patch_pca.first_conv_kernel(images, cifar10_model.STAGE_FILTERS[0])
    tf.compat.v1.logging.info(
        "--patch-pca-init: the first convolution starts from the principal directions of "
        "3x3 patches of %d training images", len(images))
    return {"%s/%s" % (model_fn.NETWORK_SCOPE, cifar10_model.FIRST_CONV_KERNEL): kernel}


def make_train_input_fn(settings, task=None):
    """The training input_fn of the settings: TFRecords from where the job's global step
    is (a resumed run continues its stream), or synthetic batches."""
    from cifar10_estimator import cifar10, input_fn
    batch_size = settings.hparams.train_batch_size
    if settings.use_synthetic_data:
        return input_fn.make_synthetic_input_fn(settings.num_towers, batch_size)
    return input_fn.make_training_input_fn(
        settings.data_dir, settings.num_towers, batch_size,
        settings.use_distortion_for_training,
        cifar10.AugmentationConfig.from_hparams(settings.hparams), rank=trainer_rank(task),
        with_example_indices=bool(settings.hparams.skip_learned),
        parallelism=cifar10.input_parallelism(settings.num_gpus))


def make_eval_input_fn(settings, subset):
    """The input_fn evaluating `subset` ('validation' or 'eval'), or synthetic batches, on
    the towers the evaluation batch splits evenly over (flags.Settings.num_eval_towers)."""
    from cifar10_estimator import input_fn
    if settings.use_synthetic_data:
        return input_fn.make_synthetic_input_fn(settings.num_eval_towers,
                                                settings.eval_batch_size)
    return input_fn.make_tfrecord_input_fn(settings.data_dir, subset, settings.num_eval_towers,
                                           settings.eval_batch_size, False)


def _prepare_cluster_task(run_config, task, ps_timeout_secs):
    """For a chief or worker of a TF_CONFIG cluster: start its server and the ps watchdog."""
    if not (task and task.is_trainer):
        return
    if run_config.master:  # empty when the chief is the cluster's only task: no server
        cluster.start_trainer_server(run_config)
    if task.ps_addresses:
        cluster.ParameterServerWatchdog(
            task.ps_addresses, ps_timeout_secs, _exit_with_error).start()


def train_and_evaluate(settings, task=None, signals=None, run_console=None):
    """Build the Estimator from resolved settings and run tf.estimator.train_and_evaluate.

    An evaluator task runs evaluator.evaluate_until_final instead, which
    evaluates the final checkpoint as soon as it is written; where this process ran the
    final evaluation, it then evaluates that checkpoint once on the test set. A chief
    whose cluster lists the evaluator then waits for that (distributed.evaluator_wait).

    Args:
      settings: the run's flags.Settings, validated and resolved (flags.resolve).
      task: the cluster.ClusterTask this process runs (from TF_CONFIG), or None.
      signals: the stop_signals.StopSignals SIGTERM and Ctrl-C are caught with, or None
        (a new one, installed by nobody: no signal stops the run early).
      run_console: the run.console.RunConsole the progress is shown on, or None
        (progress lines are logged).

    Returns:
      The final evaluation metrics (dict) where this task ran the final evaluation, else None.

    Raises:
      errors.RunStopped: a stop signal came; what was reached is saved.
      faults.TrainingDiverged: the training loss became NaN or infinite.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator import model_fn
    from cifar10_estimator.machine import step_speeds
    from cifar10_estimator.run import stop_signals

    signals = signals or stop_signals.StopSignals(invoked_program())
    hparams = settings.hparams
    run_config = make_run_config(settings, task)
    layout = model_fn.TowerLayout.for_devices(
        settings.num_gpus, settings.num_cpu_towers, settings.variable_strategy,
        settings.data_format)
    resumption = check_the_job(settings, task, run_config, layout)
    evaluation_cost = start_job(settings, task, run_config, layout.data_format, resumption)
    last_step = schedule.last_step(hparams)
    progress = make_run_progress(settings, task, run_config, evaluation_cost, run_console)
    estimator = tf.estimator.Estimator(
        model_fn=model_fn.make_model_fn(layout, hparams, progress,
                                        starting_values(settings, task)),
        config=run_config)
    _prepare_cluster_task(run_config, task, settings.ps_timeout_secs)
    train_spec = make_train_spec(settings, task, signals, progress)
    eval_spec = make_eval_spec(settings, signals, progress)
    # A signal during the start-up (the precision probe, the graph) stops the run here.
    signals.raise_if_requested(_stopped_outside_training_text(settings.job_dir, task))
    if task and task.task_type == cluster.EVALUATOR:
        from cifar10_estimator import evaluator
        metrics = evaluator.evaluate_until_final(estimator, eval_spec, last_step, signals)
    else:
        result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
        metrics = result[0] if result else None
    # Where no checkpoint of this process ended the run: a worker's, or a signal that
    # came during an export.
    signals.raise_if_requested(_stopped_outside_training_text(settings.job_dir, task))
    if settings.evaluator_wait_secs and evaluator_wait.chief_waits_for_the_evaluator(task):
        evaluator_wait.wait_for_final_result(settings.job_dir, last_step,
                                             settings.evaluator_wait_secs, signals)
    if metrics is None and not task:
        # Training was already done, so train_and_evaluate skipped the final evaluation
        # too: the run that trained may have been killed before it evaluated.
        metrics = evaluate_and_export_latest(estimator, eval_spec)
    if metrics:
        summary = ", ".join("%s = %s" % (key, metrics[key]) for key in sorted(metrics))
        tf.compat.v1.logging.info("Final evaluation: %s", summary)
        report_on_test(estimator, settings, eval_spec, metrics,
                       training_compute_record(settings, progress))
    if not task and not hparams.skip_learned:
        # What its steps and evaluations took, for the next run's time to go; steps
        # that leave examples out cost less than the same steps without.
        step_speeds.keep(progress.finish())
    return metrics


@dataclasses.dataclass(frozen=True)
class Resumption:
    """Where a rerun carries its job on from: the checkpoint, its global step, and the line
    that says so (and what was set aside)."""

    checkpoint: str
    step: int
    line: str


def check_the_job(settings, task, run_config, layout):
    """Where this process writes the job's checkpoints and the job has one, before
    anything is written: its newest checkpoints that do not read set aside
    (run.damaged_checkpoints), and a rerun whose variables do not fit the newest that
    does refused (run.rerun_check).

    Returns:
      The Resumption of the run, or None where it starts the job or writes no checkpoint.

    Raises:
      UsageError: a flag that shapes the variables differs from the job's.
      Cifar10EstimatorError: the job has checkpoints and none reads.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator import cifar10_model, model_fn
    from cifar10_estimator.run import damaged_checkpoints, rerun_check
    if task and not task.writes_checkpoints:
        return None
    checkpoint, line = damaged_checkpoints.resume_point(settings.job_dir)
    if checkpoint is None:
        return None
    built = rerun_check.built_variables(model_fn.make_model_fn(layout, settings.hparams),
                                        make_train_input_fn(settings, task), run_config)
    rerun_check.check(checkpoint, built, model_fn.NETWORK_SCOPE, settings.hparams,
                      {"num_layers": cifar10_model.num_layers_of})
    step = int(tf.train.load_variable(checkpoint, tf.compat.v1.GraphKeys.GLOBAL_STEP))
    return Resumption(checkpoint, step, line)


def start_job(settings, task, run_config, data_format, resumption=None):
    """What a process does before its graphs: its GPUs in TensorFlow's own context,
    determinism, TF32 and seeds, the plan line (flags.resolve told the precision's, and it
    names the flags changed since the job's last run), the resumption's line, and where
    the chief trains the job this run's hyper-parameters added to the job's, with the
    layout its network computes in (`data_format`).

    Args:
      resumption: the run's Resumption (check_the_job's), or None.

    Returns:
      The cost of an evaluated image against training's precision (evaluated_image_cost).
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator.machine import gpu_devices
    from cifar10_estimator.run import hparams_summary
    from cifar10_estimator.training import mixed_precision
    hparams = settings.hparams
    # Before the job's summary writer starts TensorFlow's context on the GPUs.
    gpu_devices.take_gpus_in_tensorflows_context(num_gpus_of_this_process(settings, task))
    if hparams.deterministic:
        tf.config.experimental.enable_op_determinism()
    # TensorFlow multiplies float32 in TF32 on Ampere and later unless told: fp32 is
    # float32 throughout (--deterministic runs in it), tf32 asks for TF32 by name.
    mixed_precision.apply_tensor_float_32(precision.policy(hparams.precision))
    if run_config.tf_random_seed is not None:
        # The Keras layers under tf.compat.v1.layers draw their initializers' seeds from
        # Python's random module, not from the graph seed.
        random.seed(run_config.tf_random_seed)
    evaluation_cost = 1.0
    if not task or task.is_trainer:
        evaluation_cost = evaluated_image_cost(precision.policy(hparams.precision),
                                               settings.num_gpus, hparams)
    changes = changed_since_the_last_run(settings.job_dir, hparams, data_format, resumption)
    start_step = resumption.step if resumption else 0
    if run_config.is_chief and start_step < schedule.last_step(hparams):
        job_hparams.record_run(settings.job_dir, hparams, data_format, start_step)
        hparams_summary.write(settings.job_dir, job_hparams.record(hparams, data_format),
                              evaluation_dirs.evaluation_dir(report.TEST_EVAL_NAME))
    log_schedule(hparams, changes)
    if resumption:
        from cifar10_estimator.run import console
        console.console_logger().info(resumption.line)
    return evaluation_cost


def changed_since_the_last_run(job_dir, hparams, data_format, resumption):
    """The flags (hparams.changed_flags) a rerun changed since the job's last run that
    trained, [] where it starts the job or the job kept no record."""
    if resumption is None:
        return []
    try:
        previous = job_hparams.load_runs(job_dir)[-1]
    except Cifar10EstimatorError:
        return []
    return job_hparams.changed_flags(previous, hparams, data_format)


def make_run_progress(settings, task, run_config, evaluation_cost, run_console=None):
    """The process's run.time_to_go.RunProgress: one spans the training sessions and
    the evaluations between them. A run on one machine evaluates in the process, and
    scales what it has not measured by what its machine's newest run took
    (machine.step_speeds); a cluster's global step is its workers' together."""
    from cifar10_estimator.machine import step_speeds
    from cifar10_estimator.training import compute
    from cifar10_estimator.run import time_to_go
    hparams = settings.hparams
    return time_to_go.RunProgress(
        schedule.last_step(hparams), hparams.examples_per_global_step,
        phases=compute.image_size_phases(hparams, cifar10_facts.HEIGHT),
        costs=None if task else step_speeds.recorded(),
        evaluations=(time_to_go.EvaluationPlan() if task
                     else evaluation_plan(settings, run_config, evaluation_cost)),
        report=run_console.show_progress if run_console else None)


def evaluation_plan(settings, run_config, view_cost):
    """The run.time_to_go.EvaluationPlan of a run on one machine."""
    from cifar10_estimator.run import time_to_go
    from cifar10_estimator.training import evaluation_views
    views_per_batch = (settings.eval_batch_size
                       * evaluation_views.EvaluationViews.from_hparams(settings.hparams).count)
    subset = flags.periodic_eval_subset(settings)
    views_each = flags.eval_steps(settings, subset) * views_per_batch
    final_views = views_each + (flags.eval_steps(settings, "eval") * views_per_batch
                                if subset == "validation" else 0)
    # An evaluation follows the first checkpoint --eval-every-secs after the last one
    # started; checkpoints by time come every save_checkpoints_secs of wall time.
    every_secs = settings.eval_every_secs
    if run_config.save_checkpoints_secs:
        every_secs = (math.ceil(every_secs / run_config.save_checkpoints_secs)
                      * run_config.save_checkpoints_secs)
    return time_to_go.EvaluationPlan(views_each, every_secs, final_views, view_cost)


def make_train_spec(settings, task, signals, progress):
    """The TrainSpec: the training input, the last step, the stop and divergence hooks, and
    the checkpoints' pause of the run's `progress`."""
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator.run import progress as run_progress
    from cifar10_estimator.run import faults
    from cifar10_estimator.run import stop_signals
    return tf.estimator.TrainSpec(
        make_train_input_fn(settings, task), max_steps=schedule.last_step(settings.hparams),
        # Before tf.estimator's own hooks and listeners: the divergence check ends
        # training before its NanTensorHook, the stop before its evaluation.
        hooks=[stop_signals.StopAtSignalHook(signals),
               faults.DivergenceHook(settings.hparams, settings.job_dir)],
        saving_listeners=[stop_signals.SaveThenStopListener(signals, settings.job_dir),
                          run_progress.ProgressCheckpointListener(progress)])


def _stopped_outside_training_text(job_dir, task):
    """How a run stopped outside a training session ends: what is saved, what a rerun does."""
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    if task and task.task_type == cluster.WORKER:
        return ("at global step %s: a worker saves nothing (the chief writes the "
                "checkpoints); restarted, it rejoins the cluster" % _latest_step(job_dir))
    checkpoint = tf.train.latest_checkpoint(job_dir)
    if checkpoint is None:
        return "before its first checkpoint; the same command starts the job"
    return "with %s saved; the same command carries on from it" % checkpoint


def _latest_step(job_dir):
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    checkpoint = tf.train.latest_checkpoint(job_dir)
    if checkpoint is None:
        return "0"
    return str(tf.train.load_variable(checkpoint, tf.compat.v1.GraphKeys.GLOBAL_STEP))


def evaluated_image_cost(precision_policy, num_gpus, hparams):
    """The cost of an evaluated image against training's precision: above 1 where
    training is faster in a mixed precision and evaluations compute in float32 (as
    measured once per machine, see precision_speed; flags.resolve told it)."""
    if hparams.eval_in_training_precision or not precision_policy.is_mixed or num_gpus:
        return 1.0
    from cifar10_estimator.machine import precision_speed
    speeds = precision_speed.measured_speeds(precision_policy)
    return speeds[precision_policy.name] / speeds["fp32"]


def log_schedule(hparams, changes=()):
    """Log the run's length, learning rate, training compute and precision once (the plan
    line), and the flags `changes` (hparams.changed_flags) since the job's last run; warn
    if the rate never drops."""
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator import compute_accounting
    from cifar10_estimator.run import console
    console.console_logger().info(
        "Recipe %s. %s; %s %s%s", hparams.recipe, schedule.describe(hparams),
        compute_accounting.training_compute(hparams).plan_text(),
        precision.policy(hparams.precision).plan_text(),
        "; changed since the job's last run: %s" % ", ".join(changes) if changes else "")
    warning = schedule.never_drops_warning(hparams)
    if warning:
        tf.compat.v1.logging.warning(warning)


def make_eval_spec(settings, signals, progress=None):
    """The EvalSpec of the evaluations during training, with its exporters.

    On the validation set they are a named evaluation (job-dir/eval_validation/) and
    export/best keeps the model of the highest validation accuracy; on the test set
    (--eval-subset eval, or data without a validation set) they go to job-dir/eval/ as
    in the original, and no best export is kept: never select a model on test data.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator.run import console
    from cifar10_estimator.run import evaluation_line
    from cifar10_estimator.run import progress as run_progress
    from cifar10_estimator.run import stop_signals
    from cifar10_estimator.training import evaluation_views
    subset = flags.periodic_eval_subset(settings)
    exporters = make_exporters(subset)
    hooks = [stop_signals.StopEvaluationHook(signals, settings.job_dir)]
    if progress is not None:
        hooks.append(run_progress.EvaluationTimer(
            progress, settings.eval_batch_size
            * evaluation_views.EvaluationViews.from_hparams(settings.hparams).count))
    if subset == "validation":
        name = evaluation_dirs.VALIDATION_EVAL_NAME
    else:
        name = None
        console.console_logger().info(
            "Evaluating on the test set during training (%s); no best export is kept, as "
            "choosing a model on test data would make its test accuracy optimistic.",
            "--eval-subset eval" if settings.eval_subset == "eval"
            else "%s has no validation set" % settings.data_dir)
    evaluation_lines = evaluation_line.EvaluationLineExporter(
        "validation set" if subset == "validation" else "test set", progress)
    return tf.estimator.EvalSpec(
        make_eval_input_fn(settings, subset), steps=flags.eval_steps(settings, subset),
        name=name, start_delay_secs=0, throttle_secs=settings.eval_every_secs,
        exporters=[evaluation_lines] + exporters, hooks=hooks)


def make_exporters(subset):
    """The exporters after each evaluation of `subset`: the latest model, and on the
    validation set the best one too (never select a model on test data)."""
    from cifar10_estimator.serving import export
    if subset == "validation":
        return export.latest_and_best_exporters("validation")
    return [export.latest_exporter()]


def training_compute_record(settings, progress):
    """What test_results.json keeps of the run's compute (training.compute.record): the
    FLOPs (with --skip-learned, of the examples the final checkpoint counts), the rate of
    the training `progress` timed, and on a CPU the peak of the precision it trained in."""
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator import compute_accounting
    from cifar10_estimator.machine import cpu_peak
    from cifar10_estimator.training import compute
    from cifar10_estimator.training import example_skipping
    hparams = settings.hparams
    training_compute = compute_accounting.training_compute(hparams)
    flops = sum(phase.flops_per_example * compute.examples_trained(hparams, 0, steps)
                for phase, steps in zip(training_compute.phases,
                                        progress.timed_steps_per_phase))
    kept = None
    checkpoint = hparams.skip_learned and tf.train.latest_checkpoint(settings.job_dir)
    if checkpoint:
        kept = [int(count) for count in tf.train.load_variable(
            checkpoint, example_skipping.COUNTS_NAME)]
        # The timed steps kept the share of their examples that the job's steps kept.
        flops *= training_compute.flops_of_counts(kept) / training_compute.flops()
    timed = compute.TimedTraining(sum(progress.timed_steps_per_phase),
                                  progress.training_secs, flops, kept)
    return compute.record(training_compute, timed, hparams.precision,
                          None if settings.num_gpus else cpu_peak.this_cpu())


def report_on_test(estimator, settings, eval_spec, final_metrics, training_compute=None):
    """Evaluate the final checkpoint once on the test set; log, save and summarise it.

    Args:
      settings: the run's settings (its HParams say which weights are evaluated).
      final_metrics: the final evaluation of eval_spec, which already is the test
        evaluation when eval_spec evaluates the test set.
      training_compute: what test_results.json keeps of the run's compute
        (training_compute_record), or None.
    """
    from cifar10_estimator.run import console
    from cifar10_estimator.training import weight_averaging
    checkpoint = estimator.latest_checkpoint()
    steps = flags.eval_steps(settings, "eval")
    if eval_spec.name is None:
        metrics, validation_metrics = final_metrics, None
    else:
        metrics = estimator.evaluate(
            make_eval_input_fn(settings, "eval"), steps=steps,
            checkpoint_path=checkpoint, name=report.TEST_EVAL_NAME, hooks=eval_spec.hooks)
        validation_metrics = final_metrics
    results = report.test_results(
        metrics, steps * settings.eval_batch_size, checkpoint,
        weight_averaging.evaluated_weights(settings.hparams.moving_average_decay, checkpoint),
        training_compute)
    report.write_test_results(settings.job_dir, results)
    console.console_logger().info(report.test_accuracy_line(results))
    print(report.summary(settings.job_dir,
                         None if settings.use_synthetic_data else settings.data_dir,
                         validation_metrics, results), flush=True)


def evaluate_and_export_latest(estimator, eval_spec):
    """Evaluate the latest checkpoint and run the exporters on it, as a final evaluation.

    Returns:
      The metrics (dict), or None where there is no checkpoint.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast
    from cifar10_estimator import evaluator
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


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
