"""The trainer as a task of a TF_CONFIG cluster: checks, session settings, server, ps watchdog.

tf.estimator.train_and_evaluate reads TF_CONFIG and runs whatever task it names:

    {"cluster": {"ps": ["host0:2222"], "chief": ["host1:2222"], "worker": ["host2:2222"]},
     "task": {"type": "worker", "index": 0}}

chief (or TF 1.x's master) and the workers train, the chief alone writing checkpoints
and summaries; variables live on the ps tasks; an evaluator evaluates new checkpoints.
The cluster may list the evaluator too, as Kubeflow's training operator writes it (with
"environment": "cloud", which nothing reads): it is not part of the training cluster.
This module checks TF_CONFIG before TensorFlow starts, so a mistake is one line, and
covers what the Estimator leaves out when it is given a session config.
"""

import dataclasses
import json
import os
import socket
import threading
import time

from cifar10_estimator.errors import UsageError

PS = "ps"
CHIEF = "chief"
MASTER = "master"  # TF 1.x's name of the chief; it also evaluates, in-process
WORKER = "worker"
EVALUATOR = "evaluator"
TRAINER_JOBS = (CHIEF, MASTER, WORKER)
KNOWN_JOBS = (PS, CHIEF, MASTER, WORKER, EVALUATOR)

_TF_CONFIG_SHAPE = ('{"cluster": {"ps": ["host:port"], "chief": ["host:port"], '
                    '"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}')


@dataclasses.dataclass(frozen=True)
class ClusterTask:
    """The task this process runs in a cluster.

    Attributes:
      task_type: 'chief', 'master', 'worker', 'ps' or 'evaluator'.
      task_index: index of the task among those of its type.
      cluster: job name -> list of 'host:port' addresses.
    """

    task_type: str
    task_index: int
    cluster: dict

    @property
    def is_trainer(self):
        """Whether the task computes gradients (chief, master or worker)."""
        return self.task_type in TRAINER_JOBS

    @property
    def writes_checkpoints(self):
        """Whether the task writes the job dir's checkpoints: the chief (or master) alone."""
        return self.task_type in (CHIEF, MASTER)

    @property
    def evaluates(self):
        """Whether the task evaluates: the evaluator, or a master (in its own process)."""
        return self.task_type in (MASTER, EVALUATOR)

    @property
    def builds_towers(self):
        """Whether the task builds the towers: every task but a ps, which only serves variables."""
        return self.task_type != PS

    @property
    def ps_addresses(self):
        return tuple(self.cluster.get(PS, ()))

    @property
    def num_trainers(self):
        """Tasks that compute gradients: the chief (or master) and the workers.

        The same for every task, the evaluator included, whose RunConfig counts none:
        it needs the trainers' count to know their last step under --train-epochs.
        """
        return sum(len(self.cluster.get(job, ())) for job in TRAINER_JOBS)


def task_from_tf_config(text):
    """The task that TF_CONFIG (a JSON string) names; None to train locally.

    Checks what TensorFlow 2.15's RunConfig and train_and_evaluate check, and also
    that jobs are ps, chief (or master), worker and evaluator with lists of
    host:port, and that there is a ps as soon as there are workers besides the
    chief (without one every worker would train its own copy of the variables).

    Raises:
      UsageError: TF_CONFIG is not JSON, names an unknown or missing task, a task
        index out of range, a cluster without chief, a second evaluator, or a master
        with an evaluator.
    """
    if not text or not text.strip():
        return None
    try:
        config = json.loads(text)
    except ValueError as error:
        raise UsageError("TF_CONFIG is not valid JSON (%s); expected %s"
                         % (error, _TF_CONFIG_SHAPE))
    if not isinstance(config, dict):
        raise UsageError("TF_CONFIG must be a JSON object like %s" % _TF_CONFIG_SHAPE)
    task = config.get("task") or {}
    if not isinstance(task, dict):
        raise UsageError('TF_CONFIG "task" must be an object like {"type": "worker", "index": 0}')
    cluster = _validated_cluster(config.get("cluster"))
    if not cluster:
        if task and (task.get("type", WORKER) != WORKER or _task_index(task) != 0):
            raise UsageError('TF_CONFIG has a "task" but no "cluster"; add the cluster, or unset '
                             "TF_CONFIG to train on this machine alone")
        return None
    return _validated_task(task, cluster)


def _validated_cluster(cluster):
    if cluster is None:
        return {}
    if not isinstance(cluster, dict):
        raise UsageError('TF_CONFIG "cluster" must be an object of job name -> list of '
                         '"host:port", like %s' % _TF_CONFIG_SHAPE)
    for job, addresses in cluster.items():
        if job not in KNOWN_JOBS:
            raise UsageError('unknown job "%s" in the TF_CONFIG cluster; jobs are ps, chief, '
                             "worker (and evaluator, or master instead of chief)" % job)
        if not isinstance(addresses, list) or not addresses:
            raise UsageError('TF_CONFIG cluster job "%s" must be a non-empty list of '
                             '"host:port" addresses, got %r' % (job, addresses))
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not (isinstance(address, str) and host and port.isdigit()):
                raise UsageError('TF_CONFIG cluster job "%s" has address %r; addresses are '
                                 '"host:port"' % (job, address))
    chiefs = [job for job in (CHIEF, MASTER) if job in cluster]
    if not chiefs:
        raise UsageError('the TF_CONFIG cluster has no chief: add "chief": ["host:port"], the '
                         "worker that initializes the model and writes checkpoints")
    if len(chiefs) > 1:
        raise UsageError('the TF_CONFIG cluster has both a "chief" and a "master"; they are two '
                         'names of one task: keep "chief"')
    if len(cluster[chiefs[0]]) > 1:
        raise UsageError('the TF_CONFIG cluster has %d %s addresses; there is exactly one %s'
                         % (len(cluster[chiefs[0]]), chiefs[0], chiefs[0]))
    if WORKER in cluster and PS not in cluster:
        raise UsageError('the TF_CONFIG cluster has workers but no "ps": add at least one '
                         "parameter server to hold the shared variables")
    if EVALUATOR in cluster:
        _check_one_evaluator(len(cluster[EVALUATOR]), "the TF_CONFIG cluster has %d evaluator "
                             "addresses" % len(cluster[EVALUATOR]))
        _check_no_master_beside_an_evaluator(cluster)
    return cluster


def _check_one_evaluator(count, what):
    # tf.estimator runs evaluator 0 alone; two evaluators would evaluate the same checkpoints
    # and write the same results into the job dir.
    if count > 1:
        raise UsageError("%s; a cluster has one evaluator, index 0: two would evaluate the same "
                         "checkpoints and write the same results" % what)


def _check_no_master_beside_an_evaluator(cluster):
    if MASTER in cluster:
        raise UsageError('an evaluator cannot join a TF_CONFIG cluster with a "master": '
                         "tf.estimator evaluates on the master itself; name the master "
                         '"chief" to evaluate in a separate evaluator task')


def _task_index(task):
    index = task.get("index", 0)
    if isinstance(index, bool) or not str(index).isdigit():
        raise UsageError('TF_CONFIG task "index" must be a whole number 0, 1, ..., got %r'
                         % (index,))
    return int(index)


def _validated_task(task, cluster):
    task_type = task.get("type")
    if not task_type:
        raise UsageError('TF_CONFIG has a "cluster" but no "task": add '
                         '"task": {"type": "worker", "index": 0} naming this process')
    if task_type not in KNOWN_JOBS:
        raise UsageError('unknown task type "%s" in TF_CONFIG; use chief, worker, ps or evaluator'
                         % task_type)
    if "index" not in task:
        raise UsageError('TF_CONFIG task "%s" has no "index": add "index": 0 (or the task\'s '
                         "position in its job's address list)" % task_type)
    index = _task_index(task)
    if task_type == EVALUATOR:
        # The evaluator need not be in the cluster (it serves nothing), so its index is
        # checked here rather than against the cluster's list.
        _check_one_evaluator(index + 1, "TF_CONFIG names evaluator:%d" % index)
        _check_no_master_beside_an_evaluator(cluster)
    elif task_type not in cluster:
        raise UsageError('TF_CONFIG task type "%s" is not a job of its cluster (%s)'
                         % (task_type, ", ".join(sorted(cluster))))
    elif index >= len(cluster[task_type]):
        count = len(cluster[task_type])
        raise UsageError("TF_CONFIG task %s:%d is out of range: the cluster has %d %s task%s "
                         "(index 0 to %d)" % (task_type, index, count, task_type,
                                              "" if count == 1 else "s", count - 1))
    return ClusterTask(task_type=task_type, task_index=index, cluster=cluster)


def device_filters(task):
    """The devices a trainer's sessions may see: the ps tasks and its own, as tf.estimator sets.

    tf.estimator only sets them when it makes the session config itself. Without them
    every session waits for every task of the cluster, so one slow or restarting
    worker holds up the others.

    Returns:
      A list of device filters, or None for ps and evaluator tasks.
    """
    if task.task_type == WORKER:
        return ["/job:ps", "/job:worker/task:%d" % task.task_index]
    if task.task_type in (CHIEF, MASTER):
        return ["/job:ps", "/job:%s" % task.task_type]
    return None


def start_trainer_server(run_config):
    """Start this chief/worker's TensorFlow server with the devices of its session config.

    tf.estimator starts the server with only the session config's GPU options, so a
    CPU worker would have one CPU device whatever --num-cpu-towers says, and its
    thread pools would ignore --num-intra-threads/--num-inter-threads. Call this
    before tf.estimator.train_and_evaluate.

    Returns:
      The running tf.distribute.Server. It serves until the process ends (gRPC servers
      cannot be stopped), as the one tf.estimator would start.
    """
    import tensorflow as tf  # lazy: keeps the trainer's --help and flag errors fast

    session_config = run_config.session_config
    server_config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=session_config.intra_op_parallelism_threads,
        inter_op_parallelism_threads=session_config.inter_op_parallelism_threads,
        gpu_options=session_config.gpu_options)
    server_config.device_count.update(session_config.device_count)
    server = tf.distribute.Server(
        run_config.cluster_spec, job_name=run_config.task_type, task_index=run_config.task_id,
        config=server_config, protocol=run_config.protocol, start=True)
    # TF_CONFIG's environment "google" is tf.estimator's sign that the task's server
    # runs already (training.py reads it to skip starting one); nothing else reads it.
    tf_config = json.loads(os.environ["TF_CONFIG"])
    tf_config["environment"] = "google"
    os.environ["TF_CONFIG"] = json.dumps(tf_config)
    return server


class ParameterServerWatchdog:
    """Reports a parameter server whose port has refused connections for timeout_secs.

    TensorFlow retries a lost ps forever: the training session fails, a new one is
    created, and that waits for the ps without a deadline. This thread probes each
    ps address with a TCP connection every probe_every_secs and calls
    on_unreachable(message) once when one has been unreachable for timeout_secs,
    whether it never came up or was lost during training.
    """

    def __init__(self, ps_addresses, timeout_secs, on_unreachable, probe_every_secs=1.0):
        """Args:
          ps_addresses: 'host:port' of ps:0, ps:1, ...
          timeout_secs: how long a ps may be unreachable.
          on_unreachable: called with a one-line message, from the watchdog thread.
          probe_every_secs: seconds between two rounds of probes.
        """
        self._ps_addresses = tuple(ps_addresses)
        self._timeout_secs = timeout_secs
        self._on_unreachable = on_unreachable
        self._probe_every_secs = probe_every_secs
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ps-watchdog", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stopped.set()
        self._thread.join()

    def _watch(self):
        # Until a ps is first reached, its time counts from the start of the watch.
        last_reached = [time.monotonic()] * len(self._ps_addresses)
        ever_reached = [False] * len(self._ps_addresses)
        while not self._stopped.wait(self._probe_every_secs):
            for index, address in enumerate(self._ps_addresses):
                now = time.monotonic()
                if _accepts_connections(address, timeout_secs=self._probe_every_secs):
                    last_reached[index] = now
                    ever_reached[index] = True
                elif now - last_reached[index] >= self._timeout_secs:
                    self._on_unreachable(self._message(index, ever_reached[index]))
                    return

    def _message(self, index, was_reached):
        name = "ps:%d (%s)" % (index, self._ps_addresses[index])
        if was_reached:
            return ("lost the parameter server %s: no connection for %g s (--ps-timeout-secs); "
                    "restart the cluster to resume from the last checkpoint"
                    % (name, self._timeout_secs))
        return ("cannot reach the parameter server %s after %g s (--ps-timeout-secs); check "
                "that it runs and that TF_CONFIG has its address" % (name, self._timeout_secs))


def _accepts_connections(address, timeout_secs):
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_secs):
            return True
    except OSError:
        return False
