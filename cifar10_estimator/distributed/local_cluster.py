"""Run a TF_CONFIG cluster on this machine: ps tasks, a chief, workers and an evaluator.

    python scripts/launch_local_cluster.py --num-ps 1 --num-workers 1 -- \\
        --data-dir DATA --job-dir JOB --num-gpus 0

Each task is a process running `python -m cifar10_estimator.main` with the trainer flags
after `--` and its own TF_CONFIG, on free ports of 127.0.0.1. On a GPU box each trainer
(the chief, then each worker) is given --num-gpus GPUs of its own through
CUDA_VISIBLE_DEVICES, and sees them as GPUs 0..N-1; the ps tasks get none, and the
evaluator --evaluator-gpus (none by default: it evaluates on the CPU). Their output is streamed with
the task's name in front ([chief] ..., [worker0] ...). The launcher waits for the chief and
the workers, gives the evaluator --evaluator-grace-secs to evaluate the final checkpoint,
then stops the ps tasks, which never exit by themselves. When a task fails, the launcher
stops the others and exits with status 1, naming the task. With --tf-config-shape
operator each TF_CONFIG has the shape Kubeflow's training operator gives a TFJob's
replicas, the evaluator in its cluster, and the chief then waits for the evaluator's
final result before it exits, as it would in the TFJob.
"""

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import threading
import time

from cifar10_estimator import flags as trainer_flags
from cifar10_estimator.cli.child_process import child_environment
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import (non_negative_float, non_negative_int, option,
                                           options_parser, parse, positive_float, positive_int)
from cifar10_estimator.distributed import cluster
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.machine import gpu_devices
from cifar10_estimator.machine import hardware

HOST = "127.0.0.1"
TRAINER_MODULE = "cifar10_estimator.main"
POLL_SECS = 0.2
STOP_GRACE_SECS = 10
# The evaluator takes up the final checkpoint within seconds of its writing, once any
# evaluation under way ended; then come its evaluation, exports and the test evaluation.
EVALUATOR_GRACE_SECS = trainer_flags.FINAL_EVALUATION_SECS
# The shapes of TF_CONFIG the launcher writes (--tf-config-shape). tf.estimator's leaves
# the evaluator, which serves nothing, out of "cluster"; Kubeflow's training operator (v1)
# lists every task there, the evaluator too, and adds "environment": "cloud", which
# nothing reads. A chief that sees the evaluator in "cluster" waits for its final result
# before it exits (evaluator_wait).
ESTIMATOR_SHAPE = "estimator"
OPERATOR_SHAPE = "operator"
OPERATOR_ENVIRONMENT = "cloud"
_PR_SET_PDEATHSIG = 1


def _kill_with_the_launcher_hook():
    """A preexec_fn making the kernel kill a task when the launcher dies, even by SIGKILL.

    Without it the ps tasks, which never exit by themselves, would outlive a killed
    launcher. Resolved here, before any fork; None where prctl is unavailable.
    """
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of the cluster: its TF_CONFIG type and index."""

    task_type: str
    task_index: int = 0

    @property
    def name(self):
        """Log prefix: chief and evaluator (one each), else ps0, worker1, ..."""
        if self.task_type in (cluster.CHIEF, cluster.EVALUATOR):
            return self.task_type
        return "%s%d" % (self.task_type, self.task_index)


def cluster_tasks(num_ps, num_workers, with_evaluator=True):
    """The tasks to start, ps first, as [Task]."""
    tasks = [Task(cluster.PS, index) for index in range(num_ps)]
    tasks.append(Task(cluster.CHIEF))
    tasks += [Task(cluster.WORKER, index) for index in range(num_workers)]
    if with_evaluator:
        tasks.append(Task(cluster.EVALUATOR))
    return tasks


def free_ports(count):
    """`count` distinct TCP ports of 127.0.0.1 that were free a moment ago.

    Another process may take one before the task binds it; that task then fails
    to start its server, and the launcher reports it.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def make_cluster(num_ps, num_workers, ports, with_evaluator=False):
    """The TF_CONFIG "cluster": job -> ['127.0.0.1:port'], for num_ps + 1 + num_workers
    ports, and one more for the evaluator `with_evaluator` (the operator's shape).

    In tf.estimator's shape the evaluator is not part of it: it only reads checkpoints.
    """
    num_tasks = num_ps + 1 + num_workers + (1 if with_evaluator else 0)
    if len(ports) != num_tasks:
        raise ValueError("need %d ports, got %d" % (num_tasks, len(ports)))
    addresses = ["%s:%d" % (HOST, port) for port in ports]
    spec = {cluster.PS: addresses[:num_ps], cluster.CHIEF: addresses[num_ps:num_ps + 1]}
    if num_workers:
        spec[cluster.WORKER] = addresses[num_ps + 1:num_ps + 1 + num_workers]
    if with_evaluator:
        spec[cluster.EVALUATOR] = addresses[-1:]
    return spec


def tf_config(cluster_spec, task, environment=None):
    """The TF_CONFIG value (JSON) of `task` in `cluster_spec`, with its "environment"
    where one is given (OPERATOR_ENVIRONMENT)."""
    config = {"cluster": cluster_spec,
              "task": {"type": task.task_type, "index": task.task_index}}
    if environment is not None:
        config["environment"] = environment
    return json.dumps(config)


def trainer_command(trainer_args):
    return [sys.executable, "-u", "-m", TRAINER_MODULE] + list(trainer_args)


def task_environment(cluster_spec, task, base_environment=None, gpus=None,
                     tf_config_environment=None):
    """Environment of a task: TF_CONFIG (with tf_config_environment as its "environment"
    where given), this copy of the package first on the path (cli.child_process), and
    where `gpus` is given, CUDA_VISIBLE_DEVICES naming them (task_gpus; '' for none)."""
    variables = {"TF_CONFIG": tf_config(cluster_spec, task, tf_config_environment)}
    if gpus is not None:
        variables[gpu_devices.CUDA_VISIBLE_DEVICES] = gpus
    return child_environment(variables, base=base_environment)


def task_gpus(tasks, num_gpus, evaluator_gpus, visible_gpus):
    """{Task: its CUDA_VISIBLE_DEVICES value}: num_gpus GPUs of its own for each trainer,
    in the order of `tasks`, then evaluator_gpus for the evaluator, none for a ps.

    Args:
      visible_gpus: the CUDA_VISIBLE_DEVICES entries of this machine's GPUs
        (hardware.visible_gpu_entries).

    Raises:
      UsageError: there are too few, naming how many each task wants and the fixes.
    """
    wanted = [(task, num_gpus if task.task_type in cluster.TRAINER_JOBS
               else evaluator_gpus if task.task_type == cluster.EVALUATOR else 0)
              for task in tasks]
    try:
        gpus = gpu_devices.gpus_of_tasks([(task.name, count) for task, count in wanted],
                                         visible_gpus)
    except ValueError as error:
        raise UsageError("each task computes on GPUs of its own: %s; ask for fewer "
                         "(--num-gpus, --num-workers, --evaluator-gpus)" % error)
    return {task: gpus[task.name] for task in tasks}


def evaluator_args(trainer_args, num_gpus, evaluator_gpus):
    """The evaluator task's trainer flags: the trainers', on --evaluator-gpus GPUs, or on
    the CPU (its variables too) with none.

    Raises:
      UsageError: --evaluator-gpus with trainers on the CPU.
    """
    if not num_gpus:
        if evaluator_gpus:
            raise UsageError("--evaluator-gpus %d: the trainers train on the CPU (--num-gpus "
                             "0); give them GPUs too, or drop --evaluator-gpus"
                             % evaluator_gpus)
        return list(trainer_args)
    return list(trainer_args) + ["--num-gpus", str(evaluator_gpus)] + (
        [] if evaluator_gpus else ["--variable-strategy", "CPU"])


class TaskProcess:
    """A running task: its process, and a thread copying its output with a name prefix."""

    def __init__(self, task, command, environment, output, output_lock):
        self.task = task
        # Its own session: Ctrl-C reaches the launcher only, which then stops every task.
        self._process = subprocess.Popen(
            command, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, universal_newlines=True, errors="replace",
            start_new_session=True, preexec_fn=_kill_with_the_launcher_hook())
        self._output = output
        self._output_lock = output_lock
        self._copier = threading.Thread(target=self._copy_output, daemon=True)
        self._copier.start()

    @property
    def pid(self):
        return self._process.pid

    def _copy_output(self):
        for line in self._process.stdout:
            with self._output_lock:
                self._output.write("[%s] %s" % (self.task.name, line))
                self._output.flush()

    def poll(self):
        """Exit status, or None while it runs."""
        return self._process.poll()

    def terminate(self):
        """Ask it to stop (SIGTERM) without waiting."""
        if self._process.poll() is None:
            self._process.terminate()

    def wait_stopped(self):
        """Wait for it to end, SIGKILL after STOP_GRACE_SECS; then for its output to be copied."""
        try:
            self._process.wait(STOP_GRACE_SECS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._copier.join(STOP_GRACE_SECS)


class LocalCluster:
    """Starts tasks, waits for training and the final evaluation, and always stops them all."""

    def __init__(self, output=None):
        self._output = output or sys.stdout
        self._output_lock = threading.Lock()
        self._processes = []

    def log(self, message):
        with self._output_lock:
            self._output.write("[launcher] %s\n" % message)
            self._output.flush()

    def start(self, task, command, environment):
        process = TaskProcess(task, command, environment, self._output, self._output_lock)
        self._processes.append(process)
        self.log("started %s (pid %d)" % (task.name, process.pid))

    def run(self, timeout_secs=None, evaluator_grace_secs=EVALUATOR_GRACE_SECS):
        """Wait for the chief and the workers, then the evaluator; stop every task.

        Args:
          timeout_secs: limit for the whole run, or None.
          evaluator_grace_secs: how long the evaluator may run once training ended.

        Raises:
          Cifar10EstimatorError: a task failed, a ps exited, or a time limit passed.
        """
        deadline = time.monotonic() + timeout_secs if timeout_secs else float("inf")
        timed_out = Cifar10EstimatorError(
            "the cluster did not finish within %g s (--timeout-secs); stopped all tasks"
            % (timeout_secs or 0))
        trainers = [p for p in self._processes if p.task.task_type in cluster.TRAINER_JOBS]
        evaluators = [p for p in self._processes if p.task.task_type == cluster.EVALUATOR]
        try:
            if not self._wait_for(trainers, deadline):
                raise timed_out
            self.log("training finished")
            if evaluators:
                grace_end = time.monotonic() + evaluator_grace_secs
                if not self._wait_for(evaluators, min(deadline, grace_end)):
                    raise timed_out if deadline < grace_end else Cifar10EstimatorError(
                        "the evaluator did not finish the final evaluation within %g s "
                        "(--evaluator-grace-secs) and was stopped; the final checkpoint is "
                        "written" % evaluator_grace_secs)
                self.log("evaluation finished")
        finally:
            self.stop()

    def stop(self):
        """Stop every task still running (ps tasks never end by themselves)."""
        for process in self._processes:
            if process.poll() is None:
                self.log("stopping %s" % process.task.name)
                process.terminate()
        for process in self._processes:
            process.wait_stopped()

    def _wait_for(self, awaited, deadline):
        """Wait until every process in `awaited` exited with status 0 (True) or the deadline.

        Raises:
          Cifar10EstimatorError: a task failed, or a ps exited.
        """
        while True:
            for process in self._processes:
                status = process.poll()
                if status is None:
                    continue
                if status != 0:
                    raise Cifar10EstimatorError(
                        "%s failed (exit status %d); stopped the other tasks"
                        % (process.task.name, status))
                if process.task.task_type == cluster.PS:
                    raise Cifar10EstimatorError(
                        "%s exited while the cluster ran; stopped the other tasks"
                        % process.task.name)
            if all(process.poll() == 0 for process in awaited):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_SECS)


@dataclasses.dataclass(frozen=True)
class LauncherOptions:
    """The launcher's own command line, before `--`: the cluster's shape and its limits."""

    num_ps: int = option(1, "Parameter servers, 1 or more (default 1).",
                         type=positive_int, metavar="N")
    num_workers: int = option(1, "Workers besides the chief, 0 or more (default 1).",
                              type=non_negative_int, metavar="N")
    evaluator: bool = option(
        True, "Start no evaluator task (by default one evaluates each new checkpoint).",
        flag="--no-evaluator", action="store_false")
    timeout_secs: float = option(
        0, "Stop everything and fail if the cluster runs longer than S seconds (default 0: "
           "no limit).",
        type=non_negative_float, metavar="S")
    evaluator_gpus: int = option(
        0, "GPUs the evaluator evaluates on, after the trainers' (default 0: the CPU, "
           "leaving the GPUs to training). Each trainer takes --num-gpus GPUs of its own.",
        type=non_negative_int, metavar="N")
    evaluator_grace_secs: float = option(
        EVALUATOR_GRACE_SECS,
        "Once training ended, how long the evaluator may take to evaluate the final "
        "checkpoint (on the validation and the test set) and export it before it is "
        "stopped (default %d). It starts on that checkpoint within seconds, whatever "
        "--eval-every-secs says, once an evaluation under way ended." % EVALUATOR_GRACE_SECS,
        type=positive_float, metavar="S")
    tf_config_shape: str = option(
        ESTIMATOR_SHAPE,
        "How each task's TF_CONFIG lists the cluster: %s (default), as tf.estimator's "
        "documentation writes it, the evaluator outside \"cluster\"; or %s, as Kubeflow's "
        "training operator writes it for a TFJob, every task in \"cluster\", the evaluator "
        "too, and \"environment\": \"%s\". There the chief waits for the evaluator's "
        "final result before it exits (the trainer's --evaluator-wait-secs)."
        % (ESTIMATOR_SHAPE, OPERATOR_SHAPE, OPERATOR_ENVIRONMENT),
        choices=[ESTIMATOR_SHAPE, OPERATOR_SHAPE])


def build_parser():
    return options_parser(
        LauncherOptions,
        usage="%%(prog)s [--num-ps N] [--num-workers N] [--no-evaluator] [--evaluator-gpus N] "
              "[--timeout-secs S] [--evaluator-grace-secs S] [--tf-config-shape {%s,%s}] "
              "-- TRAINER FLAGS" % (ESTIMATOR_SHAPE, OPERATOR_SHAPE),
        description="Run ps, chief, worker and evaluator tasks of a TF_CONFIG cluster as "
                    "processes on 127.0.0.1, each `python -m %s TRAINER FLAGS`." % TRAINER_MODULE)


def split_argv(argv):
    """(launcher flags, trainer flags): the flags before and after the first `--`."""
    if "--" not in argv:
        return list(argv), []
    split = argv.index("--")
    return list(argv[:split]), list(argv[split + 1:])


def validate_trainer_flags(trainer_args, task=None, whose=""):
    """Check the trainer flags once here rather than fail in every task.

    Args:
      task: the cluster.ClusterTask they are checked for (an evaluator), or None: the
        trainers'.
      whose: words after "trainer flags (after --)" in an error, naming the task.

    Returns:
      The trainer's flags.Settings.

    Raises:
      UsageError: naming the flag at fault.
    """
    try:
        settings = trainer_flags.parse(trainer_args)
        trainer_flags.quiet_tensorflow_logs()  # before validate loads TensorFlow
        trainer_flags.validate(settings, task)
    except UsageError as error:
        raise UsageError("trainer flags (after --)%s: %s" % (whose, error))
    return settings


def cluster_of(options):
    """The TF_CONFIG "cluster" of the launcher's options on free ports, and the
    "environment" its --tf-config-shape writes beside it (None: none)."""
    operator_shape = options.tf_config_shape == OPERATOR_SHAPE
    with_evaluator = options.evaluator and operator_shape
    num_tasks = options.num_ps + 1 + options.num_workers + (1 if with_evaluator else 0)
    spec = make_cluster(options.num_ps, options.num_workers, free_ports(num_tasks),
                        with_evaluator)
    return spec, OPERATOR_ENVIRONMENT if operator_shape else None


def main(argv):
    launcher_argv, trainer_args = split_argv(argv)
    args = parse(build_parser(), LauncherOptions, launcher_argv)
    num_gpus = validate_trainer_flags(trainer_args).num_gpus
    tasks = cluster_tasks(args.num_ps, args.num_workers, args.evaluator)
    cluster_spec, environment = cluster_of(args)
    args_of = {task: trainer_args for task in tasks}
    if args.evaluator:
        evaluator = Task(cluster.EVALUATOR)
        args_of[evaluator] = evaluator_args(trainer_args, num_gpus, args.evaluator_gpus)
        validate_trainer_flags(
            args_of[evaluator],
            cluster.task_from_tf_config(tf_config(cluster_spec, evaluator, environment)),
            " for the evaluator on %s" % ("%d GPUs (--evaluator-gpus)" % args.evaluator_gpus
                                          if args.evaluator_gpus else
                                          "the CPU (--evaluator-gpus N gives it GPUs)"))
    gpus = task_gpus(tasks, num_gpus, args.evaluator_gpus,
                     hardware.visible_gpu_entries() if num_gpus else [])
    # A plain `kill` of the launcher stops the tasks too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    local_cluster = LocalCluster()
    local_cluster.log("cluster %s%s" % (json.dumps(cluster_spec), "" if environment is None
                                        else ', environment "%s"' % environment))
    if num_gpus:
        local_cluster.log("GPUs (CUDA_VISIBLE_DEVICES): %s" % ", ".join(
            "%s %s" % (task.name, gpus[task] or "none") for task in tasks))
    try:
        for task in tasks:
            local_cluster.start(task, trainer_command(args_of[task]),
                                task_environment(cluster_spec, task, gpus=gpus[task],
                                                 tf_config_environment=environment))
    except BaseException:
        local_cluster.stop()
        raise
    local_cluster.run(args.timeout_secs or None, args.evaluator_grace_secs)
    local_cluster.log("done")


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
