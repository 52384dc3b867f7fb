"""What a run's steps and evaluations took is kept per machine, in the cache of machine
measurements, and scales the next run's estimate (machine/step_speeds.py,
main.make_run_progress)."""

import json
import logging
import os

import pytest

from cifar10_estimator import flags, main
from cifar10_estimator.machine import measurement_cache, precision_speed, step_speeds
from cifar10_estimator.run import time_to_go

from test_time_to_go import FakeClock, train_steady

SPRINT_COSTS = time_to_go.Costs({16: 0.0002, 24: 0.0003, 32: 0.0005}, view_secs=0.0001)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_costs_are_kept_per_machine_in_the_cache_of_machine_measurements(cache_home):
    assert step_speeds.recorded() is None
    step_speeds.keep(SPRINT_COSTS)
    assert step_speeds.recorded() == SPRINT_COSTS
    path = measurement_cache.cache_path(step_speeds.CACHE_FILENAME)
    assert os.path.dirname(path) == os.path.dirname(measurement_cache.cache_path(precision_speed.CACHE_FILENAME))
    with open(path) as stream:
        content = json.load(stream)
    assert content["format"] == step_speeds.CACHE_FORMAT
    assert content["machines"] == {measurement_cache.machine_key(): {
        "example_secs": {"16": 0.0002, "24": 0.0003, "32": 0.0005}, "view_secs": 0.0001}}


def test_a_run_of_more_sizes_replaces_the_costs_and_one_of_fewer_keeps_none(cache_home):
    step_speeds.keep(time_to_go.Costs({24: 0.0003, 32: 0.0005}))
    step_speeds.keep(SPRINT_COSTS)
    assert step_speeds.recorded() == SPRINT_COSTS
    step_speeds.keep(time_to_go.Costs({32: 0.0009}, view_secs=0.001))
    step_speeds.keep(None)
    assert step_speeds.recorded() == SPRINT_COSTS


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": "other/1"}),
                                     json.dumps({"format": step_speeds.CACHE_FORMAT,
                                                 "machines": ["a list"]})])
def test_a_foreign_or_broken_cache_is_no_record_and_is_replaced(cache_home, content):
    path = measurement_cache.cache_path(step_speeds.CACHE_FILENAME)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as stream:
        stream.write(content)
    assert step_speeds.recorded() is None
    step_speeds.keep(SPRINT_COSTS)
    assert step_speeds.recorded() == SPRINT_COSTS


def test_a_cache_that_cannot_be_written_costs_the_record_only(cache_home, caplog):
    # An earlier in-process command may have left TensorFlow's logger at ERROR; the trainer
    # sets it to INFO (flags.quiet_tensorflow_logs), so the warning shows there.
    caplog.set_level(logging.INFO, logger="tensorflow")
    os.makedirs(cache_home)
    (cache_home / "cifar10_estimator").write_text("a file where the folder should be")
    step_speeds.keep(SPRINT_COSTS)
    assert "were not kept" in caplog.text


def run_progress_of(tmp_path, task=None):
    """The RunProgress main makes for the sprint recipe (its phases end at steps 2184,
    4368 and 6240), on a FakeClock, its first point recorded."""
    settings = flags.parse(["--job-dir", str(tmp_path / "job"), "--num-gpus", "0",
                            "--recipe", "sprint", "--use-synthetic-data"])
    progress = main.make_run_progress(settings, task, main.make_run_config(settings), 1.0)
    progress.clock = clock = FakeClock()
    progress.record(0)
    return progress, clock


def test_a_run_on_one_machine_scales_the_sizes_it_has_not_reached_by_the_record(
        cache_home, tmp_path):
    step_speeds.keep(time_to_go.Costs({16: 0.0002, 24: 0.0004, 32: 0.0008}))
    progress, clock = run_progress_of(tmp_path)
    train_steady(progress, clock, 0, 600, steps_per_sec=20)
    # Steps of 0.05 s at 16 pixels: 0.1 s at 24, 0.2 s at 32 as the record has them;
    # a view a third of a 32-pixel example's time; one evaluation of the 5000 views of
    # a batch of 500 during training, the validation and test ones after it.
    view_secs = 0.2 / 128 / 3
    assert progress.estimate().seconds_to_go == pytest.approx(
        1584 * 0.05 + 2184 * 0.1 + 1872 * 0.2 + 5000 * view_secs + 10000 * view_secs)
    # A cluster's task scales them by their pixels, and evaluates nothing.
    progress, clock = run_progress_of(tmp_path, task=object())
    train_steady(progress, clock, 0, 600, steps_per_sec=20)
    assert progress.estimate().seconds_to_go == pytest.approx(
        1584 * 0.05 + 2184 * 0.05 * 2.25 + 1872 * 0.05 * 4)
