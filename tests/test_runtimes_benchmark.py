"""The runtimes benchmark: a job's export and its converted files, each in its runtime."""

import json
import re

import pytest

from cifar10_estimator.benchmarks import runtimes as runtimes_benchmark
from cifar10_estimator.cli.command import run_command

pytest_plugins = ["trained_job"]

TINY_RUN = ["--rounds", "2", "--latency-images", "2", "--throughput-batches", "1"]
ROW = re.compile(r"^\| (\S+) \| ([^|]+) \| ([\d.]+) % \| ([+-][\d.]+) points \| "
                 r"([\d.]+) % \((\d+)/(\d+)\) \| ([\d.]+) MB \| ([\d.]+) ms \| (\d+) images/s \|$",
                 re.M)


@pytest.mark.slow
def test_prints_a_row_per_runtime_with_every_figure(trained_job, tmp_path, capsys):
    json_path = tmp_path / "runtimes.json"
    status = run_command(runtimes_benchmark.main, [
        "--job-dir", trained_job.job_dir, "--data-dir", trained_job.data_dir,
        "--work-dir", str(tmp_path / "work"), "--json", str(json_path)] + TINY_RUN)

    output = capsys.readouterr().out
    assert status == 0
    rows = ROW.findall(output)
    assert [row[0] for row in rows] == ["SavedModel", "tflite", "tflite-int8", "onnx"], output
    for name, runtime, accuracy, difference, agreement, agreeing, total, size, latency, \
            throughput in rows:
        assert int(total) == 32 and 0 <= float(accuracy) <= 100
        assert float(size) > 0 and float(latency) > 0 and int(throughput) > 0
    saved_model, tflite, _, onnx = rows
    # The float files classify every test image as the SavedModel does.
    for row in (saved_model, tflite, onnx):
        assert (row[3], row[5]) == ("+0.00", "32")
    assert "- Command: `" in output and "--job-dir %s" % trained_job.job_dir in output
    assert "cpu family" in output and "Load average" in output

    results = json.loads(json_path.read_text())
    assert [result["name"] for result in results["results"]] == [row[0] for row in rows]
    assert all(len(result["latency_ms"]) == 2 for result in results["results"])
    assert results["num_calibration_images"] == 16


def test_a_job_dir_without_exports_is_one_line_and_status_1(tmp_path, tiny_data_dir, capsys):
    status = run_command(runtimes_benchmark.main, [
        "--job-dir", str(tmp_path), "--data-dir", str(tiny_data_dir)], prog="runtimes")
    error = capsys.readouterr().err
    assert status == 1
    assert error.count("\n") == 1 and "no SavedModel in" in error
