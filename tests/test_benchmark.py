"""The benchmark CLI end to end (--smoke): it runs every section and writes its report;
--sections and --runs measure only some.

The report's layout is read off one --smoke run that trains one run of each kind of child
(the trainer and Keras, in fp32 and where the CPU has them in bf16); that the suite plans
every run, with a command its program takes, and that every ratio follows from the runs
that trained, is checked without training.

No speed is asserted: the figures depend on the machine and its load.
"""

import json
import os
import signal
import subprocess
import threading

import pytest

from cli_helpers import assert_one_line_error, benchmark_trainers, run_module, start_module
from cifar10_estimator.benchmarks import suite

pytestmark = pytest.mark.slow

SECTIONS = ("machine", "conversion", "input_pipeline", "flops", "training", "comparisons")
COMPARISON_KEYS = {"input_pipeline_vs_original", "real_data_vs_synthetic",
                   "estimator_vs_keras", "two_towers_vs_one", "conversion_vs_original",
                   "pooling_allocator_vs_default"}
BF16_COMPARISON_KEYS = {"bf16_vs_fp32", "estimator_vs_keras_bf16",
                        "pooling_allocator_vs_default_bf16"}
UNTARGETED_KEYS = {"input_pipeline_vs_original", "pooling_allocator_vs_default",
                   "pooling_allocator_vs_default_bf16"}
RUN_NAMES = {"estimator_tfrecords", "estimator_synthetic", "keras_fit",
             "estimator_synthetic_2_towers", "estimator_tfrecords_pooling_allocator"}
BF16_RUN_NAMES = {"estimator_tfrecords_bf16", "keras_fit_bf16",
                  "estimator_tfrecords_bf16_pooling_allocator"}
# What the smoke run trains: each kind of child process once in each precision (the other
# runs are the trainer's own flags and environment, planned and checked below); where the
# CPU has no bf16, the bf16 runs are left out as in a run of every one.
SMOKE_RUN_NAMES = {"estimator_tfrecords", "keras_fit"}
SMOKE_BF16_RUN_NAMES = {"estimator_tfrecords_bf16", "keras_fit_bf16"}
# The ratios of those runs, and those of the other sections.
SMOKE_COMPARISON_KEYS = {"input_pipeline_vs_original", "estimator_vs_keras",
                         "conversion_vs_original"}
SMOKE_BF16_COMPARISON_KEYS = {"bf16_vs_fp32", "estimator_vs_keras_bf16"}


def measures_bf16(results):
    return results["precisions"]["bf16"] == "measured"


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    """(CompletedProcess, benchmark.json, benchmark.md) of one --smoke run of every section,
    training SMOKE_RUN_NAMES (and SMOKE_BF16_RUN_NAMES where measured); its tests are
    benchmark_trainers, and so on one worker: it runs once."""
    output_dir = tmp_path_factory.mktemp("benchmark")
    # Its 4 trainers start together: on a machine busy with the other tests it takes minutes.
    result = run_module("cifar10_estimator.benchmarks",
                        ["--smoke", "--output-dir", output_dir, "--runs"]
                        + sorted(SMOKE_RUN_NAMES | SMOKE_BF16_RUN_NAMES), timeout=540)
    assert result.returncode == 0, result.stderr[-5000:]
    with open(str(output_dir / "benchmark.json")) as stream:
        results = json.load(stream)
    markdown = (output_dir / "benchmark.md").read_text()
    return result, results, markdown


@benchmark_trainers
def test_json_has_every_section_and_the_command(smoke_report):
    _, results, _ = smoke_report
    assert set(SECTIONS) <= set(results)
    assert results["sections"] == ["conversion", "input_pipeline", "flops", "training"]
    assert results["mode"] == "smoke"
    assert results["command"].startswith("python -m cifar10_estimator.benchmarks --smoke")
    machine = results["machine"]
    assert machine["tensorflow_version"] and machine["cpu_model"] and machine["date"]
    assert machine["physical_cores"] >= 1


@benchmark_trainers
def test_every_run_is_measured_with_throughput_and_memory(smoke_report):
    _, results, _ = smoke_report
    runs = results["training"]["runs"]
    assert {run["name"] for run in runs} == SMOKE_RUN_NAMES | (
        SMOKE_BF16_RUN_NAMES if measures_bf16(results) else set())
    turns_per_round = results["training"]["timed_steps"] // results["training"]["steps_per_turn"]
    for run in runs:
        assert run["median_examples_per_sec"] > 0
        assert [len(turns) for turns in run["interval_examples_per_sec"]] == [turns_per_round]
        assert run["max_rss_mb"] > 0


@benchmark_trainers
def test_keras_copy_has_our_parameter_count(smoke_report):
    _, results, _ = smoke_report
    keras_rows = [row for row in results["comparisons"]
                  if row["key"].startswith("estimator_vs_keras")]
    assert len(keras_rows) == (2 if measures_bf16(results) else 1)
    assert all(row["same_parameter_count"] for row in keras_rows)


@benchmark_trainers
def test_flops_are_counted_from_the_graph(smoke_report):
    _, results, _ = smoke_report
    counts = results["flops"]["8"]
    assert 0 < counts["forward_flops_per_example"] < counts["train_step_flops_per_example"]


@benchmark_trainers
def test_conversion_writes_the_same_examples_both_ways(smoke_report):
    _, results, _ = smoke_report
    conversion = results["conversion"]
    assert conversion["same_examples_both_ways"]
    assert conversion["package"]["median_images_per_sec"] > 0
    assert conversion["original"]["median_images_per_sec"] > 0


@benchmark_trainers
def test_every_target_has_a_ratio_and_a_verdict(smoke_report):
    _, results, markdown = smoke_report
    rows = {row["key"]: row for row in results["comparisons"]}
    assert set(rows) == SMOKE_COMPARISON_KEYS | (
        SMOKE_BF16_COMPARISON_KEYS if measures_bf16(results) else set())
    for key, row in rows.items():
        assert row["ratio_q25"] <= row["ratio"] <= row["ratio_q75"]
        assert (row["met"] is None) == (key in UNTARGETED_KEYS)
    for heading in ("## Targets", "## Training throughput", "## Input pipeline",
                    "## TFRecord conversion", "## Model FLOPs"):
        assert heading in markdown
    assert results["command"] in markdown


@benchmark_trainers
def test_the_report_names_the_cpu_and_both_peaks_and_prints_the_targets(smoke_report):
    result, results, markdown = smoke_report
    machine = results["machine"]
    assert "cpu family %s" % machine["cpu_family"] in markdown
    assert "- bf16 peak:" in markdown and "- FP32 peak:" in markdown
    assert "Targets, measured on" in result.stdout and "cpu family" in result.stdout
    assert "fp16" in results["precisions"]
    if measures_bf16(results):
        assert "% of bf16" in markdown and "% of FP32" in markdown


def test_num_layers_picks_the_depths_and_rejects_others():
    result = run_module("cifar10_estimator.benchmarks", ["--smoke", "--num-layers", "21"])
    assert result.returncode == 2
    assert "6n+2" in result.stderr


def test_modes_are_exclusive():
    result = run_module("cifar10_estimator.benchmarks", ["--smoke", "--full"])
    assert result.returncode == 2
    assert "not allowed with" in result.stderr


def test_sections_writes_only_those_sections(tmp_path):
    result = run_module("cifar10_estimator.benchmarks",
                        ["--smoke", "--sections", "conversion", "--output-dir", tmp_path])
    assert result.returncode == 0, result.stderr[-5000:]
    assert "measuring only: conversion" in result.stdout
    results = json.loads((tmp_path / "benchmark.json").read_text())
    assert results["sections"] == ["conversion"]
    assert "machine" in results and "conversion" in results
    assert not {"input_pipeline", "flops", "training"} & set(results)
    assert [row["key"] for row in results["comparisons"]] == ["conversion_vs_original"]
    markdown = (tmp_path / "benchmark.md").read_text()
    assert "## TFRecord conversion" in markdown and "## Targets" in markdown
    for heading in ("## Training throughput", "## Input pipeline", "## Model FLOPs"):
        assert heading not in markdown


@pytest.mark.parametrize("args, fragments", [
    (["--sections", "conversion", "speed"], ("--sections", "'speed'")),
    (["--runs", "keras"], ("--runs", "'keras'")),
    (["--sections", "conversion", "--runs", "keras_fit"], ("--runs", "training")),
])
def test_sections_and_runs_reject_what_is_not_there(args, fragments):
    result = run_module("cifar10_estimator.benchmarks", ["--smoke"] + args)
    assert_one_line_error(result, 2, *fragments)


def _trained(*names):
    """Results of training `names` alone (--runs): 2 turns each, the FLOPs counted."""
    runs = [{"name": name, "num_layers": 8, "kind": "keras" if "keras" in name else "estimator",
             "trainable_parameters": 75355, "interval_examples_per_sec": [[100.0, 110.0]]}
            for name in names]
    return {"settings": {"depths": [8]}, "precisions": {"bf16": "measured"},
            "flops": {"8": {"trainable_parameters": 75355}}, "training": {"runs": runs}}


def test_the_suite_trains_every_run_and_the_bf16_ones_where_the_cpu_has_bf16():
    assert {run.name for run in suite.training_runs(8, 8, with_bf16=True)} == (
        RUN_NAMES | BF16_RUN_NAMES)
    assert {run.name for run in suite.training_runs(8, 8, with_bf16=False)} == RUN_NAMES


@pytest.mark.parametrize("run", suite.training_runs(8, 8, with_bf16=True),
                         ids=lambda run: run.name)
def test_each_runs_command_line_is_one_its_program_takes(run):
    from cifar10_estimator import flags
    from cifar10_estimator.benchmarks import keras_peer, training

    if run.kind == "keras":
        argv = training.keras_argv(run, "data", 10, 20)
        assert argv[1:3] == ["-m", "cifar10_estimator.benchmarks.keras_peer"]
        # argparse's own parser (the child's): a flag it does not take exits here.
        assert keras_peer.build_parser().parse_args(argv[3:]).num_layers == 8
    else:
        argv = training.trainer_argv(run, "data", "job", 10, 20)
        assert argv[1:3] == ["-m", "cifar10_estimator.main"]
        settings = flags.parse(argv[3:])
        assert (settings.hparams.num_layers, settings.num_cpu_towers) == (8, run.num_cpu_towers)


def test_with_every_run_trained_every_training_target_has_its_ratio():
    rows = suite.comparisons(_trained(*RUN_NAMES | BF16_RUN_NAMES))
    # The input pipeline's and the conversion's come from their own sections.
    assert {row["key"] for row in rows} == (COMPARISON_KEYS | BF16_COMPARISON_KEYS) - {
        "input_pipeline_vs_original", "conversion_vs_original"}
    assert all((row["met"] is None) == (row["key"] in UNTARGETED_KEYS) for row in rows)


def test_runs_report_the_ratios_whose_both_runs_trained():
    rows = suite.comparisons(_trained("estimator_tfrecords", "keras_fit",
                                      "estimator_tfrecords_bf16"))
    assert [row["key"] for row in rows] == ["estimator_vs_keras", "bf16_vs_fp32"]
    assert rows[0]["same_parameter_count"] and "same_parameter_count" not in rows[1]
    assert suite.comparisons(_trained("keras_fit_bf16", "estimator_synthetic")) == []


def _processes_mentioning(text):
    """Pids of live processes whose command line contains text."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % name, "rb") as stream:
                if text.encode() in stream.read():
                    pids.append(int(name))
        except (OSError, ValueError):
            continue
    return pids


@benchmark_trainers
def test_sigterm_stops_the_trainers_and_removes_the_work_directory(tmp_path):
    # Training alone, with one trainer and one Keras run (both kinds of child): the other
    # sections and runs would only delay the signal.
    process = start_module("cifar10_estimator.benchmarks",
                           ["--smoke", "--sections", "training", "--runs", "estimator_tfrecords",
                            "keras_fit", "--output-dir", tmp_path / "out"],
                           env={"TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    timer = threading.Timer(300, process.kill)  # a hang guard (cli_helpers): 2 trainers' start
    timer.start()
    try:
        # Once a training turn is reported, trainers are running (and some paused).
        for line in process.stdout:
            if line.startswith("training round"):
                break
        assert _processes_mentioning(str(tmp_path)) != [process.pid]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)  # a hang guard: it stops them at once
    finally:
        timer.cancel()
    leftovers = _processes_mentioning(str(tmp_path))
    for pid in leftovers:  # so that a failure here does not leave them to the next tests
        os.kill(pid, signal.SIGKILL)
    assert leftovers == []
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "interrupted" in stderr
    assert not [name for name in os.listdir(str(tmp_path))
                if name.startswith("cifar10_benchmark_")]
    assert not (tmp_path / "out" / "benchmark.json").exists()
