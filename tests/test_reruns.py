"""A rerun into a job dir keeps the job's truth: checked against its newest checkpoint
before it writes anything, and a damaged newest checkpoint costs one checkpoint.

The reruns run the real trainer on copies of the shared trained_job (ResNet-8, 10 steps,
a checkpoint every 5).
"""

import os
import re
import shutil

import pytest

from cifar10_estimator.training import job_dir_lock
from cli_helpers import assert_one_line_error, run_module
from test_training import checkpoint_steps

pytest_plugins = ["trained_job"]
MODULE = "cifar10_estimator.main"


def job_files(job_dir):
    """{path under job_dir: (size, modification time)} of every file but the log, which
    records every run."""
    files = {}
    for folder, _, names in os.walk(str(job_dir)):
        for name in names:
            path = os.path.join(folder, name)
            if name not in ("train.log", job_dir_lock.LOCK_FILENAME):
                files[os.path.relpath(path, str(job_dir))] = (
                    os.path.getsize(path), os.path.getmtime(path))
    return files


def copy_of(trained_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(trained_job.job_dir, str(job_dir))
    return job_dir


@pytest.mark.slow
def test_a_rerun_with_another_depth_is_refused_in_one_line_before_it_writes_anything(
        trained_job, tmp_path):
    job_dir = copy_of(trained_job, tmp_path)
    before = job_files(job_dir)

    result = run_module(MODULE, trained_job.args_for(job_dir, num_layers=20))

    assert_one_line_error(result, 2, "--num-layers 20", "--num-layers 8",
                          "model.ckpt-10", "--job-dir")
    assert job_files(job_dir) == before


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
        trained_job, tmp_path):
    job_dir = copy_of(trained_job, tmp_path)
    # The weights' shard (the other holds the training stream's seeds), cut in half.
    data_file = job_dir / "model.ckpt-10.data-00001-of-00002"
    data_file.write_bytes(data_file.read_bytes()[:data_file.stat().st_size // 2])

    result = run_module(MODULE, trained_job.args_for(job_dir, train_steps=15))

    assert result.returncode == 0, result.stderr[-5000:]
    said = re.search(r"^%s/model\.ckpt-10 cannot be read \(.+\): moved aside to (\S+); "
                     r"resuming from %s/model\.ckpt-5$" % (job_dir, job_dir),
                     result.stderr, re.M)
    assert said, result.stderr[-3000:]
    assert sorted(os.listdir(said.group(1))) == [
        "model.ckpt-10.data-00000-of-00002", "model.ckpt-10.data-00001-of-00002",
        "model.ckpt-10.index", "model.ckpt-10.meta"]
    assert checkpoint_steps(job_dir)[-1] == 15
