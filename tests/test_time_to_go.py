"""The time to go: a rate only from enough training, image-size phases, pauses, evaluations."""

import dataclasses
import math

import pytest

from cifar10_estimator import flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.run import time_to_go
from cifar10_estimator.settings import schedule
from cifar10_estimator.training import compute
from tools import time_to_go_errors


class FakeClock:
    """A clock for RunProgress that moves only when told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, secs):
        self.now += secs


def started_progress(last_step, examples_per_global_step, **options):
    """(a RunProgress on a FakeClock, the clock), its first point recorded at step 0."""
    clock = FakeClock()
    progress = time_to_go.RunProgress(last_step, examples_per_global_step, clock=clock,
                                      **options)
    progress.record(0)
    return progress, clock


def train_steady(progress, clock, from_step, to_step, steps_per_sec, every=10):
    for global_step in range(from_step + every, to_step + 1, every):
        clock.advance(every / steps_per_sec)
        progress.record(global_step)


def line(progress):
    return time_to_go.progress_line(progress.estimate())


@pytest.mark.parametrize("secs, text", [
    (0.4, "0 s"), (45, "45 s"), (89, "89 s"), (90, "1 min 30 s"), (176, "3 min"),
    (271, "4 min 30 s"), (594, "9 min 50 s"), (596, "10 min"), (21 * 60 + 10, "21 min"),
    (3569, "59 min"), (3600, "1 h"), (95 * 60, "1 h 35 min"),
])
def test_durations_read_as_a_person_would_say_them(secs, text):
    assert time_to_go.duration_text(secs) == text


@pytest.mark.parametrize("secs", [0.4, 45, 271, 596, 3569, 95 * 60 + 20])
def test_a_said_duration_reads_back_as_the_seconds_it_rounds_to(secs):
    said = time_to_go_errors.duration_secs("about " + time_to_go.duration_text(secs))
    assert abs(said - secs) <= (5 if secs < 595 else 30)


def test_progress_line_gives_steps_percent_rate_and_time_to_go():
    progress, clock = started_progress(10530, 128)
    train_steady(progress, clock, 0, 200, steps_per_sec=4)  # 50 s at 512 examples/sec
    estimate = progress.estimate()
    assert estimate == time_to_go.ProgressEstimate(
        200, 10530, examples_per_sec=512, seconds_to_go=(10530 - 200) / 4)
    assert time_to_go.progress_line(estimate) == (
        "step 200/10530 (2 %), 512 examples/sec, about 43 min to go")


def test_the_first_lines_give_no_time_until_a_rate_rests_on_enough_training():
    # A newcomer's run on a Xeon said "about 27 min to go" at step 10 of a run that took
    # 12 min 46 s: its first steps run far slower than the rest.
    progress, clock = started_progress(14060, 64)
    train_steady(progress, clock, 0, 10, steps_per_sec=16)
    assert line(progress) == "step 10/14060 (0 %), time to go not known yet"
    assert progress.estimate().examples_per_sec == 16 * 64  # for TensorBoard's curve
    train_steady(progress, clock, 10, 170, steps_per_sec=16)
    assert progress.estimate().seconds_to_go is None  # 10.6 s of training
    train_steady(progress, clock, 170, 570, steps_per_sec=32)
    # The newer half of its 23 s of training holds none of the slow steps.
    assert progress.estimate().seconds_to_go == pytest.approx((14060 - 570) / 32)


def test_when_training_is_done_the_time_to_go_is_the_final_evaluations():
    # A run too short for a rate, e.g. a smoke test: at its last step only the final
    # evaluation is left, at a third of a training example's time a view.
    progress, clock = started_progress(15, 32, evaluations=time_to_go.EvaluationPlan(final_views=96))
    train_steady(progress, clock, 0, 15, steps_per_sec=5, every=5)
    assert progress.estimate().seconds_to_go == pytest.approx(96 / (5 * 32) / 3)
    assert line(progress) == "step 15/15 (100 %), 160 examples/sec, about 0 s to go"


def test_the_rate_follows_the_newer_half_of_the_training_and_at_most_two_minutes():
    progress, clock = started_progress(10000, 128)
    for secs, steps_per_sec in [(1200, 1), (100, 2)]:  # 1200 s slow, then 100 s fast
        train_steady(progress, clock, progress.global_step,
                     progress.global_step + secs * steps_per_sec, steps_per_sec)
    # The newest 120 s: 20 slow, 100 fast. Since the start: 1400 steps in 1300 s.
    assert progress.estimate().examples_per_sec == pytest.approx(128 * 220 / 120)


def test_time_outside_training_raises_time_to_go_in_proportion():
    def estimate_after(outside_secs):
        progress, clock = started_progress(1000, 128)
        train_steady(progress, clock, 0, 300, steps_per_sec=1, every=50)
        progress.pause(300)
        clock.advance(outside_secs)  # a checkpoint, a new session
        progress.pause(300)  # a second pause (the session's end) changes nothing
        progress.record(300)
        train_steady(progress, clock, 300, 400, steps_per_sec=1, every=50)
        return progress.estimate()

    # 600 s of training to go; 100 s of the 500 s so far were outside it.
    assert estimate_after(0).seconds_to_go == 600
    assert estimate_after(100).seconds_to_go == pytest.approx(600 * 500 / 400)
    assert estimate_after(100).examples_per_sec == 128


SPRINT_PHASES = ((16, 1000), (24, 2000), (32, 3000))


def test_a_phase_not_reached_costs_its_pixels_against_the_phase_training_now():
    progress, clock = started_progress(3000, 10, phases=SPRINT_PHASES)
    train_steady(progress, clock, 0, 600, steps_per_sec=4)
    # 400 steps at 4 a second; at 24 pixels 2.25 times as long a step, at 32 4 times.
    assert progress.estimate().seconds_to_go == pytest.approx(
        400 / 4 + 1000 * 2.25 / 4 + 1000 * 4 / 4)
    # A new size's first steps: still scaled from the phase before, until it has a rate.
    train_steady(progress, clock, 600, 1000, steps_per_sec=4)
    train_steady(progress, clock, 1000, 1010, steps_per_sec=2)
    assert progress.estimate().seconds_to_go == pytest.approx(990 * 2.25 / 4 + 1000 * 4 / 4)
    train_steady(progress, clock, 1010, 1100, steps_per_sec=2)
    assert progress.estimate().examples_per_sec == 20
    assert progress.estimate().seconds_to_go == pytest.approx(900 / 2 + 1000 * 16 / 9 / 2)


def test_a_first_runs_time_to_go_is_a_bound_until_its_last_image_size():
    # With no costs kept, the phases to come are scaled from smaller images by their
    # pixels, which overstates them: the line says so, and says "about" once none is left.
    progress, clock = started_progress(3000, 10, phases=SPRINT_PHASES)
    train_steady(progress, clock, 0, 600, steps_per_sec=4)
    assert progress.estimate().is_bound
    assert line(progress).endswith(", 40 examples/sec, at most 28 min to go")
    train_steady(progress, clock, 600, 2100, steps_per_sec=4)
    assert not progress.estimate().is_bound
    assert ", about " in line(progress)
    kept = time_to_go.Costs({16: 1.0, 24: 1.5, 32: 2.5})
    progress, clock = started_progress(3000, 10, phases=SPRINT_PHASES, costs=kept)
    train_steady(progress, clock, 0, 600, steps_per_sec=4)
    assert not progress.estimate().is_bound


def test_a_machines_costs_scale_the_phases_not_reached_and_the_evaluations():
    costs = time_to_go.Costs({16: 1.0, 24: 1.5, 32: 2.5}, view_secs=0.5)
    progress, clock = started_progress(3000, 10, phases=SPRINT_PHASES, costs=costs,
                                       evaluations=time_to_go.EvaluationPlan(final_views=100))
    train_steady(progress, clock, 0, 600, steps_per_sec=4)
    # This run's steps take 0.25 s where the machine's took 10 examples of 1.0 s.
    per_cost = 0.25 / 10
    assert progress.estimate().seconds_to_go == pytest.approx(
        400 / 4 + 1000 * 1.5 / 4 + 1000 * 2.5 / 4 + 100 * 0.5 * per_cost)
    # Costs without a size scale it from the nearest size they have, by the pixels.
    progress, clock = started_progress(3000, 10, phases=SPRINT_PHASES,
                                       costs=time_to_go.Costs({16: 1.0, 24: 3.0}))
    train_steady(progress, clock, 0, 600, steps_per_sec=4)
    assert progress.estimate().seconds_to_go == pytest.approx(
        400 / 4 + 1000 * 3 / 4 + 1000 * 3 * 16 / 9 / 4)


def test_the_evaluations_to_come_are_timed_from_training_until_one_is_measured():
    # 1500 views of an image each evaluation, one each 120 s of wall time, and 3000 after
    # the last step; training on 10 examples a second, a view a third of one: 1/30 s.
    progress, clock = started_progress(200, 10, evaluations=time_to_go.EvaluationPlan(
        views_each=1500, every_secs=120, final_views=3000))
    train_steady(progress, clock, 0, 50, steps_per_sec=1)
    # Evaluations of 50 s, 70 s of training apart: the 200 s of training see 2.
    assert progress.estimate().seconds_to_go == pytest.approx(150 + 2 * 50 + 3000 / 30)
    # Measured, all in: its pause took 30 s for 1500 views (its timer saw 25 of them).
    progress.pause(50)
    progress.add_evaluation(25, views=1500)
    clock.advance(30)
    progress.record(50)
    assert progress.last_evaluation_secs == 25
    train_steady(progress, clock, 50, 100, steps_per_sec=1)
    estimate = progress.estimate()
    assert estimate.examples_per_sec == 10
    # Those to come during training now keep their share of the time with the rest.
    assert estimate.seconds_to_go == pytest.approx(100 * 130 / 100 + 3000 * 30 / 1500)


def test_a_paused_interval_leaves_the_rate_and_the_timed_training():
    progress, clock = started_progress(10000, 128)
    train_steady(progress, clock, 0, 2000, steps_per_sec=10)
    # SIGSTOP for half an hour (or a suspended laptop) in the middle of 10 steps.
    clock.advance(1800)
    train_steady(progress, clock, 2000, 2010, steps_per_sec=10)
    estimate = progress.estimate()
    assert estimate.seconds_to_go == pytest.approx(7990 / 10)
    assert time_to_go.progress_line(estimate) == (
        "step 2010/10000 (20 %), 1280 examples/sec, about 13 min to go")
    assert progress.training_secs == pytest.approx(200)
    assert progress.timed_steps_per_phase == [2000]


def test_a_finished_run_gives_its_costs_for_the_next():
    progress, clock = started_progress(300, 10, phases=((16, 100), (24, 120), (32, 300)),
                                       evaluations=time_to_go.EvaluationPlan(final_views=1000))
    assert progress.finish() is None  # nothing trained
    train_steady(progress, clock, 0, 100, steps_per_sec=5)  # 20 s
    train_steady(progress, clock, 100, 120, steps_per_sec=2)  # 10 s: too little for a rate
    train_steady(progress, clock, 120, 300, steps_per_sec=1)
    progress.pause(300)
    progress.add_evaluation(18, views=1000)
    clock.advance(20)
    costs = progress.finish()
    assert costs.example_secs == pytest.approx({16: 0.02, 32: 0.1})
    assert costs.view_secs == pytest.approx(0.02)  # all in: the pause's 20 s
    assert progress.timed_steps_per_phase == [100, 20, 180]
    assert progress.training_secs == pytest.approx(210)


# Examples/sec of the sprint recipe's steps before it took Muon (batch 128, the same
# schedule) at each image size after each phase's first minute on 2-core AMD EPYCs: a
# Zen 4 (family 25, model 17) and a Zen 5 (family 26, model 2) in bf16, a Zen 3 (family
# 25, model 1) in fp32; and the seconds of their final evaluation, 100000 views of the
# 10000 test images (the Zen 5's scaled from the Zen 4's by their 32-pixel rates). A
# 32-pixel step costs 2.8, 2.6 and 5.1 times a 16-pixel one there: no rule of pixels
# holds on every CPU.
MACHINES = {
    "zen4": ({16: 3450, 24: 1940, 32: 1245}, 25),
    "zen5": ({16: 5964, 24: 3295, 32: 2286}, 14),
    "zen3": ({16: 1190, 24: 524, 32: 235}, 81),
}


def fed_run(hparams, examples_per_sec, slow_start, final_secs, costs=None):
    """Feed a RunProgress the points of a whole run, 10 global steps apart, and return
    ({global step: (the time to go it said, the time that remained)}, its Costs).

    Each phase's steps run at examples_per_sec[its image side], each taking
    1 + slow_start x exp(-t / 30 s) times as long t seconds into its phase (kernels and
    memory for a new image size); as the trainer's checkpoints do, every 600 s of wall
    time from the last (an evaluation included) training pauses for an evaluation of
    final_secs, and the run ends final_secs after its last step."""
    last_step = schedule.last_step(hparams)
    phases = compute.image_size_phases(hparams, 32)
    views = 100000
    progress, clock = started_progress(last_step, hparams.examples_per_global_step,
                                       phases=phases, costs=costs,
                                       evaluations=time_to_go.EvaluationPlan(views, 600, views))
    said, global_step, last_evaluation = {}, 0, clock()
    for side, end in phases:
        phase_start = clock()
        while global_step < end:
            steps = min(10, end - global_step)
            slowness = 1 + slow_start * math.exp(-(clock() - phase_start) / 30)
            clock.advance(steps * hparams.train_batch_size / examples_per_sec[side] * slowness)
            global_step += steps
            progress.record(global_step)
            said[global_step] = progress.estimate().seconds_to_go, clock()
            if clock() - last_evaluation >= 600 and global_step < last_step:
                progress.pause(global_step)
                last_evaluation = clock()
                progress.add_evaluation(final_secs, views)
                clock.advance(final_secs)
                progress.record(global_step)
    progress.pause(last_step)
    progress.add_evaluation(final_secs, views)
    clock.advance(final_secs)
    return {step: (secs, clock() - time) for step, (secs, time) in said.items()}, (
        progress.finish())


def recipe_hparams(recipe, num_train_examples):
    """The HParams of `--recipe recipe` on data of num_train_examples training images."""
    hparams = flags.parse(["--job-dir", "job", "--recipe", recipe]).hparams
    return dataclasses.replace(hparams, num_train_examples=num_train_examples)


def errors_at(said, last_step):
    errors = {}
    for percent in (20, 50, 70, 90):
        step = min(step for step in said if step >= percent / 100 * last_step)
        secs, remaining = said[step]
        errors[percent] = round(100 * (secs / remaining - 1))
    return errors


@pytest.mark.parametrize("slow_start", [0.0, 0.3])
@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("recipe, num_train_examples", [("sprint", 50000), ("quick", 45000)])
def test_the_time_to_go_holds_with_the_costs_of_the_machines_run_before(
        recipe, num_train_examples, machine, slow_start):
    hparams = recipe_hparams(recipe, num_train_examples)
    examples_per_sec, final_secs = MACHINES[machine]
    # The run before: another recipe, its 32-pixel steps 5 % slower than this run's.
    before = {**examples_per_sec, 32: examples_per_sec[32] / 1.05}
    _, costs = fed_run(recipe_hparams("sprint", 50000), before, slow_start, final_secs)
    said, _ = fed_run(hparams, examples_per_sec, slow_start, final_secs, costs)
    errors = errors_at(said, schedule.last_step(hparams))
    assert all(abs(error) <= 10 for error in errors.values()), errors


def test_without_costs_a_phase_not_reached_is_scaled_by_its_pixels_an_upper_bound():
    # A step's work that does not grow with the images (its optimizer update, each op's
    # start) makes a larger image's step cost less than its pixels say: on the Zen 5, 2.6
    # times a 16-pixel step at 32 pixels, not 4. So the first run on a machine says too
    # much until it has timed each size, never too little.
    hparams = recipe_hparams("sprint", 50000)
    said, _ = fed_run(hparams, MACHINES["zen5"][0], 0.0, MACHINES["zen5"][1])
    errors = errors_at(said, schedule.last_step(hparams))
    assert errors[20] > 10 and min(errors.values()) > -5 and abs(errors[90]) <= 10, errors


def test_the_errors_of_a_finished_runs_time_to_go_come_from_its_log(tmp_path):
    # A run resumed once: the log's last run is read, from the schedule's line on.
    hparams = dataclasses.replace(recipe_hparams("sprint", 50000), train_steps=1000,
                                  lower_resolution_epochs=0.64, low_resolution_epochs=0.64)
    job_hparams.record_run(str(tmp_path), hparams, None, 0)
    lines = [(0, "Recipe sprint. Training to step 1000"), (5, "step 500/1000 (50 %), 9 "
             "examples/sec, about 2 h to go"), (9, "Recipe sprint. Training to step 1000")]
    # Two steps a second; each phase's first 120 steps at 800 examples/sec, then 1000.
    starts = [0] + [end for _, end in schedule.resolution_phases(hparams)]
    lines += [(10 + step / 2, "Average examples/sec: 900 (%d), step = %d" % (
        800 if step - max(start for start in starts if start <= step) < 120 else 1000, step))
        for step in range(10, 1000, 10)]
    lines += [(110, "step 200/1000 (20 %), 1000 examples/sec, about 6 min 20 s to go"),
              (260, "step 500/1000 (50 %), 1000 examples/sec, about 4 min 30 s to go"),
              (360, "step 700/1000 (70 %), 1000 examples/sec, about 3 min 10 s to go"),
              (460, "step 900/1000 (90 %), 1000 examples/sec, about 60 s to go"),
              (510, "evaluation of step 1000 on the test set: accuracy 10.00 %"),
              (530, "Test accuracy: 0.1000 on 10000 examples")]
    with open(str(tmp_path / "train.log"), "w") as log:
        for secs, message in sorted(lines):
            log.write("2026-11-28 10:%02d:%02d,%03d INFO:tensorflow:%s\n"
                      % (secs // 60, secs % 60, round(secs % 1 * 1000), message))
    assert time_to_go_errors.report(str(tmp_path), [20, 50, 70, 90]) == [
        "%s (recipe sprint):" % tmp_path,
        "  20 % (step 200): said about 6 min 20 s, 420 s remained (-10 %)",
        "  50 % (step 500): said about 4 min 30 s, 270 s remained (+0 %)",
        "  70 % (step 700): said about 3 min 10 s, 170 s remained (+12 %)",
        "  90 % (step 900): said about 60 s, 70 s remained (-14 %)",
        "  16-pixel steps: 800 examples/sec in their first minute, 1000 after",
        "  24-pixel steps: 800 examples/sec in their first minute, 1000 after",
        "  32-pixel steps: 800 examples/sec in their first minute, 1000 after"]
