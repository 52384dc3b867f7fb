"""Each run's training compute: the FLOPs of its phases counted from the network's shapes
(against TensorFlow's profiler), the rate its steps reach against the CPU's peak, and the
plan line, summary and test_results.json that show them."""

import dataclasses
import json
import os
import re

import pytest

from cifar10_estimator import cifar10_model
from cifar10_estimator import compute_accounting
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import report
from cifar10_estimator.benchmarks import flops as profiled
from cifar10_estimator.machine import cpu_peak
from cifar10_estimator.training import compute
from cifar10_estimator.settings import precision
from cifar10_estimator.settings import recipes

pytest_plugins = ["trained_job"]


def recipe_hparams(recipe, num_train_examples):
    """The HParams of a named recipe on a training set of num_train_examples."""
    fields = {field.name for field in dataclasses.fields(job_hparams.HParams)}
    values = {name: value for name, value in recipes.RECIPES[recipe].items() if name in fields}
    return job_hparams.HParams(recipe=recipe, num_train_examples=num_train_examples, **values)


# The depths the recipes train (ResNet-8 in the tests, 14 in sprint and quick, 20 in the
# paper's) at the sides their phases train on, and 13 pixels, where the strided
# convolutions' padded inputs are odd. Each builds the training graph and profiles it (a
# second or two), none trains.
PROFILED_SHAPES = [(8, 32), (8, 13)] + [(num_layers, side) for num_layers in (14, 20)
                                        for side in (16, 24, 32)]


@pytest.mark.parametrize("num_layers, side", PROFILED_SHAPES)
def test_an_example_costs_what_tensorflows_profiler_counts_in_the_training_graph(
        num_layers, side):
    profiler_flops = profiled.count_training_step(num_layers, 16, image_side=side)[
        "train_step_flops_per_example"]
    # The count leaves out only the element-wise ops (shortcut additions, pooling, the
    # loss), which the profiler counts: a shortfall, and a small one.
    shortfall = 1 - cifar10_model.training_flops_per_example(num_layers, side) / profiler_flops
    assert 0 <= shortfall < 0.005, (num_layers, side, shortfall)


def test_the_sprint_and_quick_recipes_train_with_95_and_107_tflop():
    # ResNet-14: 160.2 MFLOP an example at 32 pixels, and the sprint recipe's Muon adds its
    # orthogonalisations (0.20 GFLOP a step: 1.57 MFLOP an example of batch 128); the
    # sprint recipe on all 50000 training images, the quick one on the 45000-image split.
    sprint = compute_accounting.training_compute(recipe_hparams("sprint", 50000))
    assert [(phase.image_side, phase.first_step, phase.end_step) for phase in sprint.phases] == [
        (16, 0, 2730), (24, 2730, 5460), (32, 5460, 7800)]
    assert [sprint.examples(phase) for phase in sprint.phases] == [349440, 349440, 299520]
    assert sprint.phases[-1].flops_per_example == pytest.approx(160.2e6 + 1.57e6, rel=1e-3)
    assert sprint.flops() / 1e12 == pytest.approx(95.4, abs=0.05)
    assert sprint.plan_text() == (
        "95.4 TFLOP of training (14.7 on 16-pixel images, 32.2 on 24, 48.5 on 32)")
    # The recipe before it took Muon, as the manual's runs of it spell it out.
    before_muon = dataclasses.replace(recipe_hparams("sprint", 50000), muon_learning_rate=0.0,
                                      weight_decay=5e-4)
    assert compute_accounting.training_compute(before_muon).plan_text() == (
        "93.8 TFLOP of training (14.2 on 16-pixel images, 31.6 on 24, 48.0 on 32)")
    quick = compute_accounting.training_compute(recipe_hparams("quick", 45000))
    assert quick.flops() / 1e12 == pytest.approx(106.5, abs=0.05)
    assert compute_accounting.training_compute(recipe_hparams("paper", 45000)).plan_text() == (
        "2008.4 TFLOP of training")


def test_the_flops_of_steps_add_up_to_the_phases_and_the_run():
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=10, num_train_examples=100,
                                  train_epochs=4, low_resolution_epochs=1,
                                  lower_resolution_epochs=1, lower_resolution=12)
    run = compute_accounting.training_compute(hparams)
    assert [(phase.image_side, phase.end_step) for phase in run.phases] == [
        (12, 10), (24, 20), (32, 40)]
    per_step = [run.flops(step, step + 1) for step in range(40)]
    assert per_step[0] == 10 * cifar10_model.training_flops_per_example(8, 12)
    assert per_step[10] == 10 * cifar10_model.training_flops_per_example(8, 24)
    assert sum(per_step) == pytest.approx(run.flops())
    assert run.flops(0, 20) == pytest.approx(sum(per_step[:20]))


def test_the_examples_a_phase_trains_are_counted_in_one_place(monkeypatch):
    hparams = job_hparams.HParams(num_layers=8, train_steps=10)
    whole = compute_accounting.training_compute(hparams).flops()
    # What an option training on half of each batch would change.
    counted = compute.examples_trained
    monkeypatch.setattr(compute, "examples_trained",
                        lambda *arguments: counted(*arguments) // 2)
    halved = compute_accounting.training_compute(hparams)
    assert halved.flops() == pytest.approx(whole / 2)
    assert halved.flops(0, 1) == pytest.approx(whole / 20)


def zen4(cores=2, clock_mhz=2600.0):
    """The CpuPeak of a Zen 4 (cpu family 25 with AVX-512 and AVX512_BF16)."""
    return cpu_peak.CpuPeak(cores=cores, clock_mhz=clock_mhz, clock_source="test",
                            vector_isa="AVX-512 with FMA on 256-bit pipes (AMD Zen 4)",
                            fp32_flops_per_cycle=32, bf16_flops_per_cycle=64,
                            bf16_instructions="AVX512_BF16 dot products")


def test_the_peak_is_cores_times_clock_times_flops_a_cycle_in_each_precision():
    peak = zen4()
    assert peak.gflops("float32") == pytest.approx(166.4)
    assert peak.gflops("bfloat16") == pytest.approx(332.8)
    assert peak.derivation("bfloat16").startswith("2 cores x 2600 MHz x 64 bf16 FLOPs/cycle")
    without_bf16 = dataclasses.replace(peak, bf16_flops_per_cycle=None,
                                       bf16_instructions="no bfloat16 instructions")
    assert without_bf16.gflops("bfloat16") is None
    assert without_bf16.derivation("bfloat16") == "no bfloat16 instructions"
    assert dataclasses.replace(peak, clock_mhz=None).gflops("float32") is None


AVX512 = {"sse2", "avx", "avx2", "fma", "avx512f"}
AVX2 = {"sse2", "avx", "avx2", "fma"}


@pytest.mark.parametrize("flags, vendor, family, expected", [
    (AVX512, "GenuineIntel", "6", 64),   # Skylake-SP and later: two 512-bit FMA pipes
    (AVX512, "AuthenticAMD", "25", 32),  # Zen 4: 512-bit instructions on 256-bit pipes
    (AVX512, "AuthenticAMD", "26", 64),  # Zen 5 server: full-width pipes
    (AVX2, "AuthenticAMD", "25", 32),    # Zen 3
    (AVX2, "GenuineIntel", "6", 32),
    ({"sse2", "avx"}, "GenuineIntel", "6", 16),
    ({"sse2"}, "", "", 8),
    (set(), "", "", 2),
])
def test_fp32_flops_per_cycle_follow_the_vector_units(flags, vendor, family, expected):
    flops, isa = cpu_peak.fp32_flops_per_cycle(flags, vendor, family)
    assert flops == expected, isa


@pytest.mark.parametrize("flags, fp32_flops, vendor, expected", [
    (AVX512 | {"avx512_bf16"}, 32, "AuthenticAMD", 64),   # Zen 4: on the half-width FMA pipes
    (AVX512 | {"avx512_bf16"}, 64, "AuthenticAMD", 128),  # Zen 5
    (AVX512 | {"avx512_bf16"}, 64, "GenuineIntel", 64),   # Xeon without AMX: not 2x
    (AVX512 | {"avx512_bf16", "amx_bf16"}, 64, "GenuineIntel", 1024),
    (AVX512, 64, "GenuineIntel", None),
])
def test_bf16_flops_per_cycle_follow_the_vendors_dot_product_units(flags, fp32_flops, vendor,
                                                                    expected):
    flops, instructions = cpu_peak.bf16_flops_per_cycle(flags, fp32_flops, vendor)
    assert flops == expected, instructions


def finished_timer(training_compute, flops, secs):
    return compute.TimedTraining(100, secs, flops)


def test_the_record_sets_the_rate_against_the_peak_of_the_precision_trained_in():
    run = compute_accounting.training_compute(recipe_hparams("sprint", 50000))
    timer = finished_timer(run, 175e9 * 536, 536.0)
    on_bf16 = compute.record(run, timer, "bf16", zen4())
    assert on_bf16["tflop"] == pytest.approx(95.4, abs=0.05)
    assert [phase["image_side"] for phase in on_bf16["phases"]] == [16, 24, 32]
    assert sum(phase["tflop"] for phase in on_bf16["phases"]) == pytest.approx(on_bf16["tflop"])
    assert on_bf16["gflop_per_sec"] == pytest.approx(175)
    assert on_bf16["peak_gflop_per_sec"] == pytest.approx(332.8)
    assert on_bf16["share_of_peak"] == pytest.approx(175 / 332.8)
    assert compute.summary_lines(on_bf16) == [
        "  training compute     95.4 TFLOP, 175 GFLOP/s over 536 s of training steps",
        "  share of CPU peak    53 % of 333 GFLOP/s, its bf16 peak: 2 cores x 2600 MHz x 64 "
        "bf16 FLOPs/cycle (AVX512_BF16 dot products)"]
    assert compute.record(run, timer, "fp32", zen4())["peak_gflop_per_sec"] == pytest.approx(
        166.4)
    # On GPUs the rate alone; where this process timed no step (a cluster's evaluator,
    # a finished run started again), the compute alone.
    on_gpus = compute.record(run, timer, "fp16", None)
    assert on_gpus["gflop_per_sec"] == pytest.approx(175) and "share_of_peak" not in on_gpus
    assert compute.summary_lines(compute.record(run, finished_timer(run, 0.0, 0.0), "fp32",
                                                zen4())) == [
        "  training compute     95.4 TFLOP"]


def test_a_runs_plan_line_summary_and_results_show_its_compute(trained_job):
    hparams = job_hparams.load(trained_job.job_dir)
    expected = compute_accounting.training_compute(hparams)
    plan = [line for line in trained_job.result.stderr.splitlines()
            if line.startswith("Recipe ")]
    assert len(plan) == 1 and plan[0].endswith("; %s %s" % (
        expected.plan_text(), precision.policy(hparams.precision).plan_text()))
    with open(os.path.join(trained_job.job_dir, report.TEST_RESULTS_FILENAME)) as stream:
        recorded = json.load(stream)["training_compute"]
    assert recorded["tflop"] == pytest.approx(expected.flops() / 1e12)
    # 10 steps, timed from the end of the first (whose fetch of the global step may read
    # it before its update, or after), the evaluations after the checkpoints at steps 5
    # and 10 left out (training.progress).
    assert recorded["timed_steps"] in (9, 10)
    assert recorded["gflop_per_sec"] == pytest.approx(
        recorded["timed_tflop"] * 1e3 / recorded["step_secs"])
    assert recorded["peak_precision"] == hparams.precision
    summary = trained_job.result.stdout
    assert re.search(r"^  training compute     [0-9.e-]+ TFLOP, \d+ GFLOP/s over \d+ s of "
                     r"training steps$", summary, re.M), summary
    assert re.search(r"^  share of CPU peak    \d+ %% of \d+ GFLOP/s, its %s peak: \d+ cores x "
                     r"\d+ MHz x " % hparams.precision, summary, re.M), summary
