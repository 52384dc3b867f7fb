"""A job dir that runs overlap on or die in: one trainer at a time, complete exports only.

Trainers run through the real CLI on tiny TFRecords and ResNet-8; a rerun after
`kill -9` is tested in test_training (the killed trainer's lock blocks nothing).
"""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
import tensorflow as tf

from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.run import job_dir_lock
from cifar10_estimator.serving import export_dirs
from cli_helpers import assert_one_line_error, run_module, start_module
from test_training import checkpoint_steps, trainer_args

pytest_plugins = ["trained_job"]
MODULE = "cifar10_estimator.main"
# A hang guard (cli_helpers) on the waits inside a tiny run: its lock, its first checkpoint.
DEADLINE_SECS = 300


class BackgroundTrainer:
    """The trainer CLI running in the background, its stderr in a file."""

    def __init__(self, directory, args):
        self._log_path = os.path.join(str(directory), "trainer.log")
        with open(self._log_path, "w") as log:
            self.process = start_module(MODULE, args, stdout=subprocess.DEVNULL, stderr=log)

    def log(self):
        with open(self._log_path) as stream:
            return stream.read()

    def wait_until(self, condition, what):
        """condition()'s first true value, polled while the trainer runs."""
        deadline = time.monotonic() + DEADLINE_SECS
        while True:
            value = condition()
            if value:
                return value
            assert self.process.poll() is None, "ended before %s:\n%s" % (what, self.log()[-3000:])
            assert time.monotonic() < deadline, "not %s within %d s" % (what, DEADLINE_SECS)
            time.sleep(0.01)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def start_trainer(tmp_path):
    """start_trainer(args): a BackgroundTrainer, killed at the end of the test."""
    trainers = []

    def start(args):
        trainers.append(BackgroundTrainer(tmp_path, args))
        return trainers[-1]

    yield start
    for trainer in trainers:
        trainer.kill()


def lock_holder_pid(job_dir):
    try:
        with open(str(job_dir / job_dir_lock.LOCK_FILENAME)) as stream:
            return json.load(stream)["pid"]
    except (OSError, ValueError):
        return None


def test_a_held_job_dir_is_refused_until_its_holder_lets_go(tmp_path):
    job_dir = str(tmp_path / "job")
    with job_dir_lock.JobDirLock(job_dir):
        with pytest.raises(Cifar10EstimatorError, match="held by the trainer running as "
                           "process %d on host %s" % (os.getpid(), socket.gethostname())):
            with job_dir_lock.JobDirLock(job_dir):
                pass
    with job_dir_lock.JobDirLock(job_dir):
        pass


@pytest.mark.slow
def test_a_second_trainer_on_a_held_job_dir_ends_at_once_and_the_first_is_unharmed(
        tiny_data_dir, tmp_path, start_trainer):
    job_dir = tmp_path / "job"
    # Only the final checkpoint is evaluated: the first trainer's run stays short.
    args = trainer_args(tiny_data_dir, job_dir, "--train-steps", "25",
                        "--save-checkpoints-steps", "5", "--eval-every-secs", "3600")
    first = start_trainer(args)
    first.wait_until(lambda: lock_holder_pid(job_dir) == first.process.pid, "holding the job dir")
    # Paused (SIGSTOP) while the second runs, so that however slow the second is to start,
    # the first still holds the job dir; the second would wait for it forever if it waited.
    first.process.send_signal(signal.SIGSTOP)
    try:
        second = run_module(MODULE, args, timeout=120)
    finally:
        first.process.send_signal(signal.SIGCONT)

    assert first.process.poll() is None, "the first trainer ended before the second did"
    assert_one_line_error(
        second, 1, "cifar10_estimator.main: error: the job dir %s is held by the trainer "
                   "running as process %d on host %s" % (job_dir, first.process.pid,
                                                         socket.gethostname()),
        "wait for it to end or stop it", "or pass another --job-dir")
    assert first.process.wait(DEADLINE_SECS) == 0, first.log()[-3000:]
    # The checkpoints and summaries of one run: every 5 steps, the last 5 kept.
    assert checkpoint_steps(job_dir) == [5, 10, 15, 20, 25]
    events = glob.glob(str(job_dir / "events.out.tfevents.*"))
    # The training summaries' file, and the hyper-parameters' for TensorBoard's dashboard.
    assert len([path for path in events if not path.endswith(".hparams")]) == 1
    assert len([path for path in events if path.endswith(".hparams")]) == 1
    assert "Traceback" not in first.log()


def unfinished_exports(job_dir):
    return glob.glob(str(job_dir / "export" / "*" / "temp-*"))


def complete_exports(job_dir):
    return [os.path.dirname(path) for path in
            glob.glob(str(job_dir / "export" / "*" / "[0-9]*" / "saved_model.pb"))]


def kill_during_an_export(trainer, job_dir):
    """SIGKILL the trainer while it writes an export, once a complete one exists; returns
    the unfinished export's directory."""
    trainer.wait_until(lambda: complete_exports(job_dir), "a complete export")
    while True:
        trainer.wait_until(lambda: unfinished_exports(job_dir), "writing another export")
        # Paused, so that the export cannot finish between the look and the kill.
        trainer.process.send_signal(signal.SIGSTOP)
        unfinished = unfinished_exports(job_dir)
        if unfinished:
            trainer.process.send_signal(signal.SIGKILL)
            trainer.process.wait()
            return unfinished[0]
        trainer.process.send_signal(signal.SIGCONT)


@pytest.mark.slow
def test_an_export_killed_half_way_is_never_picked_and_the_rerun_clears_it(
        trained_job, tmp_path, start_trainer):
    # A copy of trained_job (10 steps, complete exports), trained on to step 40 with its own
    # arguments: a checkpoint every 5 steps, each evaluated and exported.
    job_dir = tmp_path / "job"
    shutil.copytree(trained_job.job_dir, str(job_dir))
    args = trained_job.args_for(job_dir, train_steps=40)
    unfinished = kill_during_an_export(start_trainer(args), job_dir)

    assert os.path.isdir(unfinished)
    picked = export_dirs.resolve_export_dir(str(job_dir))
    assert picked in complete_exports(job_dir)
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8)).numpy())
    predicted = run_module("cifar10_estimator.serving.predict",
                           ["--export-dir", job_dir, image], timeout=120)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert predicted.stdout.startswith(str(image) + "\t")

    # A checkpoint at the end only, so that the rerun evaluates and exports twice, not 20 times.
    rerun = run_module(MODULE, args + ["--save-checkpoints-steps", "40"])

    assert rerun.returncode == 0, rerun.stderr[-5000:]
    assert unfinished_exports(job_dir) == []
    for exporter_dir in glob.glob(str(job_dir / "export" / "*")):
        for name in os.listdir(exporter_dir):
            assert os.path.isfile(os.path.join(exporter_dir, name, "saved_model.pb")), name
