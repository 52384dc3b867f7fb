"""Training as a TF_CONFIG cluster: TF_CONFIG checks, launcher runs (throughput, the final
evaluation's timing, two ps), and a lost or restarted task.

Clusters run as real processes on 127.0.0.1 with tiny ResNet-8 and batch 8. Async runs
end at --train-steps or up to two steps past it per worker: a worker checks the global
step after each of its steps, reading it while other workers update it.
"""

import collections
import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator import flags
from cifar10_estimator import main as trainer
from cifar10_estimator import report
from cifar10_estimator.distributed import cluster
from cifar10_estimator.distributed import evaluator_wait
from cifar10_estimator.distributed import local_cluster
from cifar10_estimator.distributed.local_cluster import Task
from cifar10_estimator.errors import RunStopped, UsageError
from cifar10_estimator.run import stop_signals
from cifar10_estimator.serving import export_dirs
from cli_helpers import (REPO_ROOT, assert_one_line_error, cli_env, many_processes, run_module,
                         start_module)
from test_training import checkpoint_steps, eval_metrics
from test_training import trainer_args as training_args

MODULE = "cifar10_estimator.main"
LAUNCHER = "cifar10_estimator.distributed.local_cluster"
LOSS_AT_STEP = re.compile(r"\bloss = [0-9.e+-]+, step = (\d+)")
WORKER_RATE = re.compile(r"\bAverage examples/sec: ([0-9.e+]+) \(([0-9.e+]+)\), step = (\d+)$")
CLUSTER_RATE = re.compile(
    r"\bCluster examples/sec: ([0-9.e+]+) \(([0-9.e+]+)\), global step = (\d+)$")
SESSION_CREATED = re.compile(r"\bDone running local_init_op\.$")  # a trainer's session is up
EVALUATION_STARTED = re.compile(r"\bStarting evaluation at ")
# Longer than any test: an evaluator that waits it out before the final checkpoint fails.
DEFAULT_EVAL_EVERY_SECS = flags.build_parser().get_default("eval_every_secs")


def trainer_args(data_dir, job_dir, *extra):
    # --verbose: the tests read the tasks' steps and rates in TensorFlow's log.
    return training_args(data_dir, job_dir, "--verbose", *extra)


def assert_async_final_step(job_dir, train_steps, num_trainers):
    final_step = checkpoint_steps(job_dir)[-1]
    assert train_steps <= final_step <= train_steps + 2 * num_trainers
    return final_step


CLUSTER = {"ps": ["127.0.0.1:2220"], "chief": ["127.0.0.1:2221"],
           "worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def tf_config(cluster_spec, task_type, index=0):
    return json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})


# TF_CONFIG checks, before TensorFlow starts.

@pytest.mark.parametrize("task_type, index", [
    ("ps", 0), ("chief", 0), ("worker", 1), ("evaluator", 0)])
def test_tf_config_names_this_task(task_type, index):
    task = cluster.task_from_tf_config(tf_config(CLUSTER, task_type, index))
    assert (task.task_type, task.task_index, task.cluster) == (task_type, index, CLUSTER)
    assert task.is_trainer == (task_type in ("chief", "worker"))
    assert task.builds_towers == (task_type != "ps")
    assert task.ps_addresses == ("127.0.0.1:2220",)
    # Every task counts the chief and both workers, so that all agree on the last step.
    assert task.num_trainers == 3


def operator_tf_config(replicas, replica_type, index, job_name="cifar10", namespace="ml"):
    """TF_CONFIG as Kubeflow's training operator v1 sets it in a TFJob's replica.

    Every replica type is in "cluster", the evaluator's too, under its lower-case name, each
    replica as its headless service <job>-<type>-<i>.<namespace>.svc on the default port
    2222; then "task", and "environment": "cloud". Compact JSON, the cluster's jobs sorted,
    as Go's encoding/json writes its map and struct.

    Args:
      replicas: {replica type as the TFJob names it ("PS", "Chief", ...): count}.
    """
    hosts = {replica.lower(): ["%s-%s-%d.%s.svc:2222" % (job_name, replica.lower(), i, namespace)
                               for i in range(count)]
             for replica, count in replicas.items()}
    config = {"cluster": dict(sorted(hosts.items())),
              "task": {"type": replica_type.lower(), "index": index},
              "environment": "cloud"}
    return json.dumps(config, separators=(",", ":"))


OPERATOR_REPLICAS = {"PS": 1, "Chief": 1, "Worker": 2, "Evaluator": 1}
OPERATOR_DEVICE_FILTERS = {("ps", 0): None, ("chief", 0): ["/job:ps", "/job:chief"],
                           ("worker", 0): ["/job:ps", "/job:worker/task:0"],
                           ("worker", 1): ["/job:ps", "/job:worker/task:1"],
                           ("evaluator", 0): None}


def test_the_operators_tf_config_has_the_shape_it_writes():
    config = json.loads(operator_tf_config(OPERATOR_REPLICAS, "Worker", 1))
    assert config == {
        "cluster": {"chief": ["cifar10-chief-0.ml.svc:2222"],
                    "evaluator": ["cifar10-evaluator-0.ml.svc:2222"],
                    "ps": ["cifar10-ps-0.ml.svc:2222"],
                    "worker": ["cifar10-worker-0.ml.svc:2222", "cifar10-worker-1.ml.svc:2222"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud"}


@pytest.mark.parametrize("task_type, index", sorted(OPERATOR_DEVICE_FILTERS))
def test_every_replica_of_an_operators_tfjob_is_accepted_in_its_role(monkeypatch, tmp_path,
                                                                      task_type, index):
    text = operator_tf_config(OPERATOR_REPLICAS, task_type, index)
    task = cluster.task_from_tf_config(text)
    assert (task.task_type, task.task_index) == (task_type, index)
    assert task.is_trainer == (task_type in ("chief", "worker"))
    assert task.writes_checkpoints == (task_type == "chief")
    assert task.evaluates == (task_type == "evaluator")
    assert task.ps_addresses == ("cifar10-ps-0.ml.svc:2222",)
    # The evaluator in the cluster is no trainer: every task counts the chief and 2 workers.
    assert task.num_trainers == 3
    assert cluster.device_filters(task) == OPERATOR_DEVICE_FILTERS[task_type, index]
    # tf.estimator's RunConfig takes the same TF_CONFIG, the evaluator outside the training.
    run_config = run_config_for(monkeypatch, tmp_path, text)
    assert (run_config.task_type, run_config.task_id) == (task_type, index)
    assert run_config.num_worker_replicas == (0 if task_type == "evaluator" else 3)
    assert list(run_config.session_config.device_filters) == (
        OPERATOR_DEVICE_FILTERS[task_type, index] or [])


@pytest.mark.parametrize("task_type, index", [
    ("evaluator", 1), ("evaluator", 0), ("chief", 0), ("worker", 1), ("ps", 0)])
def test_a_tfjob_with_two_evaluators_is_refused_by_each_replica(task_type, index):
    text = operator_tf_config(dict(OPERATOR_REPLICAS, Evaluator=2), task_type, index)
    with pytest.raises(UsageError) as raised:
        cluster.task_from_tf_config(text)
    assert str(raised.value).startswith("the TF_CONFIG cluster has 2 evaluator addresses; a "
                                        "cluster has one evaluator, index 0")


def test_no_cluster_means_local_training():
    assert cluster.task_from_tf_config(None) is None
    assert cluster.task_from_tf_config("") is None
    assert cluster.task_from_tf_config('{"task": {"type": "worker", "index": 0}}') is None


def test_master_is_accepted_as_tensorflow_215_accepts_it():
    legacy = {"ps": ["127.0.0.1:2220"], "master": ["127.0.0.1:2221"], "worker": ["127.0.0.1:2222"]}
    task = cluster.task_from_tf_config(tf_config(legacy, "master"))
    assert (task.task_type, task.is_trainer) == ("master", True)


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('["cluster"]', "TF_CONFIG must be a JSON object"),
    (tf_config(CLUSTER, "trainer"), 'unknown task type "trainer"'),
    (tf_config(CLUSTER, "worker", 2), "TF_CONFIG task worker:2 is out of range: the cluster has "
                                      "2 worker tasks (index 0 to 1)"),
    (tf_config(CLUSTER, "worker", -1), 'TF_CONFIG task "index" must be a whole number'),
    (tf_config({"ps": ["127.0.0.1:2220"], "worker": ["127.0.0.1:2222"]}, "worker"),
     "the TF_CONFIG cluster has no chief"),
    (tf_config(dict(CLUSTER, master=["127.0.0.1:2224"]), "worker"),
     'has both a "chief" and a "master"'),
    (tf_config({"chief": ["127.0.0.1:2221"], "worker": ["127.0.0.1:2222"]}, "worker"),
     'has workers but no "ps"'),
    (tf_config({"ps": ["127.0.0.1:2220"], "master": ["127.0.0.1:2221"]}, "evaluator"),
     'an evaluator cannot join a TF_CONFIG cluster with a "master"'),
    (operator_tf_config({"PS": 1, "Master": 1, "Evaluator": 1}, "Master", 0),
     'an evaluator cannot join a TF_CONFIG cluster with a "master"'),
    (tf_config(CLUSTER, "evaluator", 1), "TF_CONFIG names evaluator:1; a cluster has one "
                                         "evaluator, index 0"),
    (tf_config(dict(CLUSTER, ps=["2220"]), "ps"), 'job "ps" has address \'2220\''),
    (tf_config(dict(CLUSTER, gpu=["127.0.0.1:2225"]), "chief"), 'unknown job "gpu"'),
    (json.dumps({"cluster": CLUSTER}), 'has a "cluster" but no "task"'),
    (json.dumps({"task": {"type": "ps", "index": 0}}), 'has a "task" but no "cluster"'),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "chief"}}), 'task "chief" has no "index"'),
])
def test_invalid_tf_config_is_a_usage_error(text, message):
    with pytest.raises(UsageError) as raised:
        cluster.task_from_tf_config(text)
    assert message in str(raised.value)


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    (tf_config(CLUSTER, "trainer"), 'unknown task type "trainer"'),
    (tf_config(CLUSTER, "worker", 5), "TF_CONFIG task worker:5 is out of range"),
    (tf_config({"ps": ["127.0.0.1:2220"], "worker": ["127.0.0.1:2222"]}, "worker"),
     "the TF_CONFIG cluster has no chief"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "chief"}}), 'has no "index"'),
    (operator_tf_config(dict(OPERATOR_REPLICAS, Evaluator=2), "Evaluator", 1),
     "the TF_CONFIG cluster has 2 evaluator addresses; a cluster has one evaluator"),
])
def test_trainer_rejects_invalid_tf_config_in_one_line(tiny_data_dir, tmp_path, text, message):
    result = run_module(MODULE, trainer_args(tiny_data_dir, tmp_path / "job"),
                        env={"TF_CONFIG": text}, timeout=60)
    assert_one_line_error(result, 2, "cifar10_estimator.main: error:", message)
    assert not (tmp_path / "job").exists()


# Session settings and the ps watchdog, in-process.

def run_config_for(monkeypatch, tmp_path, text, *given):
    monkeypatch.setenv("TF_CONFIG", text)
    settings = flags.parse(["--job-dir", str(tmp_path), "--num-gpus", "0"] + list(given))
    return trainer.make_run_config(settings, cluster.task_from_tf_config(text))


@pytest.mark.parametrize("task_type, index", [("chief", 0), ("worker", 1)])
def test_device_filters_are_the_ones_tf_estimator_sets_itself(monkeypatch, tmp_path,
                                                              task_type, index):
    import tensorflow as tf
    text = tf_config(CLUSTER, task_type, index)
    ours = run_config_for(monkeypatch, tmp_path, text, "--num-cpu-towers", "2").session_config
    estimators_own = tf.estimator.RunConfig().session_config  # made when none is given
    assert list(ours.device_filters) == list(estimators_own.device_filters)
    assert ours.graph_options.rewrite_options == estimators_own.graph_options.rewrite_options
    assert ours.device_count["CPU"] == 2


def test_run_config_counts_the_chief_and_every_worker_as_replicas(monkeypatch, tmp_path):
    run_config = run_config_for(monkeypatch, tmp_path, tf_config(CLUSTER, "worker", 0))
    assert run_config.num_worker_replicas == 3
    assert run_config.num_ps_replicas == 1
    assert not run_config.is_chief


def test_evaluator_sessions_are_not_filtered(monkeypatch, tmp_path):
    run_config = run_config_for(monkeypatch, tmp_path, tf_config(CLUSTER, "evaluator"))
    assert list(run_config.session_config.device_filters) == []


def watch(addresses, timeout_secs):
    reports = []
    reported = threading.Event()

    def on_unreachable(message):
        reports.append(message)
        reported.set()

    watchdog = cluster.ParameterServerWatchdog(
        addresses, timeout_secs, on_unreachable, probe_every_secs=0.05).start()
    return watchdog, reports, reported


def test_watchdog_reports_a_ps_lost_for_longer_than_the_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = "127.0.0.1:%d" % listener.getsockname()[1]
    watchdog, reports, reported = watch([address], timeout_secs=0.5)
    try:
        # Twice its timeout, 20 probes: a watchdog that took a listening ps for lost
        # would have said so by then.
        assert not reported.wait(1.0), reports
        listener.close()
        assert reported.wait(5.0)  # a hang guard: it reports 0.5 s after the close
    finally:
        watchdog.stop()
    assert reports == ["lost the parameter server ps:0 (%s): no connection for 0.5 s "
                       "(--ps-timeout-secs); restart the cluster to resume from the last "
                       "checkpoint" % address]


@many_processes
def test_watchdog_reports_a_ps_that_never_came_up():
    address = "127.0.0.1:%d" % local_cluster.free_ports(1)[0]
    watchdog, reports, reported = watch(["127.0.0.1:1", address], timeout_secs=0.3)
    try:
        assert reported.wait(5.0)  # a hang guard: it reports 0.3 s after its start
    finally:
        watchdog.stop()
    assert reports[0].startswith("cannot reach the parameter server ps:0 (127.0.0.1:1) "
                                 "after 0.3 s (--ps-timeout-secs)")


# The chief's wait for the evaluator's final result, in-process.

def launcher_tf_config(shape, task_type):
    """The TF_CONFIG the local launcher gives a task of 1 ps, a chief, a worker and an
    evaluator in --tf-config-shape `shape`."""
    options = local_cluster.build_parser().parse_args(["--tf-config-shape", shape])
    spec, environment = local_cluster.cluster_of(options)
    return local_cluster.tf_config(spec, Task(task_type), environment)


@pytest.mark.parametrize("text, waits", [
    (operator_tf_config(OPERATOR_REPLICAS, "Chief", 0), True),
    (operator_tf_config(OPERATOR_REPLICAS, "Worker", 0), False),
    (operator_tf_config(OPERATOR_REPLICAS, "Evaluator", 0), False),
    (operator_tf_config({"PS": 1, "Chief": 1, "Worker": 2}, "Chief", 0), False),
    (launcher_tf_config("operator", "chief"), True),
    # tf.estimator's shape does not say whether an evaluator runs.
    (launcher_tf_config("estimator", "chief"), False),
    (tf_config(CLUSTER, "chief"), False),
    ("", False),
], ids=["operator-chief", "operator-worker", "operator-evaluator", "operator-no-evaluator",
        "launcher-operator-chief", "launcher-estimator-chief", "estimator-chief", "one-machine"])
def test_only_a_chief_that_sees_an_evaluator_in_its_cluster_waits_for_it(text, waits):
    task = cluster.task_from_tf_config(text)
    assert evaluator_wait.chief_waits_for_the_evaluator(task) == waits


def test_the_launchers_operator_shape_is_the_operators_on_localhost():
    config = json.loads(launcher_tf_config("operator", "evaluator"))
    assert sorted(config["cluster"]) == ["chief", "evaluator", "ps", "worker"]
    assert config["environment"] == "cloud"
    assert config["task"] == {"type": "evaluator", "index": 0}
    addresses = [address for job in config["cluster"].values() for address in job]
    assert len(set(addresses)) == 4 and all(address.startswith("127.0.0.1:")
                                           for address in addresses)
    assert "environment" not in json.loads(launcher_tf_config("estimator", "chief"))


def write_test_results(job_dir, global_step):
    report.write_test_results(str(job_dir), report.test_results(
        {"accuracy": 0.25, "loss": 2.0, "global_step": global_step}, 100,
        str(job_dir / ("model.ckpt-%d" % global_step)), "trained"))


def console_lines(caplog):
    return [(record.levelname, record.getMessage()) for record in caplog.records
            if record.name == "tensorflow.cifar10_estimator"]


def test_the_chief_waits_until_the_evaluators_final_result_is_written(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tensorflow")
    write_test_results(tmp_path, 2)  # an earlier run's, before the last step
    writer = threading.Timer(0.5, write_test_results, (tmp_path, 4))
    started = time.monotonic()
    writer.start()
    try:
        results = evaluator_wait.wait_for_final_result(str(tmp_path), 4, timeout_secs=60,
                                                       poll_secs=0.05)
    finally:
        writer.join()
    assert time.monotonic() - started >= 0.5
    assert results["global_step"] == 4
    path = str(tmp_path / "test_results.json")
    assert console_lines(caplog) == [
        ("INFO", "Training done; waiting up to 60 s (--evaluator-wait-secs) for the "
                 "evaluator's final result, %s at step 4 or later" % path),
        ("INFO", "The evaluator's final result: Test accuracy: 0.2500 on 100 examples "
                 "(checkpoint model.ckpt-4); weights: trained")]


def test_the_chiefs_wait_for_the_evaluator_ends_in_one_line_at_its_bound(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tensorflow")
    write_test_results(tmp_path, 2)
    started = time.monotonic()
    assert evaluator_wait.wait_for_final_result(str(tmp_path), 4, timeout_secs=0.3,
                                                poll_secs=0.05) is None
    assert 0.3 <= time.monotonic() - started < 10
    path = str(tmp_path / "test_results.json")
    assert console_lines(caplog)[1:] == [
        ("WARNING", "no final result from the evaluator within 0.3 s (--evaluator-wait-secs): "
                    "%s has none at step 4 or later; training is done and its final "
                    "checkpoint saved (python -m cifar10_estimator.serving.evaluate "
                    "--job-dir %s evaluates it)" % (path, tmp_path))]


def test_a_stop_signal_ends_the_chiefs_wait_for_the_evaluator(tmp_path):
    signals = stop_signals.StopSignals("cifar10-train")
    signals.signal_number = signal.SIGTERM  # as its handler records one
    with pytest.raises(RunStopped, match="^stopped by SIGTERM while waiting for the "
                                         "evaluator's final result"):
        evaluator_wait.wait_for_final_result(str(tmp_path), 4, timeout_secs=60,
                                             stop_signals=signals, poll_secs=0.05)


# Real clusters.

def launcher_args(data_dir, job_dir, trainer_flags, launcher_flags):
    """Launcher arguments: 1 ps, chief, 1 worker and an evaluator unless launcher_flags say
    otherwise; --timeout-secs is a hang guard (cli_helpers) on the whole tiny cluster."""
    return (["--num-ps", "1", "--num-workers", "1", "--timeout-secs", "240"]
            + list(launcher_flags) + ["--"] + trainer_args(data_dir, job_dir, *trainer_flags))


def wait_for_line(process, read_log, pattern, source, prefix="", timeout_secs=180):
    """The match of `pattern` in the first line of read_log() after `prefix` that has one,
    waiting for it while `process` runs (timeout_secs: a hang guard, see cli_helpers)."""
    deadline = time.monotonic() + timeout_secs
    while True:
        lines = read_log().splitlines()
        for line in lines:
            match = line.startswith(prefix) and pattern.search(line[len(prefix):])
            if match:
                return match
        assert process.poll() is None, "\n".join(lines[-50:])
        assert time.monotonic() < deadline, "%s logged no line matching %r" % (
            source, pattern.pattern)
        time.sleep(0.2)


class LauncherRun:
    """The launcher running in the background with its output in a file, so that a test
    can pause a task (SIGSTOP) until the cluster is in the state it needs."""

    def __init__(self, directory, data_dir, job_dir, trainer_flags, launcher_flags):
        self._log_path = os.path.join(str(directory), "launcher.log")
        with open(self._log_path, "w") as log:
            self._process = start_module(
                LAUNCHER, launcher_args(data_dir, job_dir, trainer_flags, launcher_flags),
                stdout=log, stderr=subprocess.STDOUT)

    def output(self):
        with open(self._log_path) as stream:
            return stream.read()

    def wait_for(self, name, pattern):
        """The match of `pattern` in the first line of task `name` that has one, waiting for it."""
        return wait_for_line(self._process, self.output, pattern, name, prefix="[%s] " % name)

    def send_signal(self, name, signal_number):
        pid = re.search(r"^\[launcher\] started %s \(pid (\d+)\)$" % name, self.output(), re.M)
        os.kill(int(pid.group(1)), signal_number)

    def start_trainers_together(self, names, timeout_secs=180):
        """Pause (SIGSTOP) each trainer in `names` at its first step until all have
        stepped, then let them all go on at once.

        Without --sync a trainer could otherwise train alone while the others start, even
        to the end of the run, and the others report no rate: TensorFlow delays the
        workers by 5 s each on purpose, and a loaded machine by more, in no fixed order.
        The last one is paused too: on a busy machine the others' SIGCONT can come
        seconds after its first step, and it would train alone meanwhile.

        Returns the names in the order of their first steps.
        """
        first_step = {name: re.compile(r"^\[%s\] .*%s" % (name, LOSS_AT_STEP.pattern), re.M)
                      for name in names}
        deadline = time.monotonic() + timeout_secs
        stepped = []
        while len(stepped) < len(names):
            output = self.output()
            for name in names:
                if name not in stepped and first_step[name].search(output):
                    stepped.append(name)
                    self.send_signal(name, signal.SIGSTOP)
            assert self._process.poll() is None, output[-8000:]
            assert time.monotonic() < deadline, "only %s of %s stepped" % (stepped, names)
            time.sleep(0.2)
        for name in stepped:
            self.send_signal(name, signal.SIGCONT)
        return stepped

    def wait(self, timeout_secs=300):
        """The launcher's exit status, once it exited."""
        return self._process.wait(timeout_secs)

    def kill(self):
        """Kill the launcher, and so its tasks (they die with it)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()


@pytest.fixture
def start_launcher(tmp_path):
    """start_launcher(data_dir, job_dir, *trainer_flags, launcher_flags=()): a LauncherRun,
    killed at the end of the test."""
    runs = []

    def start(data_dir, job_dir, *trainer_flags, launcher_flags=()):
        runs.append(LauncherRun(tmp_path, data_dir, job_dir, trainer_flags, launcher_flags))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()


def task_lines(output, name):
    prefix = "[%s] " % name
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def loss_steps(lines):
    return [int(match.group(1)) for match in map(LOSS_AT_STEP.search, lines) if match]


def rate_reports(output, name):
    """[(g, own, cluster)] for each rate trainer `name` reported: the global step it
    logged with it, and the batches it and the whole cluster trained since its clock
    started. "Average examples/sec: A (C), step = S" averages its first S timed steps
    (own = S, over S / A seconds per example); the "Cluster examples/sec: A' (C'),
    global step = g" line logged with it averages over the same time, so cluster = A' S / A.
    """
    reports = []
    own_report = None
    for line in task_lines(output, name):
        own, cluster = WORKER_RATE.search(line), CLUSTER_RATE.search(line)
        if own:
            own_report = (int(own.group(3)), float(own.group(1)))
        elif cluster and own_report:
            steps, rate = own_report
            reports.append((int(cluster.group(3)), steps, float(cluster.group(1)) * steps / rate))
            own_report = None
    return reports


def assert_trainers_report_the_cluster_rate_beside_their_own(output, trainers,
                                                             batches_per_global_step):
    """Each trainer's cluster examples/sec is over the same time as its own, and counts
    `batches_per_global_step` batches per global step (1 without --sync; with it, one of
    every trainer).

    From each report, the cluster's batches since the trainer's clock started are A' S / A
    (rate_reports); they must be batches_per_global_step x (g - g0) for one g0 per
    trainer, the global step at its clock's start: exact but for the six digits %g prints.
    This guards against a trainer printing the cluster's rate as its own (g0 would move
    with the other trainers' steps) and a --sync cluster rate counting one batch per
    global step (a third of the batches). It checks counts, not times, so a pause
    (start_trainers_together) or a starved trainer changes nothing. An earlier check
    summed the trainers' own rates over a stretch of global steps every trainer reported
    across and compared them with the cluster's: one CI run (2026-11-27) failed it
    because the async chief made fewer than 20 of the 400 steps and reported once (on 2
    cores the chief can make few steps for seconds while the workers make hundreds;
    another run's chief made fewer than 11 of 200 and reported none). A trainer's one
    report still says where its clock started; at least two trainers must report more
    than once.
    """
    reports = {name: rate_reports(output, name) for name in trainers}
    assert sum(len(each) >= 2 for each in reports.values()) >= 2, reports
    for name, each in reports.items():
        if not each:  # made fewer than 11 steps: its clock started, no interval ended
            continue
        starts = [g - cluster / batches_per_global_step for g, _, cluster in each]
        start = round(starts[0])
        assert all(abs(each_start - start) < 0.05 for each_start in starts), (name, each)
        # Since its clock started, the cluster made at least this trainer's own steps.
        assert start >= 0 and all(g - start >= own / batches_per_global_step
                                  for g, own, _ in each), (name, each)


def assert_only_the_chief_saves(output, job_dir, num_workers=2):
    """Only the chief saves and writes summaries; hparams.json counts the `num_workers`
    trainers (the chief and every worker)."""
    assert any("Saving checkpoints" in line for line in task_lines(output, "chief"))
    for index in range(num_workers - 1):
        assert not any("Saving checkpoints" in line
                       for line in task_lines(output, "worker%d" % index))
    events = [name for name in os.listdir(str(job_dir)) if name.startswith("events.out.tfevents")]
    # The training summaries' file, and the hyper-parameters' for TensorBoard's dashboard.
    assert len([name for name in events if not name.endswith(".hparams")]) == 1
    assert len([name for name in events if name.endswith(".hparams")]) == 1
    with open(os.path.join(str(job_dir), "hparams.json")) as stream:
        assert json.load(stream)["runs"][-1]["hparams"]["num_workers"] == num_workers


PLACEMENT = re.compile(r"(?:\] )?(\S+): \((\w+)\): (/job:\S+)$")
COMPUTE_OPS = ("Conv2D", "Conv2DBackpropFilter", "FusedBatchNormV3", "MatMul")


def placements(lines):
    """[(op name, op type, device)] from --log-device-placement lines."""
    return [match.groups() for match in map(PLACEMENT.search, lines) if match]


AVERAGE_SUFFIX = "/ExponentialMovingAverage"


def averages_and_weights(checkpoint):
    """{weight name: (its moving average, its value)} of a checkpoint."""
    reader = tf.train.load_checkpoint(checkpoint)
    return {name[:-len(AVERAGE_SUFFIX)]: (reader.get_tensor(name),
                                          reader.get_tensor(name[:-len(AVERAGE_SUFFIX)]))
            for name in reader.get_variable_to_shape_map() if name.endswith(AVERAGE_SUFFIX)}


def assert_sync_trainers_step_together_on_their_towers(output, job_dir):
    """A --sync run of the chief and two workers, each with two CPU towers: every update
    waits for a gradient of each, so all start at step 0 and the chief does not hang on at
    the end; each keeps its local step and its towers' compute on its own devices."""
    trainers = [("chief", "chief", 0), ("worker0", "worker", 0), ("worker1", "worker", 1)]
    for name, _, _ in trainers:
        assert loss_steps(task_lines(output, name))[0] == 0, name
    assert "Coordinator stopped with threads still running" not in output
    assert_only_the_chief_saves(output, job_dir, num_workers=3)
    assert_trainers_report_the_cluster_rate_beside_their_own(
        output, [name for name, _, _ in trainers], batches_per_global_step=len(trainers))
    for name, job, index in trainers:
        device = "/job:%s/replica:0/task:%d/device:CPU:%%d" % (job, index)
        placed = placements(task_lines(output, name))
        variables = {op: place for op, op_type, place in placed if op_type == "VarHandleOp"}
        # SyncReplicasOptimizer keeps each trainer's local step on the trainer itself.
        assert variables.pop("sync_rep_local_step") == device % 0
        assert "global_step" in variables and "resnet/conv2d/kernel" in variables
        assert set(variables.values()) <= {"/job:ps/replica:0/task:%d/device:CPU:0" % ps
                                           for ps in (0, 1)}, variables
        towers = {(re.search(r"/tower_(\d)/", op).group(1), place)
                  for op, op_type, place in placed
                  if op_type in COMPUTE_OPS and "/tower_" in op}
        assert towers == {("0", device % 0), ("1", device % 1)}, (name, towers)


def pause_the_chief_until_the_evaluator_starts(run):
    """The chief, which could write the final checkpoint before the evaluator is up, is
    paused (SIGSTOP) at its first step until the evaluator starts on a first checkpoint."""
    run.wait_for("chief", LOSS_AT_STEP)
    run.send_signal("chief", signal.SIGSTOP)
    run.wait_for("evaluator", EVALUATION_STARTED)
    run.send_signal("chief", signal.SIGCONT)


def assert_evaluator_took_up_the_final_checkpoint_at_once(output, job_dir, final_step,
                                                           exited_at):
    """With the default --eval-every-secs (600), the evaluator's first evaluation starts
    its wait; the checkpoints written during it are skipped, the final one is not: it is
    evaluated, and tested, as soon as it is written: the cluster exits within the seconds
    that takes (60 s: several times that on a loaded machine), not after the 600 s wait."""
    final_checkpoint_written_at = os.path.getmtime(
        str(job_dir / ("model.ckpt-%d.index" % final_step)))
    assert exited_at - final_checkpoint_written_at < 60
    evaluated = sorted(eval_metrics(job_dir))
    assert len(evaluated) == 2 and evaluated[0] < evaluated[1] == final_step, evaluated
    with open(str(job_dir / "test_results.json")) as stream:
        assert json.load(stream)["global_step"] == final_step
    assert any(line.startswith("INFO:tensorflow:Test accuracy: ")
               for line in task_lines(output, "evaluator"))


def assert_async_trainers_each_train_and_evaluator_takes_the_final_step(
        output, job_dir, trainers, train_steps):
    """A run without --sync of the chief and two workers, `trainers` in the order of their
    first steps, with an evaluator: each trainer steps and says where the cluster's run
    is, only the chief saves, each reports the cluster's rate beside its own, and the
    evaluator evaluates the final checkpoint; returns its step."""
    for name in trainers:
        assert loss_steps(task_lines(output, name)), "%s did no step" % name
    final_step = assert_async_final_step(job_dir, train_steps, num_trainers=3)
    # A worker may step while the chief saves its last checkpoint, so the global step
    # stored in it (which the evaluation reports) can be past the one in its name.
    evaluated_step = max(eval_metrics(job_dir))
    assert final_step <= evaluated_step <= train_steps + 2 * 3
    assert 0.0 <= eval_metrics(job_dir)[evaluated_step]["accuracy"] <= 1.0
    assert any("Exiting evaluation, global_step=%d" % evaluated_step in line
               for line in task_lines(output, "evaluator"))
    assert_only_the_chief_saves(output, job_dir, num_workers=3)
    assert_trainers_report_the_cluster_rate_beside_their_own(output, trainers,
                                                             batches_per_global_step=1)
    # Every trainer says where the cluster's run is, in global steps of the cluster.
    for name in trainers:
        assert any(re.search(r"step \d+/%d \(\d+ %%\), (\d+ examples/sec, about .* to go|"
                             r"time to go not known yet)$" % train_steps, line)
                   for line in task_lines(output, name)), name
    return final_step


@many_processes
@pytest.mark.slow
@pytest.mark.parametrize("mode_flags", [
    # Steps enough for each trainer to report its rate (every 10 of its steps) a few times.
    ("--train-steps", "200"),
    # 20 epochs of 64 examples at 3 trainers x 8 per step end at step 40; the evaluator,
    # which trains nothing, must count the trainers too to know it. Each trainer splits
    # its batch over two CPU towers. The evaluator waits the default time between
    # evaluations, and so must take up the final checkpoint at once however long that is.
    ("--sync", "--train-epochs", "20", "--num-cpu-towers", "2",
     "--save-checkpoints-steps", "10", "--eval-every-secs", str(DEFAULT_EVAL_EVERY_SECS)),
], ids=["async", "sync"])
def test_two_ps_cluster_trains_on_each_trainer_evaluates_and_its_checkpoint_serves_on_one_machine(
        tiny_data_dir, tmp_path, start_launcher, mode_flags):
    job_dir = tmp_path / "job"
    run = start_launcher(tiny_data_dir, job_dir, "--log-device-placement",
                         "--moving-average-decay", "0.9", *mode_flags,
                         launcher_flags=["--num-ps", "2", "--num-workers", "2"])
    trainers = ["chief", "worker0", "worker1"]
    if "--sync" in mode_flags:
        assert DEFAULT_EVAL_EVERY_SECS == 600
        # The first update already waits for a gradient of every trainer.
        pause_the_chief_until_the_evaluator_starts(run)
    else:
        trainers = run.start_trainers_together(trainers)
    status = run.wait()
    exited_at = time.time()
    output = run.output()
    assert status == 0, output[-8000:]
    assert "[launcher] done" in output
    assert "Traceback" not in output

    # tf.estimator's device function deals the variables out to the ps tasks in turn,
    # as they are created; an optimizer's slot variables (Momentum) and the weights'
    # moving averages sit with theirs.
    placed = placements(task_lines(output, "chief"))
    handles = {op: device for op, op_type, device in placed if op_type == "VarHandleOp"}
    beside = {op: device for op, device in handles.items()
              if op.endswith(("/Momentum", AVERAGE_SUFFIX))}
    assert any(op.endswith(AVERAGE_SUFFIX) for op in beside), sorted(handles)
    for op, device in beside.items():
        assert device == handles[op.rsplit("/", 1)[0]], op
    variables = {op: device for op, device in handles.items()
                 if op not in beside and op != "sync_rep_local_step"}
    per_ps = collections.Counter(variables.values())
    assert set(per_ps) == {"/job:ps/replica:0/task:%d/device:CPU:0" % index
                           for index in (0, 1)}, variables
    assert max(per_ps.values()) - min(per_ps.values()) <= 1, per_ps

    if "--sync" in mode_flags:
        final_step = checkpoint_steps(job_dir)[-1]
        assert final_step == 40
        assert_sync_trainers_step_together_on_their_towers(output, job_dir)
        assert_evaluator_took_up_the_final_checkpoint_at_once(output, job_dir, final_step,
                                                              exited_at)
    else:
        final_step = assert_async_trainers_each_train_and_evaluator_takes_the_final_step(
            output, job_dir, trainers, 200)
    with open(str(job_dir / "test_results.json")) as stream:
        results = json.load(stream)
    assert results["global_step"] >= final_step
    assert results["weights"] == "moving average, decay 0.9"

    # The newest export holds the averages of the checkpoint it was made of as its weights
    # (in an async run the last evaluated checkpoint may not be the last one written).
    export_dir = export_dirs.resolve_export_dir(str(job_dir / "export" / "latest"))
    exported = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    checkpoints = tf.train.get_checkpoint_state(str(job_dir)).all_model_checkpoint_paths
    exported_checkpoints = [
        pairs for pairs in map(averages_and_weights, checkpoints)
        if pairs and all(np.array_equal(exported.get_tensor(name), average)
                         for name, (average, _) in pairs.items())]
    assert exported_checkpoints, "the export holds no checkpoint's averages"
    assert any(not np.array_equal(average, weight)
               for average, weight in exported_checkpoints[-1].values())

    if "--sync" in mode_flags:
        # A --sync run's checkpoint holds the same variables as an async run's (the
        # sync optimizer's local step and token queue are not saved), so serving it is
        # checked once, on the async run.
        return
    # A checkpoint sharded over two ps restores in one process, and so does its export.
    evaluated = run_module("cifar10_estimator.serving.evaluate",
                           ["--job-dir", job_dir, "--data-dir", tiny_data_dir], timeout=180)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert re.search(r"^accuracy: [0-9.]+ \(\d+/32\)$", evaluated.stdout, re.M), evaluated.stdout
    assert "weights: moving average, decay 0.9" in evaluated.stdout
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(np.zeros([32, 32, 3], np.uint8) + 128).numpy())
    predicted = run_module("cifar10_estimator.serving.predict",
                           ["--export-dir", job_dir, image], timeout=180)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    path, class_name, probability = predicted.stdout.strip().split("\t")
    assert path == str(image) and class_name in cifar10.CLASS_NAMES
    assert 0.0 < float(probability) <= 1.0


class TaskProcesses:
    """Tasks of one cluster started by hand, each logging to its own file; all killed at the end."""

    def __init__(self, directory, num_workers=1):
        self._directory = directory
        self.cluster_spec = local_cluster.make_cluster(
            1, num_workers, local_cluster.free_ports(2 + num_workers))
        self._processes = []

    def start(self, task, args, log_name=None):
        log_path = self.log_path(log_name or task.name)
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                local_cluster.trainer_command(args), cwd=REPO_ROOT,
                env=local_cluster.task_environment(self.cluster_spec, task, cli_env()),
                stdout=log, stderr=subprocess.STDOUT, universal_newlines=True)
        self._processes.append(process)
        return process

    def log_path(self, log_name):
        return os.path.join(str(self._directory), log_name + ".log")

    def log(self, log_name):
        with open(self.log_path(log_name)) as stream:
            return stream.read()

    def wait_for(self, process, log_name, pattern):
        """The match of `pattern` in the first line of the task's log that has one,
        waiting for it while the task runs."""
        return wait_for_line(process, lambda: self.log(log_name), pattern, log_name)

    def wait_for_step(self, process, log_name):
        """First global step the task logged a loss at, waiting for it."""
        return int(self.wait_for(process, log_name, LOSS_AT_STEP).group(1))

    def kill_all(self):
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.fixture
def task_processes(tmp_path):
    processes = TaskProcesses(tmp_path)
    yield processes
    processes.kill_all()


@many_processes
@pytest.mark.slow
def test_killed_sync_worker_restarts_and_rejoins_training(tiny_data_dir, tmp_path,
                                                          task_processes):
    """A --sync worker killed mid-run leaves the update it was computing or its token
    behind. (Without --sync a vanished worker leaves nothing: the SIGTERM test of
    test_interruptions.py restarts one there and checks that it rejoins.)"""
    job_dir = tmp_path / "job"
    args = trainer_args(tiny_data_dir, job_dir, "--train-steps", "150", "--sync")
    task_processes.start(Task("ps", 0), args)
    chief = task_processes.start(Task("chief"), args)
    worker = task_processes.start(Task("worker", 0), args)
    # The chief's first step already waited for the worker's first gradient; it is paused
    # (SIGSTOP) until the worker logged its own, so that no update comes meanwhile.
    task_processes.wait_for_step(chief, "chief")
    chief.send_signal(signal.SIGSTOP)
    first_step = task_processes.wait_for_step(worker, "worker0")
    chief.send_signal(signal.SIGCONT)
    # The kill comes once the worker has seen the global step move on, 10 steps later.
    step_seen = int(task_processes.wait_for(worker, "worker0", CLUSTER_RATE).group(3))
    worker.send_signal(signal.SIGKILL)
    worker.wait()

    # While the worker restarts the chief could finish the run alone when the worker
    # died waiting for its token, which the chief then takes to give both gradients of
    # each update itself. So it is paused until the restarted worker's session is up,
    # as its first step waits for an update that the chief's thread applies. The chief
    # would need over a hundred steps to finish alone from there, the worker one to
    # rejoin.
    chief.send_signal(signal.SIGSTOP)
    restarted = task_processes.start(Task("worker", 0), args, "worker0-restarted")
    task_processes.wait_for(restarted, "worker0-restarted", SESSION_CREATED)
    chief.send_signal(signal.SIGCONT)
    rejoined_step = task_processes.wait_for_step(restarted, "worker0-restarted")

    assert chief.wait(180) == 0, task_processes.log("chief")[-3000:]
    assert restarted.wait(60) == 0, task_processes.log("worker0-restarted")[-3000:]
    # It went on from the shared variables, from where the killed worker left them.
    assert rejoined_step >= step_seen > first_step
    # Synchronous updates end exactly at --train-steps.
    assert checkpoint_steps(job_dir)[-1] == 150


@many_processes
@pytest.mark.slow
def test_chief_gives_up_on_a_ps_that_never_starts(tiny_data_dir, tmp_path):
    chief_port, ps_port = local_cluster.free_ports(2)
    spec = {"ps": ["127.0.0.1:%d" % ps_port], "chief": ["127.0.0.1:%d" % chief_port]}
    result = run_module(MODULE, trainer_args(tiny_data_dir, tmp_path / "job",
                                             "--ps-timeout-secs", "2"),
                        env={"TF_CONFIG": tf_config(spec, "chief")}, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.rstrip().splitlines()[-1].startswith(
        "python -m cifar10_estimator.main: error: cannot reach the parameter server ps:0 "
        "(127.0.0.1:%d) after 2 s" % ps_port)


@many_processes
@pytest.mark.slow
def test_tf1_master_trains_and_evaluates_in_process(tiny_data_dir, tmp_path):
    job_dir = tmp_path / "job"
    ps_port, master_port = local_cluster.free_ports(2)
    spec = {"ps": ["127.0.0.1:%d" % ps_port], "master": ["127.0.0.1:%d" % master_port]}
    args = trainer_args(tiny_data_dir, job_dir, "--train-steps", "20")
    with open(str(tmp_path / "ps.log"), "w") as ps_log:
        ps = start_module(MODULE, args, env={"TF_CONFIG": tf_config(spec, "ps")},
                          stdout=ps_log, stderr=subprocess.STDOUT)
    try:
        result = run_module(MODULE, args, env={"TF_CONFIG": tf_config(spec, "master")},
                            timeout=300)
    finally:
        ps.kill()
        ps.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    assert checkpoint_steps(job_dir)[-1] == 20
    assert 0.0 <= eval_metrics(job_dir)[20]["accuracy"] <= 1.0


def test_with_a_seed_each_trainer_of_a_cluster_draws_its_own_batches():
    addresses = {"ps": ["127.0.0.1:1"], "chief": ["127.0.0.1:2"],
                 "worker": ["127.0.0.1:3", "127.0.0.1:4"]}
    seeds = [trainer.graph_seed(5, cluster.ClusterTask(task_type, index, addresses))
             for task_type, index in (("chief", 0), ("worker", 0), ("worker", 1))]
    assert seeds == [5, 6, 7]
    assert trainer.graph_seed(5) == 5
    assert trainer.graph_seed(None, cluster.ClusterTask("worker", 1, addresses)) is None
