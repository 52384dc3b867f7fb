"""The evaluation benchmark: the trainer's evaluation of a real job's checkpoint in
float32 and in the training precision, taking turns."""

import json
import re
import shutil

import pytest

from cli_helpers import assert_one_line_error, run_module
from test_precision import needs_bf16_cpu

pytest_plugins = ["trained_job"]

BENCHMARK = "cifar10_estimator.benchmarks.evaluation"


def job_trained_in(trained_job, tmp_path, precision_name):
    """A copy of the trained job whose hparams.json says it trained in precision_name
    (checkpoints hold float32 variables whatever the precision), with flipped views."""
    job_dir = tmp_path / "job"
    shutil.copytree(trained_job.job_dir, job_dir)
    path = job_dir / "hparams.json"
    recorded = json.loads(path.read_text())
    recorded["runs"][-1]["hparams"].update(precision=precision_name, eval_flips=True)
    path.write_text(json.dumps(recorded))
    return job_dir


@needs_bf16_cpu
def test_each_round_times_both_precisions_and_the_ratio_is_theirs(trained_job, tmp_path):
    job_dir = job_trained_in(trained_job, tmp_path, "bf16")
    result = run_module(BENCHMARK, ["--job-dir", job_dir, "--data-dir", trained_job.data_dir,
                                    "--rounds", "2", "--batch-size", "8"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 views an image, subset validation, batch 8" in result.stdout
    turns = re.findall(r"^round (\d): (float32|bf16) +([\d.]+) s, +\d+ images/sec, "
                       r"accuracy ([\d.]+) \((\d+)/(\d+)\)$", result.stdout, re.M)
    assert [(round_index, name) for round_index, name, *_ in turns] == [
        ("1", "float32"), ("1", "bf16"), ("2", "float32"), ("2", "bf16")]
    _, labels = trained_job.read_subset("validation")
    assert {int(total) for *_, total in turns} == {len(labels)}
    seconds = [float(turn[2]) for turn in turns]
    ratios = [seconds[0] / seconds[1], seconds[2] / seconds[3]]
    summary = re.search(r"^bf16 evaluation at ([\d.]+)x the speed of float32 \(median of 2 "
                        r"rounds: ([\d.]+), ([\d.]+)\)$", result.stdout, re.M)
    assert summary, result.stdout
    assert [float(value) for value in summary.groups()[1:]] == pytest.approx(ratios, rel=0.1)


def test_a_job_trained_in_float32_is_a_one_line_error(trained_job):
    result = run_module(BENCHMARK, ["--job-dir", trained_job.job_dir,
                                    "--data-dir", trained_job.data_dir], timeout=120)
    assert_one_line_error(result, 2, "trained in fp32", "float32 either way")
