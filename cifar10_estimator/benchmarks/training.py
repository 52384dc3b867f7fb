"""Training throughput of real runs, interleaved: the trainer CLI and Keras model.fit.

The runs compared with each other start together as child processes (`python -m
cifar10_estimator.main ...`, `python -m cifar10_estimator.benchmarks.keras_peer ...`). Each
logs every 10 steps the trainer's ExamplesPerSecondHook line
`Average examples/sec: A (C), step = S`, C being the rate over the 10 steps ending at S.
A run that reaches warmup_steps is paused (SIGSTOP). The runs then take turns, one
10-step interval each while the others stay paused (A B C, C B A, A B C, ...: rounds of
alternating_rounds), until each has run timed_steps; at the end all resume together, the
trainers told to stop (SIGTERM: each saves the step in flight and exits, skipping the
final evaluation and export, which measure nothing here) and the Keras runs left to end
their fit and print their result. So whatever else loads a shared machine (other
processes, or neighbours on the host that no counter shows) falls on every run alike,
interval by interval, and a ratio is the median of the ratios of intervals run back to
back. An interval's time is the child's own minus the time it was paused within it.
Start-up, graph building, warm-up steps and the final checkpoint are never timed. Memory is
each child's peak RSS (VmHWM) and CPU its whole process's, read until it exits.
"""

import collections
import dataclasses
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from cifar10_estimator.benchmarks import host
from cifar10_estimator.benchmarks import keras_peer
from cifar10_estimator.cli.child_process import child_environment
from cifar10_estimator.errors import Cifar10EstimatorError, stopped_exit_status
from cifar10_estimator.machine import alternating_rounds

HOOK_LINE = re.compile(r"Average examples/sec: [0-9.e+]+ \(([0-9.e+]+)\), step = (\d+)")
LOG_EVERY_N_STEPS = 10
# Longer than any run: the final checkpoint is the only one after step 0, and it is
# evaluated once (train_and_evaluate always evaluates it); no evaluation mid-run.
NO_EVAL_UNTIL_THE_END_SECS = 10 ** 9
EVAL_BATCH_SIZE = 100
# The exit status of a trainer stopped by SIGTERM after saving its step.
TRAINER_STOPPED_STATUS = stopped_exit_status(signal.SIGTERM)
# How often to read the children's peak memory while they finish.
MEMORY_SAMPLE_SECS = 0.05
# How long to wait for a run's next logged interval before giving up.
LINE_TIMEOUT_SECS = 3600


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """One configuration to measure: a trainer or Keras run of one model and batch.

    kind is 'estimator' or 'keras'; data is 'tfrecords' or 'synthetic' (estimator only);
    extra_flags are appended to the child's command line, extra_env to its environment
    (pairs of strings).
    """

    name: str
    kind: str
    num_layers: int
    batch_size: int
    data: str = "tfrecords"
    num_cpu_towers: int = 1
    extra_flags: tuple = ()
    extra_env: tuple = ()

    def description(self):
        extras = "".join(" " + flag for flag in self.extra_flags) + "".join(
            " %s=%s" % pair for pair in self.extra_env)
        if self.kind == "keras":
            return "Keras model.fit, TFRecords (Cifar10DataSet)" + extras
        data = "TFRecords" if self.data == "tfrecords" else "--use-synthetic-data"
        towers = "%d CPU towers" % self.num_cpu_towers if self.num_cpu_towers > 1 else "1 tower"
        return "Estimator trainer, %s, %s%s" % (data, towers, extras)


@dataclasses.dataclass
class Measurement:
    """One run's timed intervals and what its whole process cost.

    interval_examples_per_sec[k] was measured in turn k, back to back with the other
    runs' turn k; background_cpu_shares[k] is the share of all cores other processes
    took meanwhile (None where unknown).
    """

    interval_examples_per_sec: list
    background_cpu_shares: list
    cpu_secs: float
    max_rss_mb: float
    details: dict = dataclasses.field(default_factory=dict)

    @property
    def examples_per_sec(self):
        """Over all timed intervals: examples over seconds (every interval has 10 steps)."""
        rates = self.interval_examples_per_sec
        return len(rates) / sum(1.0 / rate for rate in rates)

    @property
    def timed_steps(self):
        return LOG_EVERY_N_STEPS * len(self.interval_examples_per_sec)

    @property
    def mean_background_cpu_share(self):
        known = [share for share in self.background_cpu_shares if share is not None]
        return sum(known) / len(known) if known else None


def total_steps(warmup_steps, timed_steps):
    """Steps a run takes: the loggers start counting after the first step, so one more
    logging interval makes sure the window is covered."""
    return warmup_steps + timed_steps + LOG_EVERY_N_STEPS


def trainer_argv(run, data_dir, job_dir, warmup_steps, timed_steps):
    """Command line of the real trainer for `run`."""
    train_steps = total_steps(warmup_steps, timed_steps)
    data_flags = (["--use-synthetic-data"] if run.data == "synthetic"
                  else ["--data-dir", data_dir])
    # --verbose: the throughput lines this reads as they come are TensorFlow's log.
    return ([sys.executable, "-m", "cifar10_estimator.main", "--verbose"] + data_flags + [
        "--job-dir", job_dir, "--num-gpus", "0", "--num-cpu-towers", str(run.num_cpu_towers),
        "--num-layers", str(run.num_layers), "--train-batch-size", str(run.batch_size),
        "--eval-batch-size", str(EVAL_BATCH_SIZE), "--train-steps", str(train_steps),
        "--save-checkpoints-steps", str(train_steps),
        "--eval-every-secs", str(NO_EVAL_UNTIL_THE_END_SECS)] + list(run.extra_flags))


def keras_argv(run, data_dir, warmup_steps, timed_steps):
    return [sys.executable, "-m", "cifar10_estimator.benchmarks.keras_peer", "--data-dir", data_dir,
            "--num-layers", str(run.num_layers), "--batch-size", str(run.batch_size),
            "--steps", str(total_steps(warmup_steps, timed_steps))] + list(run.extra_flags)


class _Child:
    """A run's process; a thread copies its output to a log and queues its logged intervals."""

    def __init__(self, index, argv, env, log_path, events):
        self.index = index
        self.log_path = log_path
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        env=env, universal_newlines=True, bufsize=1)
        self.paused_at = None
        self.last_step = 0
        self.max_rss_mb = None
        self._events = events
        self._thread = threading.Thread(target=self._copy_output, daemon=True)
        self._thread.start()

    def _copy_output(self):
        with open(self.log_path, "w") as log:
            for line in self.process.stdout:
                log.write(line)
                match = HOOK_LINE.search(line)
                if match:
                    self._events.put((self.index, int(match.group(2)), float(match.group(1))))
        self._events.put((self.index, None, None))

    def pause(self):
        self.process.send_signal(signal.SIGSTOP)
        self.paused_at = time.perf_counter()

    def resume(self):
        """Continue the process; returns how long it was paused."""
        self.process.send_signal(signal.SIGCONT)
        paused_secs = time.perf_counter() - self.paused_at if self.paused_at else 0.0
        self.paused_at = None
        return paused_secs

    def sample_memory(self):
        """Update max_rss_mb from the process's peak so far; False once it has exited."""
        if host.has_exited(self.process.pid):
            return False
        peak = host.peak_rss_mb(self.process.pid)
        if peak is not None:
            self.max_rss_mb = max(peak, self.max_rss_mb or 0.0)
        return True

    def finish(self):
        """Reap the exited process; returns (exit status, its CPU seconds, peak RSS in MB)."""
        _, status, usage = os.wait4(self.process.pid, 0)
        self.process.returncode = os.waitstatus_to_exitcode(status)
        self._thread.join()
        self.process.stdout.close()
        return self.process.returncode, usage.ru_utime + usage.ru_stime, self.max_rss_mb

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class _Interleaving:
    """The children of one comparison and the queue of intervals they log."""

    def __init__(self, runs, argvs, envs, log_paths):
        self.runs = runs
        self.events = queue.Queue()
        self.pending = collections.defaultdict(collections.deque)
        self.children = []
        for index, (argv, env, log_path) in enumerate(zip(argvs, envs, log_paths)):
            self.children.append(_Child(index, argv, env, log_path, self.events))

    def next_interval(self, index):
        """(end step, examples/sec) of the next interval child `index` logs.

        Raises:
          Cifar10EstimatorError: the child ended or logged nothing for LINE_TIMEOUT_SECS.
        """
        while not self.pending[index]:
            try:
                child_index, step, rate = self.events.get(timeout=LINE_TIMEOUT_SECS)
            except queue.Empty:
                child_index, step = index, None
            if step is None and child_index == index:
                raise Cifar10EstimatorError("%s stopped logging its throughput; see its log %s"
                                            % (self.runs[index].name,
                                               self.children[index].log_path))
            if step is not None:
                self.pending[child_index].append((step, rate))
        return self.pending[index].popleft()

    def warm_up(self, warmup_steps):
        """Let every child run until it has logged step warmup_steps, pausing each then."""
        paused = set()
        while len(paused) < len(self.children):
            try:
                index, step, _ = self.events.get(timeout=LINE_TIMEOUT_SECS)
            except queue.Empty:
                index, step = min(set(range(len(self.children))) - paused), None
            if step is None:
                raise Cifar10EstimatorError("%s stopped before its warm-up ended; see its log %s"
                                            % (self.runs[index].name,
                                               self.children[index].log_path))
            child = self.children[index]
            # A line logged just before the pause took effect still ends a warm-up interval.
            child.last_step = max(child.last_step, step)
            if step >= warmup_steps and index not in paused:
                child.pause()
                paused.add(index)

    def take_turn(self, index, batch_size):
        """Resume child `index` for one logged interval; returns (examples/sec, others' share)."""
        child = self.children[index]
        busy, own = (host.cpu_busy_secs(),
                     host.process_cpu_secs(child.process.pid))
        start = time.perf_counter()
        paused_secs = child.resume()
        step, rate = self.next_interval(index)
        child.pause()
        wall_secs = time.perf_counter() - start
        busy_now, own_now = (host.cpu_busy_secs(),
                             host.process_cpu_secs(child.process.pid))
        examples = batch_size * (step - child.last_step)
        child.last_step = step
        # The child's interval ran from its previous line, including the pause since then.
        active_secs = examples / rate - paused_secs
        share = None
        if None not in (busy, own, busy_now, own_now):
            others = (busy_now - busy) - (own_now - own)
            share = max(0.0, others) / (wall_secs * (os.cpu_count() or 1))
        return examples / active_secs, share

    def finish(self):
        """Stop every trainer, let every Keras run end, and wait for each; returns
        [(status, CPU secs, peak RSS MB)].

        A paused trainer takes the SIGTERM as it resumes: it ends after the step in flight,
        saved, with TRAINER_STOPPED_STATUS. Its final evaluation and export would add CPU
        seconds and memory that are not training's (Keras runs have neither).
        """
        for child, run in zip(self.children, self.runs):
            if run.kind == "estimator":
                child.process.send_signal(signal.SIGTERM)
            child.resume()
        running = list(self.children)
        while running:
            # The peak is readable only while a child lives; sample all until each exits.
            running = [child for child in running if child.sample_memory()]
            time.sleep(MEMORY_SAMPLE_SECS)
        return [child.finish() for child in self.children]

    def kill(self):
        for child in self.children:
            child.kill()


def measure_interleaved(runs, data_dir, work_dir, warmup_steps, timed_steps, report=None):
    """Measure `runs` (same batch size) by turns of one logged interval each.

    Args:
      runs: TrainingRuns, all with the same batch_size.
      data_dir: the TFRecords the runs read.
      work_dir: for the runs' job directories and logs (logs of failed runs are kept).
      warmup_steps, timed_steps: multiples of LOG_EVERY_N_STEPS.
      report: optional function(turn_index, run, examples_per_sec, background_share).

    Returns:
      dict run name -> Measurement.

    Raises:
      Cifar10EstimatorError: a run failed or stopped logging.
    """
    if warmup_steps % LOG_EVERY_N_STEPS or timed_steps % LOG_EVERY_N_STEPS or not timed_steps:
        raise ValueError("warmup_steps and timed_steps must be multiples of %d"
                         % LOG_EVERY_N_STEPS)
    job_dirs = [tempfile.mkdtemp(prefix="job.", dir=work_dir) for _ in runs]
    log_paths = [os.path.join(job_dir, "output.log") for job_dir in job_dirs]
    argvs = [keras_argv(run, data_dir, warmup_steps, timed_steps) if run.kind == "keras"
             else trainer_argv(run, data_dir, os.path.join(job_dir, "job"), warmup_steps,
                               timed_steps)
             for run, job_dir in zip(runs, job_dirs)]
    interleaving = _Interleaving(
        runs, argvs, [child_environment(dict(run.extra_env)) for run in runs], log_paths)

    def turn_of(index):
        return lambda: interleaving.take_turn(index, runs[index].batch_size)

    def report_turn(turn, index, measurement):
        if report:
            report(turn, runs[index], *measurement)

    try:
        interleaving.warm_up(warmup_steps)
        turns = alternating_rounds.measure(
            {index: turn_of(index) for index in range(len(runs))},
            timed_steps // LOG_EVERY_N_STEPS, report=report_turn)
        outcomes = interleaving.finish()
    except BaseException:
        interleaving.kill()
        raise
    measurements = {}
    for index, (run, (status, cpu_secs, max_rss_mb)) in enumerate(zip(runs, outcomes)):
        if status != (TRAINER_STOPPED_STATUS if run.kind == "estimator" else 0):
            raise Cifar10EstimatorError("%s exited with status %d; see its log %s"
                                        % (run.name, status, log_paths[index]))
        details = _keras_result(log_paths[index]) if run.kind == "keras" else {}
        rates, shares = zip(*turns[index].measurements)
        measurements[run.name] = Measurement(list(rates), list(shares), cpu_secs, max_rss_mb,
                                             details)
    for job_dir in job_dirs:
        shutil.rmtree(job_dir, ignore_errors=True)
    return measurements


def _keras_result(log_path):
    with open(log_path) as log:
        for line in log:
            if line.startswith(keras_peer.RESULT_PREFIX):
                return json.loads(line[len(keras_peer.RESULT_PREFIX):])
    raise Cifar10EstimatorError("the Keras run printed no result; see its log %s" % log_path)
