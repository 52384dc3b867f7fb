"""A run that survives its machine: stop signals, resumes, a diverging loss, a full disk.

Every test runs the real trainer in a subprocess on tiny ResNet-8 jobs and sends real
signals; the disk tests mount real tmpfs file systems (as root only, else skipped).
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import cifar_archives
from cli_helpers import REPO_ROOT, cli_env, many_processes, run_module
from test_training import resume_step

MODULE = "cifar10_estimator.main"
PROGRAM = "python -m cifar10_estimator.main"
STEP_LOGGED = re.compile(r"\bstep = (\d+)$")
EVALUATION_STARTED = re.compile(r"\bStarting evaluation at ")
STOPPED_AT_STEP = re.compile(
    r"^python -m cifar10_estimator\.main: stopped by (SIGTERM|SIGINT) at step (\d+): saved "
    r"(\S+); the same command resumes from it$")


def job_args(data_dir, job_dir, *extra):
    # --verbose: the tests follow the steps in TensorFlow's log as it comes.
    return ["--data-dir", data_dir, "--job-dir", job_dir, "--num-gpus", "0", "--verbose",
            "--num-layers", "8", "--train-batch-size", "16", "--eval-batch-size", "16"
            ] + list(extra)


class Trainer:
    """The trainer running in a subprocess, its stderr read line by line as it comes."""

    def __init__(self, args):
        self.lines = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", MODULE] + [str(arg) for arg in args], cwd=REPO_ROOT,
            env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            universal_newlines=True, bufsize=1)

    def wait_for(self, pattern, timeout_secs=240):
        """The match of the first new line matching `pattern`, reading until it comes.

        timeout_secs: a hang guard (cli_helpers): then the trainer is killed, which ends
        the reading, even of a trainer that hangs without a line.
        """
        hang_guard = threading.Timer(timeout_secs, self.process.kill)
        hang_guard.start()
        try:
            for line in self.process.stderr:
                self.lines.append(line.rstrip("\n"))
                match = pattern.search(self.lines[-1])
                if match:
                    return match
        finally:
            hang_guard.cancel()
        raise AssertionError("the trainer ended (status %s%s) without a line matching %r:\n%s"
                             % (self.process.wait(), ", killed after %d s" % timeout_secs
                                if self.process.returncode == -signal.SIGKILL else "",
                                pattern.pattern, self.log()[-3000:]))

    def wait_for_step(self, at_least):
        """The first global step >= at_least that the log shows, waiting for it."""
        while True:
            step = int(self.wait_for(STEP_LOGGED).group(1))
            if step >= at_least:
                return step

    def finish(self, timeout_secs=240):
        """(exit status, the whole stderr); timeout_secs: a hang guard (cli_helpers)."""
        _, rest = self.process.communicate(timeout=timeout_secs)
        self.lines.extend(rest.splitlines())
        return self.process.returncode, self.log()

    def log(self):
        return "\n".join(self.lines)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


@pytest.fixture
def start_trainer():
    trainers = []

    def start(*args):
        trainers.append(Trainer(args))
        return trainers[-1]

    yield start
    for trainer in trainers:
        trainer.kill()


def our_lines(log):
    """The lines the package prints itself (not TensorFlow's log)."""
    return [line for line in log.splitlines() if line.startswith(PROGRAM + ":")]


def assert_ends_in_one_line(result, status, *fragments):
    """The trainer exited with `status`, no traceback, and one line of its own naming
    `fragments` (TensorFlow's log lines come before it); returns that line."""
    assert result.returncode == status, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = our_lines(result.stderr)
    assert len(lines) == 1 and result.stderr.rstrip().endswith(lines[0]), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def checkpoint_step(path):
    return int(tf.train.load_variable(path, tf.compat.v1.GraphKeys.GLOBAL_STEP))


@pytest.mark.slow
def test_a_second_ctrl_c_ends_the_run_at_once_without_saving(tiny_data_dir, tmp_path,
                                                             start_trainer):
    job_dir = tmp_path / "job"
    trainer = start_trainer(*job_args(tiny_data_dir, job_dir, "--train-steps", "100000"))
    # The training graph is being built: the first Ctrl-C then waits for the first step,
    # and the second comes long before it.
    trainer.wait_for(re.compile(r"\bCalling model_fn\.$"))
    trainer.process.send_signal(signal.SIGINT)
    trainer.wait_for(re.compile(r"SIGINT received"))
    trainer.process.send_signal(signal.SIGINT)
    code, log = trainer.finish()

    assert code == 130, log[-3000:]
    assert our_lines(log)[-1] == "%s: SIGINT again: ending now, without saving" % PROGRAM
    assert tf.train.latest_checkpoint(str(job_dir)) is None


@pytest.mark.slow
# Both signals reach an evaluation through the same StopSignals as a training step (the
# bitwise test stops training with each).
@pytest.mark.parametrize("signal_number, status", [(signal.SIGTERM, 143)], ids=["SIGTERM"])
# The final checkpoint's evaluation on the validation set, or the one test evaluation
# after it.
@pytest.mark.parametrize("subset", ["validation", "eval"])
def test_a_stop_signal_during_an_evaluation_leaves_no_half_result(
        tiny_data_dir, tmp_path, start_trainer, signal_number, status, subset):
    # The data dir is a link: to data whose evaluated subset takes a few seconds to
    # evaluate with 10 views while the signal comes, then to tiny_data_dir (the same
    # training set, the same seed) for the same command to carry on, evaluating 16 or 32
    # examples instead of 2000.
    long_data_dir = tmp_path / "long-evaluation"
    cifar_archives.make_tiny_tfrecords(str(long_data_dir), **{"num_" + subset: 2000})
    data_dir = tmp_path / "data"
    data_dir.symlink_to(long_data_dir, target_is_directory=True)
    job_dir = tmp_path / "job"
    args = job_args(data_dir, job_dir, "--train-steps", "20", "--eval-flips", "--eval-shifts",
                    "1")
    trainer = start_trainer(*args)
    trainer.wait_for(EVALUATION_STARTED)
    if subset == "eval":
        trainer.wait_for(EVALUATION_STARTED)
    trainer.process.send_signal(signal_number)
    code, log = trainer.finish()

    assert code == status, log[-3000:]
    assert "Traceback" not in log
    assert "Finished evaluation" not in log.split("Starting evaluation at")[-1]
    assert our_lines(log)[-1] == (
        "%s: stopped by %s during an evaluation, which was abandoned; the latest checkpoint "
        "is %s/model.ckpt-20, and the same command carries on from it"
        % (PROGRAM, signal.Signals(signal_number).name, job_dir))
    # The evaluation wrote nothing, and nothing was exported after it.
    assert (job_dir / "export").exists() == (subset == "eval")
    assert not (job_dir / "test_results.json").exists()

    data_dir.unlink()
    data_dir.symlink_to(tiny_data_dir, target_is_directory=True)
    result = run_module(MODULE, args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (job_dir / "test_results.json").exists()
    assert len(os.listdir(str(job_dir / "export" / "best"))) == 1


def final_variables(job_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(job_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.slow
def test_a_run_stopped_twice_and_resumed_ends_with_bitwise_the_weights_of_one_never_stopped(
        tiny_data_dir, tmp_path, start_trainer):
    # 160 steps of 4-step epochs, with alternating flips, the weights' averages and the
    # switch from 24 to 32 pixels at step 80: the two stops fall before and after it.
    # (The log shows the step every 10 steps; each stop has 50 steps to land in time.)
    flags = ["--train-steps", "160", "--seed", "7", "--deterministic", "--alternating-flips",
             "--moving-average-decay", "0.99", "--low-resolution-epochs", "20"]
    never_stopped = run_module(MODULE, job_args(tiny_data_dir, tmp_path / "whole", *flags))
    assert never_stopped.returncode == 0, never_stopped.stderr[-3000:]

    job_dir = tmp_path / "stopped"
    args = job_args(tiny_data_dir, job_dir, *flags)
    saved_steps, checkpoints = [], []
    # The first stop a SIGTERM, the second a Ctrl-C. An epoch is 4 steps, so a stop lands
    # mid-epoch three times in four; checkpoints come only every 600 s (the default), so
    # each resumes from the checkpoint its stop wrote.
    for at_least, signal_number, status in ((30, signal.SIGTERM, 143), (100, signal.SIGINT, 130)):
        trainer = start_trainer(*args)
        step_seen = trainer.wait_for_step(at_least)
        trainer.process.send_signal(signal_number)
        code, log = trainer.finish()
        assert code == status, log[-3000:]
        assert "Traceback" not in log
        if checkpoints:
            assert "Restoring parameters from %s" % checkpoints[-1] in log
        received, stopped = our_lines(log)
        assert received.startswith("%s: %s received: stopping after the step in flight, then "
                                   "saving it" % (PROGRAM, signal_number.name))
        if signal_number == signal.SIGINT:
            assert received.endswith("(Ctrl-C again ends at once, without saving)"), received
        match = STOPPED_AT_STEP.match(stopped)
        assert match, stopped
        saved_steps.append(int(match.group(2)))
        checkpoints.append(match.group(3))
        # Nothing lost: the checkpoint the job dir names holds the step the stop reached.
        assert tf.train.latest_checkpoint(str(job_dir)) == checkpoints[-1]
        assert checkpoint_step(checkpoints[-1]) == saved_steps[-1] >= step_seen
        assert not (job_dir / "test_results.json").exists()
    resumed = run_module(MODULE, args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Restoring parameters from %s" % checkpoints[-1] in resumed.stderr

    assert saved_steps[0] < 80 < saved_steps[1] < 160
    whole, stopped = final_variables(tmp_path / "whole"), final_variables(job_dir)
    assert sorted(whole) == sorted(stopped)
    assert "input_pipeline/seeds" in whole
    differing = [name for name in whole if not np.array_equal(whole[name], stopped[name])]
    assert differing == []
    # The comparison can tell runs apart: the stop fell mid-run, where the weights moved.
    second_stop = tf.train.load_checkpoint(str(job_dir / ("model.ckpt-%d" % saved_steps[1])))
    assert not np.array_equal(second_stop.get_tensor("resnet/dense/kernel"),
                              whole["resnet/dense/kernel"])


@pytest.mark.slow
def test_a_diverging_loss_ends_in_one_line_and_leaves_finite_weights_named(tiny_data_dir,
                                                                           tmp_path):
    job_dir = tmp_path / "job"
    # A checkpoint every step: some hold weights that already diverged while the loss
    # of their step was still finite. Seeded: on some draws the weights diverge more
    # than the five checkpoints the trainer keeps before the loss does, and none is left
    # finite to name.
    result = run_module(MODULE, job_args(tiny_data_dir, job_dir, "--train-steps", "300",
                                         "--learning-rate", "100000",
                                         "--save-checkpoints-steps", "1", "--seed", "1"))

    line = assert_ends_in_one_line(result, 1, "training diverged at step ",
                                 "at learning rate 100000;",
                                 "the diverged weights were not exported",
                                 "Try a lower --learning-rate")
    named = tf.train.latest_checkpoint(str(job_dir))
    assert "the last checkpoint with finite weights is %s," % named in line
    reader = tf.train.load_checkpoint(named)
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating:
            assert np.all(np.isfinite(reader.get_tensor(name))), name
    assert not (job_dir / "test_results.json").exists()


@contextlib.contextmanager
def tmpfs(path, size):
    """A real tmpfs of `size` (e.g. '3m') mounted at path; skips the test where it cannot."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % mounted.stdout.strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path, options):
    subprocess.run(["mount", "-o", "remount," + options, str(path)], check=True)


@pytest.mark.slow
def test_a_full_disk_then_a_read_only_one_each_end_in_one_line_and_the_same_command_resumes(
        tiny_data_dir, tmp_path):
    # One stopped job for both faults of the disk: the run the full disk ends is refused
    # on the disk made read-only, and resumes once the disk is writable and has space.
    with tmpfs(tmp_path / "disk", "3m") as disk:
        job_dir = disk / "job"
        args = job_args(tiny_data_dir, job_dir, "--train-steps", "40",
                        "--save-checkpoints-steps", "10")
        full = run_module(MODULE, args)
        line = assert_ends_in_one_line(
            full, 1, "the disk under the job dir %s is full (No space left on device): free "
            "space there" % job_dir)
        kept = tf.train.latest_checkpoint(str(job_dir))
        assert kept and "%s is whole, and the same command resumes from it" % kept in line
        assert not [name for name in os.listdir(str(job_dir)) if "_temp" in name or ".tmp" in name]

        # The kernel refuses to make a file system read-only while a process writes to it,
        # so the file system turns read-only between two runs of the job.
        remount(disk, "ro")
        refused = run_module(MODULE, args)
        assert_ends_in_one_line(
            refused, 1, "the disk under the job dir %s is read-only (Read-only file system): "
            "make it writable" % job_dir, "%s is whole" % kept)
        assert tf.train.latest_checkpoint(str(job_dir)) == kept

        remount(disk, "rw,size=40m")
        resumed = run_module(MODULE, args)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "Restoring parameters from %s" % kept in resumed.stderr
        assert resume_step(job_dir) == 40


def test_the_training_stream_resumes_at_the_global_step_without_a_seed(tiny_data_dir):
    """The batch a resumed run takes first is the one the stopped run would have taken
    next: the stream is a function of the checkpointed seeds and the global step."""
    from cifar10_estimator import cifar10, input_fn

    def batches(first_step, count, seeds=None):
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            global_step = tf.compat.v1.train.get_or_create_global_step()
            dataset = input_fn.make_training_input_fn(
                str(tiny_data_dir), 2, 16, True,
                cifar10.AugmentationConfig(alternating_flips=True))()
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            next_batch = iterator.get_next()
            session.run(tf.compat.v1.global_variables_initializer())
            seeds_variable = [variable for variable in tf.compat.v1.global_variables()
                              if variable.op.name == input_fn.INPUT_SEEDS_NAME][0]
            if seeds is not None:  # as a restore would
                seeds_variable.load(seeds, session)
            global_step.load(first_step, session)
            session.run(iterator.initializer)
            return session.run(seeds_variable), [session.run(next_batch) for _ in range(count)]

    # 64 examples, 4 batches an epoch: starting at batch 6 is in the middle of epoch 1.
    seeds, stream = batches(0, 11)
    _, resumed = batches(6, 5, seeds)
    for expected, got in zip(stream[6:], resumed):
        for expected_shards, got_shards in zip(expected, got):
            for expected_shard, got_shard in zip(expected_shards, got_shards):
                np.testing.assert_array_equal(got_shard, expected_shard)
    other_seeds, other_stream = batches(0, 1)
    assert not np.array_equal(other_seeds, seeds)  # no --seed: each job draws its own
    assert not np.array_equal(other_stream[0][0][0], stream[0][0][0])


@pytest.mark.slow
@many_processes
def test_sigterm_in_a_cluster_each_task_as_documented(tiny_data_dir, tmp_path):
    from test_cluster import CLUSTER_RATE, TaskProcesses
    from cifar10_estimator.distributed.local_cluster import Task

    tasks = TaskProcesses(tmp_path)
    job_dir = tmp_path / "job"
    args = job_args(tiny_data_dir, job_dir, "--train-steps", "100000", "--eval-every-secs",
                    "1", "--save-checkpoints-steps", "50")
    try:
        ps = tasks.start(Task("ps", 0), args)
        chief = tasks.start(Task("chief"), args)
        worker = tasks.start(Task("worker", 0), args)
        evaluator = tasks.start(Task("evaluator"), args)
        first_step = tasks.wait_for_step(worker, "worker0")
        # The stop comes once the worker has seen the global step move on, 10 steps later.
        step_seen = int(tasks.wait_for(worker, "worker0", CLUSTER_RATE).group(3))
        tasks.wait_for(evaluator, "evaluator", EVALUATION_STARTED)

        # A worker ends, saving nothing; the chief trains on.
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 143, tasks.log("worker0")[-3000:]
        assert re.search(r"^%s: stopped by SIGTERM at global step \d+: a worker saves nothing "
                         r"\(the chief writes the checkpoints\); restarted, it rejoins the "
                         r"cluster$" % PROGRAM, tasks.log("worker0"), re.M)
        # The evaluator ends, mid-evaluation or between two.
        evaluator.send_signal(signal.SIGTERM)
        assert evaluator.wait(60) == 143, tasks.log("evaluator")[-3000:]
        assert our_lines(tasks.log("evaluator"))[-1].startswith(
            "%s: stopped by SIGTERM " % PROGRAM)
        # Restarted, the worker rejoins: it goes on from the shared variables, from where
        # the stopped one left them, restoring no checkpoint (only the chief does). How it
        # ended does not matter: without --sync a worker leaves nothing behind on the ps.
        # (The --sync worker, which does, is killed mid-run in test_cluster.py.) The chief
        # is paused (SIGSTOP) while it starts, as it would only train on meanwhile.
        chief.send_signal(signal.SIGSTOP)
        rejoined = tasks.start(Task("worker", 0), args, "worker0-restarted")
        rejoined_step = tasks.wait_for_step(rejoined, "worker0-restarted")
        # Killed (SIGKILL) as it trains, it is gone before the ps is stopped: the chief
        # alone goes through that.
        rejoined.kill()
        rejoined.wait()
        chief.send_signal(signal.SIGCONT)
        assert rejoined_step >= step_seen > first_step
        assert "Restoring parameters" not in tasks.log("worker0-restarted")
        # The ps keeps the default action: the signal ends it, and the variables with it.
        # Restarted, the chief's session recovers from its last checkpoint by itself.
        tasks.wait_for(chief, "chief", re.compile(r"Saving checkpoints for [1-9]"))
        ps.send_signal(signal.SIGTERM)
        assert ps.wait(60) == -signal.SIGTERM
        ps = tasks.start(Task("ps", 0), args, "ps-restarted")
        tasks.wait_for(chief, "chief", re.compile(r"a new session will be created"))
        # The chief saves the global step it reached, through the ps.
        step_seen = tasks.wait_for_step(chief, "chief")
        chief.send_signal(signal.SIGTERM)
        assert chief.wait(60) == 143, tasks.log("chief")[-3000:]
        recovered = tasks.log("chief").split("a new session will be created", 1)[1]
        assert "Restoring parameters from %s/model.ckpt-" % job_dir in recovered
        match = STOPPED_AT_STEP.match(our_lines(tasks.log("chief"))[-1])
        assert match and tf.train.latest_checkpoint(str(job_dir)) == match.group(3)
        saved_step = int(match.group(2))
        assert saved_step >= step_seen

        # Restarted, the chief resumes from its checkpoint. A worker trains beside it (the
        # chief is paused from its first step until the worker's, as it would only train
        # on alone), then the ps is lost for good: killed, not restarted.
        args = job_args(tiny_data_dir, job_dir, "--train-steps", "100000",
                        "--ps-timeout-secs", str(LOST_PS_TIMEOUT_SECS))
        trainers = {"chief-restarted": tasks.start(Task("chief"), args, "chief-restarted"),
                    "worker0-again": tasks.start(Task("worker", 0), args, "worker0-again")}
        tasks.wait_for_step(trainers["chief-restarted"], "chief-restarted")
        trainers["chief-restarted"].send_signal(signal.SIGSTOP)
        tasks.wait_for_step(trainers["worker0-again"], "worker0-again")
        trainers["chief-restarted"].send_signal(signal.SIGCONT)
        assert "Restoring parameters from %s" % match.group(3) in tasks.log("chief-restarted")
        assert_a_lost_ps_ends_each_trainer_in_one_line(tasks, ps, trainers)
    finally:
        tasks.kill_all()


LOST_PS_TIMEOUT_SECS = 5
# What a trainer may take to exit once its watchdog has given up on the ps: TensorFlow
# alone would wait for the ps forever, so any bound shows the watchdog ended it; 20 s is
# several times a loaded machine's way out of a TensorFlow process.
LOST_PS_EXIT_SECS = 20


def assert_a_lost_ps_ends_each_trainer_in_one_line(tasks, ps, trainers):
    """Kill the (only) ps: each trainer, {log name: process}, ends with status 1 and one
    line naming it within --ps-timeout-secs (LOST_PS_TIMEOUT_SECS) and LOST_PS_EXIT_SECS."""
    ps.kill()
    lost_at = time.monotonic()
    for name, process in trainers.items():
        assert process.wait(60) == 1, tasks.log(name)[-3000:]
        assert time.monotonic() - lost_at < LOST_PS_TIMEOUT_SECS + LOST_PS_EXIT_SECS
        log = tasks.log(name)
        assert "Traceback" not in log
        assert log.rstrip().splitlines()[-1] == (
            "python -m cifar10_estimator.main: error: lost the parameter server ps:0 (%s): no "
            "connection for %d s (--ps-timeout-secs); restart the cluster to resume from the "
            "last checkpoint" % (tasks.cluster_spec["ps"][0], LOST_PS_TIMEOUT_SECS))
