"""What a run's steps took at each image size is kept per machine and rates the next run's
phases (machine/step_speeds.py, run/time_to_go.py, main.make_run_progress)."""

import json
import logging
import os

import pytest

from cifar10_estimator import flags, main
from cifar10_estimator.machine import measurement_cache, step_speeds
from cifar10_estimator.run import time_to_go

from test_time_to_go import recipe_hparams, started_progress, train_steady


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sprint_settings(*more):
    return flags.parse(["--job-dir", "job", "--num-gpus", "0", "--recipe", "sprint", *more])


def test_a_record_is_read_back_for_the_same_step_only(cache_home):
    hparams = sprint_settings().hparams
    assert step_speeds.recorded(hparams, 0, "channels_last") == {}
    step_speeds.record(hparams, 0, "channels_last", {16: 0.1076, 32: 0.545})
    assert step_speeds.recorded(hparams, 0, "channels_last") == {16: 0.1076, 32: 0.545}
    # A later run adds its sizes and replaces those it measured again.
    step_speeds.record(hparams, 0, "channels_last", {24: 0.244, 32: 0.5})
    assert step_speeds.recorded(hparams, 0, "channels_last") == {16: 0.1076, 24: 0.244,
                                                                32: 0.5}
    # Another batch, precision or layout, or Muon's updates, is another step.
    for more in (["--train-batch-size", "64"], ["--muon-learning-rate", "0.2"]):
        other = sprint_settings(*more).hparams
        assert step_speeds.recorded(other, 0, "channels_last") == {}
    assert step_speeds.recorded(hparams, 0, "channels_first") == {}
    with open(measurement_cache.cache_path(step_speeds.CACHE_FILENAME)) as stream:
        content = json.load(stream)
    assert content["format"] == step_speeds.CACHE_FORMAT
    assert list(content["machines"]) == [measurement_cache.machine_key()]


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": "other/1"}),
                                     json.dumps({"format": step_speeds.CACHE_FORMAT,
                                                 "machines": ["a list"]})])
def test_a_foreign_or_broken_cache_is_no_record_and_is_replaced(cache_home, content):
    path = measurement_cache.cache_path(step_speeds.CACHE_FILENAME)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as stream:
        stream.write(content)
    hparams = sprint_settings().hparams
    assert step_speeds.recorded(hparams, 0, "channels_last") == {}
    step_speeds.record(hparams, 0, "channels_last", {32: 0.5})
    assert step_speeds.recorded(hparams, 0, "channels_last") == {32: 0.5}


def test_a_cache_that_cannot_be_written_costs_the_record_only(cache_home, caplog):
    # An earlier in-process command may have left TensorFlow's logger at ERROR; the trainer
    # sets it to INFO (flags.quiet_tensorflow_logs), so the warning shows there.
    caplog.set_level(logging.INFO, logger="tensorflow")
    os.makedirs(cache_home)
    (cache_home / "cifar10_estimator").write_text("a file where the folder should be")
    step_speeds.record(sprint_settings().hparams, 0, "channels_last", {32: 0.5})
    assert "were not kept" in caplog.text


def test_the_phases_that_trained_long_enough_give_their_step_times():
    phases = time_to_go.training_phases(recipe_hparams("sprint", 50000), 32)
    assert [phase.side for phase in phases] == [16, 24, 32]
    progress, clock = started_progress(7800, 128, phases=phases)
    train_steady(progress, clock, 0, 2730, steps_per_sec=1 / 0.1076)
    # The 24-pixel phase trains under MIN_RECORDED_SECS after its settling seconds: not kept.
    train_steady(progress, clock, 2730, 2930, steps_per_sec=1 / 0.244)
    assert 200 * 0.244 < time_to_go.PHASE_SETTLING_SECS + time_to_go.MIN_RECORDED_SECS
    measured = progress.step_secs()
    assert list(measured) == [16]
    assert measured[16] == pytest.approx(0.1076)


def test_a_run_whose_machine_load_changed_between_phases_keeps_no_step_times(caplog):
    # The Muon sprint run of docs/training.md: a test suite took half the cores through its
    # 16- and 24-pixel phases and ended before the 32-pixel one, whose steps then ran as
    # fast as the 16-pixel ones had; the next run, rated from that record, said -45 %.
    caplog.set_level(logging.INFO, logger="tensorflow")
    phases = time_to_go.training_phases(recipe_hparams("sprint", 50000), 32)
    progress, clock = started_progress(7800, 128, phases=phases)
    clock.cpu.share = 0.92
    train_steady(progress, clock, 0, 2730, steps_per_sec=1 / 0.17)
    train_steady(progress, clock, 2730, 5460, steps_per_sec=1 / 0.20)
    clock.cpu.share = 1.81
    train_steady(progress, clock, 5460, 7800, steps_per_sec=1 / 0.095)
    assert progress.step_secs() == {}
    assert "load of the machine changed" in caplog.text
    assert "0.92 at 16 pixels" in caplog.text and "1.81 at 32 pixels" in caplog.text


def test_a_run_under_one_load_keeps_its_step_times_even_a_shared_one():
    # What is kept is the sizes' costs relative to each other: a run that shared the
    # machine all along gives them as well as one alone.
    for share in (0.9, 1.8):
        phases = time_to_go.training_phases(recipe_hparams("sprint", 50000), 32)
        progress, clock = started_progress(7800, 128, phases=phases)
        clock.cpu.share = share
        train_steady(progress, clock, 0, 2730, steps_per_sec=1 / 0.036)
        # Within MAX_CPU_SHARE_SPREAD: kept.
        clock.cpu.share = share * 1.2
        train_steady(progress, clock, 2730, 5460, steps_per_sec=1 / 0.063)
        train_steady(progress, clock, 5460, 7800, steps_per_sec=1 / 0.097)
        assert progress.step_secs() == pytest.approx({16: 0.036, 24: 0.063, 32: 0.097})


def test_a_run_on_one_machine_rates_its_phases_from_the_record(cache_home):
    settings = sprint_settings()
    hparams = settings.hparams
    prior = main.training_phases(settings)
    assert prior == time_to_go.training_phases(hparams, 32)
    step_speeds.record(hparams, 0, "channels_last", {16: 0.1076, 24: 0.244, 32: 0.545})
    phases = main.training_phases(settings)
    assert [phase.relative_cost for phase in phases] == pytest.approx(
        [0.1076 / 0.545, 0.244 / 0.545, 1.0])
    assert [phase.end_step for phase in phases] == [phase.end_step for phase in prior]
    # A cluster task keeps the prior; a record missing a size too.
    assert main.training_phases(settings, task=object()) == prior
    step_speeds.record(hparams, 0, "channels_first", {16: 0.1, 32: 0.5})
    assert [phase.relative_cost for phase in main.training_phases(
        settings, data_format="channels_first")] == pytest.approx(
            [0.2, prior[1].relative_cost, 1.0])
