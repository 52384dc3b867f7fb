"""A mixed precision slower than fp32 on this machine is told at start, from a measurement."""

import contextlib
import json
import os

import pytest

from cifar10_estimator import flags, main
from cifar10_estimator.machine import hardware, measurement_cache, precision_speed
from cifar10_estimator.settings import precision
from cli_helpers import run_module

BF16 = precision.policy("bf16")
# The Intel Xeon (family 6, model 207) of the machines issue: bf16 at 0.72x fp32.
SLOWER = {"fp32": 637.0, "bf16": 459.0, "measured": "2026-11-23"}


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_cache(speeds):
    path = measurement_cache.cache_path(precision_speed.CACHE_FILENAME)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as stream:
        json.dump({"format": precision_speed.CACHE_FORMAT,
                   "machines": {measurement_cache.machine_key(): speeds}}, stream)


def scripted_probe(rates):
    """A make_probe whose rounds return the next of rates[policy name]."""
    calls = []

    @contextlib.contextmanager
    def make_probe(policy):
        remaining = iter(rates[policy.name])

        def run_round():
            calls.append(policy.name)
            return next(remaining)
        yield run_round
    return make_probe, calls


def never_measure(policy):
    raise AssertionError("measured although the cache knows this machine")


def test_a_slower_precision_gets_one_line_naming_the_ratio_and_what_to_use():
    line = precision_speed.slower_than_fp32_warning(BF16, SLOWER)
    assert "\n" not in line
    assert line.startswith("--precision bf16 trains at 0.72x the speed of fp32 on this machine")
    assert "459 against 637 examples/sec" in line and line.endswith("use --precision fp32 here")


def test_a_faster_precision_gets_no_warning():
    assert precision_speed.slower_than_fp32_warning(
        BF16, {"fp32": 560.0, "bf16": 842.0}) is None


def test_rounds_alternate_and_keep_each_precisions_best_then_the_cache_answers(cache_home):
    make_probe, calls = scripted_probe({"fp32": [600, 640, 620], "bf16": [450, 430, 459]})
    speeds = precision_speed.measured_speeds(BF16, make_probe)
    assert calls == ["fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]
    assert (speeds["fp32"], speeds["bf16"]) == (640, 459)
    with open(measurement_cache.cache_path(precision_speed.CACHE_FILENAME)) as stream:
        cached = json.load(stream)["machines"][measurement_cache.machine_key()]
    assert (cached["fp32"], cached["bf16"]) == (640, 459)
    assert precision_speed.measured_speeds(BF16, never_measure)["bf16"] == 459


def test_another_machine_in_the_cache_is_not_taken_for_this_one(cache_home):
    write_cache(SLOWER)
    with open(measurement_cache.cache_path(precision_speed.CACHE_FILENAME)) as stream:
        content = json.load(stream)
    content["machines"] = {"another CPU": SLOWER}
    with open(measurement_cache.cache_path(precision_speed.CACHE_FILENAME), "w") as stream:
        json.dump(content, stream)
    make_probe, calls = scripted_probe({"fp32": [500] * 3, "bf16": [700] * 3})
    assert precision_speed.measured_speeds(BF16, make_probe)["bf16"] == 700
    assert calls


def test_the_probe_really_trains_and_times(cache_home):
    with precision_speed.TrainingProbe(precision.policy("fp32")) as run_round:
        assert run_round() > 0


needs_bf16_cpu = pytest.mark.skipif(
    precision.unsupported_reason(BF16, 0, hardware.cpu_flags(), hardware.onednn_enabled())
    is not None, reason="this CPU cannot train in bf16 at all (refused, tested elsewhere)")


@needs_bf16_cpu
@pytest.mark.slow
def test_the_trainer_warns_at_start_where_bf16_was_measured_slower(cache_home, tmp_path):
    write_cache(SLOWER)
    result = run_module("cifar10_estimator.main", [
        "--use-synthetic-data", "--job-dir", tmp_path / "job", "--num-gpus", "0",
        "--num-layers", "8", "--train-batch-size", "8", "--train-steps", "2",
        "--precision", "bf16"], timeout=300, env={"XDG_CACHE_HOME": str(cache_home)})
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "speed of fp32" in line]
    assert len(warnings) == 1 and "0.72x" in warnings[0]
    assert warnings[0].startswith("warning: ")


ZEN4_FLAGS = {"avx512f", "avx512_bf16"}


def test_auto_takes_bf16_where_it_is_measured_faster(cache_home):
    make_probe, _ = scripted_probe({"fp32": [560.0] * 3, "bf16": [842.0] * 3})
    name, line = precision_speed.fastest_precision(0, ZEN4_FLAGS, True, make_probe)
    assert name == "bf16"
    assert line.startswith("--precision auto: bf16 (1.50x the speed of fp32 on this machine")


def test_auto_keeps_fp32_where_bf16_is_slower(cache_home):
    write_cache(SLOWER)
    name, line = precision_speed.fastest_precision(0, ZEN4_FLAGS, True, never_measure)
    assert name == "fp32"
    assert "bf16 trains at 0.72x the speed of fp32" in line


@pytest.mark.parametrize("cpu_flags, onednn", [({"avx2", "avx512f"}, True),
                                               (ZEN4_FLAGS, False)])
def test_auto_takes_fp32_without_measuring_where_no_mixed_precision_is_served(
        cache_home, cpu_flags, onednn):
    name, line = precision_speed.fastest_precision(0, cpu_flags, onednn, never_measure)
    assert name == "fp32" and "bf16 needs avx512_bf16 or amx_bf16 instructions" in line


@pytest.mark.parametrize("capabilities, expected, why", [
    ([(8, 0), (8, 0)], "tf32", "these GPUs (compute capability 8.0) have TF32 tensor cores"),
    ([(9, 0), (8, 6)], "tf32", "compute capability 8.6"),
    ([(7, 0), (7, 0)], "fp32", "TF32 needs compute capability 8.0, and a GPU here is 7.0"),
    ([(8, 0), (7, 5)], "fp32", "a GPU here is 7.5"),  # every GPU must have it
    ([], "fp32", "a GPU here is 0.0"),  # GPUs TensorFlow describes without a capability
])
def test_auto_on_gpus_names_tf32_where_every_gpu_has_it_else_fp32(capabilities, expected, why):
    name, line = precision_speed.fastest_precision(2, ZEN4_FLAGS, True, never_measure,
                                                   gpu_compute_capabilities=capabilities)
    assert name == expected
    assert line.startswith("--precision auto: %s (" % expected) and why in line, line


@pytest.mark.parametrize("asked", ["auto", "bf16"])
def test_the_precision_a_run_trains_in_is_said_once(cache_home, monkeypatch, asked,
                                                    tensorflow_info_messages):
    # A machine that serves bf16 (the Zen 4's flags), measured at 1.50x fp32 before.
    monkeypatch.setattr(hardware, "cpu_flags", lambda: ZEN4_FLAGS)
    monkeypatch.setattr(hardware, "onednn_enabled", lambda: True)
    write_cache({"fp32": 560.0, "bf16": 842.0, "measured": "2026-11-28"})
    settings = flags.resolve(flags.parse(
        ["--job-dir", "job", "--use-synthetic-data", "--num-gpus", "0", "--precision", asked]))
    hparams = settings.hparams
    cost = main.evaluated_image_cost(precision.policy(hparams.precision), 0, hparams)
    assert hparams.precision == "bf16" and cost == pytest.approx(842 / 560)
    said = [line for line in tensorflow_info_messages if "precision" in line]
    assert len(said) == 1 and "1.50x the speed of fp32 on this machine" in said[0], said
