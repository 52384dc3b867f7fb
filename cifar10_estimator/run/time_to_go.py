"""The run's time to go: where training is, its rate, and when it ends, as one line.

RunProgress keeps the global steps and wall time of the whole run, from the points that
run.progress's hooks record; they pause its clock at each checkpoint, since an
evaluation may follow. The time to go knows the run's plan: its training phases (steps
on smaller images cost less; `training_phases`) and the evaluations still to come, during
training and after the last step (`EvaluationPlan`). A phase is rated from the phase
before it, scaled by the relative cost of their steps, until it has trained a while; then
its own steps take over, as they accumulate. An evaluation is timed from the evaluations
measured so far, and until there is one from the training rate
(FORWARD_PASSES_PER_TRAINING_EXAMPLE). An interval far longer than the rate says (the
process stopped, a laptop suspended) is neither training nor the time between sessions:
it is left out. Imports no TensorFlow: arithmetic on the points it is told.
"""

import collections
import dataclasses
import logging
import math
import time

from cifar10_estimator.run import console
from cifar10_estimator.settings import schedule

# A phase's own rate comes from about this much of its recent training: long enough to
# smooth over a slow batch (checkpoints and evaluations are not training), short enough
# to follow a change of speed (the machine's drift, a new image size's slow first
# minute).
PROGRESS_WINDOW_SECS = 120
# A phase's first seconds of training are slower (the start of training, and after a
# change of image size the set-up of kernels for it): they rate the phase only while
# nothing else does.
PHASE_SETTLING_SECS = 20
# After them a new image size's steps can still run slower for a minute or two (the
# sprint recipe's 32-pixel steps on a Zen 4): a phase's own steps take over from the
# rate the phase before it predicts only as they accumulate, the prediction counting as
# this many seconds of the phase's own training.
PREDICTION_WEIGHT_SECS = 60
# An interval taking this many times longer than the rate says is a pause (SIGSTOP, a
# suspended laptop), not training: it would rule the rate for minutes.
PAUSE_FACTOR = 10
# A phase whose steps trained this long after their settling seconds says what its steps
# cost on this machine well enough to keep for the next run (machine.step_speeds): the
# sprint recipe's shortest phase, 16 pixels on a Zen 5, trains under a minute.
MIN_RECORDED_SECS = 30
# What a run keeps is its phases' step times relative to each other, so they must come
# from one load of the machine: a run whose process had this many times more CPU seconds
# a second in one phase than in another (another program took the cores for part of the
# run) keeps none. Alone, the sprint recipe's phases on a 2-core Zen 4 got within a
# tenth of each other's; beside a test suite a phase gets about half of what it gets
# alone.
MAX_CPU_SHARE_SPREAD = 1.25
# A training example costs about five evaluated views of an image: the backward pass
# costs about twice the forward one, and evaluations run larger batches without the
# optimizer. The cost of a view before an evaluation was timed (docs/training.md).
FORWARD_PASSES_PER_TRAINING_EXAMPLE = 5.0
# The work of a training step that does not shrink with the images (the session's and
# hooks' work per step, the optimizer's update), as the full-size examples it costs as
# much as: a smaller share of a larger batch's step. Fitted to the steps of the quick
# recipe (batch 64) and the sprint recipe (batch 128) at each of their image sizes.
FIXED_STEP_EXAMPLES = 24
# Each evaluation's graph build and restore, and each export, beyond its forward passes.
EVALUATION_SET_UP_SECS = 2.0
EXPORT_SECS = 1.0


@dataclasses.dataclass(frozen=True)
class TrainingPhase:
    """A stretch of training with steps of one cost.

    Attributes:
      end_step: the global step at which the phase ends.
      relative_cost: the cost of one of its steps against a step on full-size images.
      side: its images' side in pixels, or None where not known.
    """

    end_step: int
    relative_cost: float = 1.0
    side: int = None


def training_phases(hparams, full_size, step_secs=None):
    """The TrainingPhases of a run: those of schedule.resolution_phases (the
    --lower-resolution and --low-resolution epochs), then full-size images.

    A step's cost against a full-size step's is what this machine's steps took at both
    sizes, where `step_secs` ({side: seconds a step took}, machine.step_speeds' record of
    earlier runs) holds both; else a fixed share of a full-size step's
    (FIXED_STEP_EXAMPLES against the batch) plus the rest in proportion to the pixels.
    """
    step_secs = step_secs or {}
    fixed_share = FIXED_STEP_EXAMPLES / (FIXED_STEP_EXAMPLES + hparams.train_batch_size)
    last_step = schedule.last_step(hparams)
    phases = []
    for side, end in schedule.resolution_phases(hparams):
        end = min(end, last_step)
        if end > (phases[-1].end_step if phases else 0):
            pixels = (side / full_size) ** 2
            cost = fixed_share + (1 - fixed_share) * pixels
            if side in step_secs and full_size in step_secs:
                cost = step_secs[side] / step_secs[full_size]
            phases.append(TrainingPhase(end, cost, side))
    if not phases or phases[-1].end_step < last_step:
        phases.append(TrainingPhase(last_step, side=full_size))
    return tuple(phases)


@dataclasses.dataclass(frozen=True)
class EvaluationPlan:
    """The evaluations a process runs besides training; a view is one image's forward pass.

    Attributes:
      every_secs: evaluations during training come at most this often (the EvalSpec's
        throttle) and only after a checkpoint.
      checkpoint_every_secs, checkpoint_every_steps: the checkpoints' schedule (one given).
      views_per_evaluation: views of an evaluation during training.
      final_views: views of the evaluations after the last step (the final one and the
        test evaluation).
      num_final_evaluations: how many evaluations run after the last step.
      exports_per_evaluation: exports after each evaluation during training and the final.
      relative_cost: a view's cost against a view in the training's precision (an
        evaluation in float32 after bf16 training costs more).
    """

    every_secs: float
    views_per_evaluation: int
    final_views: int
    num_final_evaluations: int = 2
    exports_per_evaluation: int = 0
    checkpoint_every_secs: float = None
    checkpoint_every_steps: int = None
    relative_cost: float = 1.0


@dataclasses.dataclass(frozen=True)
class ProgressEstimate:
    """Where a run is and when it ends, as RunProgress.estimate sees it.

    Attributes:
      global_step: the newest global step seen.
      last_step: the global step at which training stops.
      examples_per_sec: the rate of the phase training now, or None before there is one.
      seconds_to_go: wall time to last_step, evaluations included, or None when unknown.
    """

    global_step: int
    last_step: int
    examples_per_sec: float = None
    seconds_to_go: float = None


class RunProgress:
    """The global steps and wall time of a whole training run, and the time it has to go.

    Create one per training process and hand it to every hook of run.progress: a
    hook lives for one training session, while the recent rate and the time spent in
    evaluations span the run.

    Time is either training (between two points of one stretch of training) or
    outside it (from a pause to the point that resumes training: evaluations, and
    the start-up of a new session). Only training time gives the rate; the time to
    go is the remaining global steps at that rate, stretched by the run's ratio of
    wall time to training time, so evaluations are expected to keep taking their
    share. The start-up before the first point is counted as neither: it happens
    once and must not be extrapolated; nor is an interval that PAUSE_FACTOR calls a
    pause.
    """

    def __init__(self, last_step, examples_per_global_step, window_secs=PROGRESS_WINDOW_SECS,
                 clock=time.monotonic, phases=None, evaluations=None, report=None,
                 cpu_clock=time.process_time):
        """Args:
          last_step: the global step at which training stops.
          examples_per_global_step: examples behind one global step (the global batch
            with --sync, one worker's batch without).
          window_secs: a phase's own rate comes from its newest training intervals
            spanning at least this many seconds of training.
          clock: callable returning seconds; differences of its values are durations.
          phases: the run's TrainingPhases in order; None: one phase of equal steps.
          evaluations: the EvaluationPlan of this process, or None where it runs no
            evaluations or they are not known (then the time outside training so far
            is expected to keep its share of the wall time).
          report: callable(ProgressEstimate) told of each point the hooks report;
            default: log its progress_line to TensorFlow's logger.
          cpu_clock: callable returning the CPU seconds this process has used (all its
            threads), read with clock at each point.
        """
        self._last_step = last_step
        self._examples_per_global_step = examples_per_global_step
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cpu_of_global_step = None
        self._phases = tuple(phases or (TrainingPhase(last_step),))
        self._evaluations = evaluations
        self._report = report or _log_progress_line
        self._global_step = None
        self._time_of_global_step = None
        self._paused_since = None
        self._training_secs = 0.0
        self._outside_secs = 0.0
        self._windows = [_RateWindow(window_secs, PHASE_SETTLING_SECS) for _ in self._phases]
        self._evaluation_secs = 0.0
        self._evaluation_views = 0
        self._num_evaluations = 0
        self._last_evaluation_start = None
        self._last_evaluation_secs = None
        self._training_start = None

    @property
    def global_step(self):
        """The newest global step seen, or None before the first record."""
        return self._global_step

    @property
    def clock(self):
        """The callable the progress reads the time from."""
        return self._clock

    @property
    def running(self):
        """Whether training is under way: a point was recorded and no pause came after it."""
        return self._time_of_global_step is not None and self._paused_since is None

    def record(self, global_step):
        """Note that training is at global_step now; the first point after a pause resumes it."""
        now, now_cpu = self._clock(), self._cpu_clock()
        if self._global_step is not None:
            # The global step never goes back; a hook's fetch in the same run as the
            # update may read it one step before the value a checkpoint listener saw.
            global_step = max(global_step, self._global_step)
        if self._paused_since is not None:
            self._outside_secs += now - self._paused_since
            self._paused_since = None
        elif self._time_of_global_step is not None:
            self._add_training(now - self._time_of_global_step, global_step - self._global_step,
                               now_cpu - self._cpu_of_global_step)
        else:
            self._training_start = now
        self._global_step, self._time_of_global_step = global_step, now
        self._cpu_of_global_step = now_cpu

    def pause(self, global_step):
        """Note that training stops at global_step until the next record (an evaluation may
        run, or the session ends). Does nothing unless training is running."""
        if not self.running:
            return
        self.record(global_step)
        self._paused_since = self._time_of_global_step

    def step_secs(self, min_secs=MIN_RECORDED_SECS):
        """{image side: seconds a global step took} of each phase that trained at least
        min_secs after its settling seconds (all of them, not only the window's), for
        machine.step_speeds to keep for the next run; {} (and a log line saying why)
        where the phases' CPU shares say the machine's load changed between them
        (MAX_CPU_SHARE_SPREAD)."""
        measured, cpu_shares = {}, {}
        for phase, window in zip(self._phases, self._windows):
            secs, steps, cpu_secs = window.trained()
            if phase.side and secs >= min_secs and steps:
                measured[phase.side] = secs / steps
                cpu_shares[phase.side] = cpu_secs / secs
        if len(cpu_shares) > 1 and max(cpu_shares.values()) > (
                MAX_CPU_SHARE_SPREAD * max(min(cpu_shares.values()), 1e-9)):
            logging.getLogger("tensorflow").info(
                "This run's step times are not kept for the next run's time to go: the "
                "load of the machine changed during the run (CPU seconds a second: %s)",
                ", ".join("%.2f at %d pixels" % (share, side)
                          for side, share in sorted(cpu_shares.items())))
            return {}
        return measured

    @property
    def last_evaluation_secs(self):
        """How long the newest timed evaluation took, or None before one."""
        return self._last_evaluation_secs

    def add_evaluation(self, start, secs, views):
        """Note an evaluation that started at `start` (the clock's) and took secs for
        `views` forward passes of an image (run.progress.EvaluationTimer)."""
        self._last_evaluation_secs = secs
        self._evaluation_secs += secs
        self._evaluation_views += views
        self._num_evaluations += 1
        self._last_evaluation_start = start

    def report(self):
        """Hand the estimate as of the newest point to the progress's report."""
        self._report(self.estimate())

    def estimate(self):
        """Returns: the ProgressEstimate as of the newest point (call after the first record)."""
        phase_rates = self._phase_rates()
        if phase_rates is None:
            return ProgressEstimate(self._global_step, self._last_step)
        training_to_go = sum(
            steps / rate for steps, rate in zip(self._steps_to_go_per_phase(), phase_rates))
        # Time outside training that no timed evaluation explains (session starts,
        # untimed evaluations) keeps its share.
        unexplained_secs = max(0.0, self._outside_secs - self._evaluation_secs)
        training_to_go *= (self._training_secs + unexplained_secs) / self._training_secs
        current = self._phase_of(self._global_step)
        return ProgressEstimate(
            self._global_step, self._last_step,
            examples_per_sec=phase_rates[current] * self._examples_per_global_step,
            seconds_to_go=training_to_go + self._evaluations_to_go_secs(training_to_go,
                                                                        phase_rates[-1]))

    def _phase_rates(self):
        """Global steps/sec of each phase, or None before there is a rate.

        A phase that has trained past its settling seconds is rated from its own window
        and from what the phase before it predicts (PREDICTION_WEIGHT_SECS); the others
        from the prediction alone: the rate of the phase before them (for phases before
        the first one measured, after them) scaled by the relative cost of their steps.
        Before any phase has trained past its settling seconds, their seconds rate it.
        """
        measured = [window.measured() for window in self._windows]
        if not any(measured):
            measured = [window.settling() for window in self._windows]
        known = [index for index, secs_and_steps in enumerate(measured) if secs_and_steps]
        if not known:
            return None
        rates = [None] * len(self._phases)
        first = known[0]
        for index in [first] + list(range(first + 1, len(rates))) + list(
                range(first - 1, -1, -1)):
            source = index - 1 if index > first else index + 1
            predicted = None
            if index != first:
                predicted = (rates[source] * self._phases[source].relative_cost
                             / self._phases[index].relative_cost)
            rates[index] = _pooled_rate(measured[index], predicted)
        return rates

    def _steps_to_go_per_phase(self):
        steps, start = [], 0
        for phase in self._phases:
            steps.append(max(0, phase.end_step - max(start, self._global_step)))
            start = phase.end_step
        return steps

    def _phase_of(self, global_step):
        for index, phase in enumerate(self._phases):
            if global_step < phase.end_step:
                return index
        return len(self._phases) - 1

    def _evaluations_to_go_secs(self, training_to_go, full_size_steps_per_sec):
        plan = self._evaluations
        if plan is None:
            return 0.0
        if self._evaluation_views:
            secs_per_view = self._evaluation_secs_per_view()
        else:
            secs_per_view = plan.relative_cost / (
                full_size_steps_per_sec * self._examples_per_global_step
                * FORWARD_PASSES_PER_TRAINING_EXAMPLE)
        evaluation_secs = (plan.views_per_evaluation * secs_per_view + EVALUATION_SET_UP_SECS
                           + plan.exports_per_evaluation * EXPORT_SECS)
        cycle_secs = _evaluation_cycle_secs(plan, evaluation_secs, full_size_steps_per_sec)
        since = next((time for time in (self._last_evaluation_start, self._training_start)
                      if time is not None), self._clock())
        # One evaluation at most is overdue: a run stopped for longer than a cycle
        # evaluates once when it goes on, not once for each cycle it stood still.
        overdue_secs = min(self._clock() - since, cycle_secs)
        # The next evaluation comes after cycle - overdue more seconds of training, each
        # one after it after the cycle's time outside its evaluation.
        between_secs = max(cycle_secs - evaluation_secs, 1.0)
        during_training = max(0, int(
            (training_to_go + overdue_secs - evaluation_secs) // between_secs))
        final_secs = (plan.final_views * secs_per_view
                      + plan.num_final_evaluations * EVALUATION_SET_UP_SECS
                      + plan.exports_per_evaluation * EXPORT_SECS)
        return during_training * evaluation_secs + final_secs

    def _evaluation_secs_per_view(self):
        # Each timed evaluation's set-up is taken out, as the plan adds it per evaluation.
        forward_secs = self._evaluation_secs - self._num_evaluations * EVALUATION_SET_UP_SECS
        return max(forward_secs, 0.5 * self._evaluation_secs) / self._evaluation_views

    def _add_training(self, secs, global_steps, cpu_secs):
        # An interval belongs to the phase its first step trains in.
        phase = self._phase_of(self._global_step)
        rates = self._phase_rates()
        if rates and global_steps and secs * rates[phase] > PAUSE_FACTOR * global_steps:
            return
        self._training_secs += secs
        self._windows[phase].add(secs, global_steps, cpu_secs)


def _evaluation_cycle_secs(plan, evaluation_secs, full_size_steps_per_sec):
    """Wall seconds from the start of one evaluation during training to the next's.

    An evaluation starts after the first checkpoint written at least plan.every_secs
    after the last one started. Checkpoints by time come every checkpoint_every_secs of
    wall time from the last save, the evaluation after it included (the saver's timer
    runs on through it); checkpoints by steps come after that many steps of training.
    """
    if plan.checkpoint_every_secs:
        checkpoints = math.ceil(plan.every_secs / plan.checkpoint_every_secs)
        return checkpoints * plan.checkpoint_every_secs
    if plan.checkpoint_every_steps:
        return max(plan.every_secs,
                   plan.checkpoint_every_steps / full_size_steps_per_sec + evaluation_secs)
    return plan.every_secs + evaluation_secs


def _pooled_rate(measured, predicted):
    """Steps/sec of a phase from its measured (seconds trained, steps/sec), or None, and
    the rate predicted for it, or None, which counts as PREDICTION_WEIGHT_SECS of its
    training."""
    if predicted is None:
        return measured[1]
    if measured is None:
        return predicted
    trained_secs, rate = measured
    return ((trained_secs * rate + PREDICTION_WEIGHT_SECS * predicted)
            / (trained_secs + PREDICTION_WEIGHT_SECS))


class _RateWindow:
    """Global steps and seconds of a phase's newest training intervals spanning
    window_secs, after its first settling_secs (kept apart, for until there are more)."""

    def __init__(self, window_secs, settling_secs=0.0):
        self._window_secs = window_secs
        self._settling_secs = settling_secs
        self._intervals = collections.deque()
        self._secs = 0.0
        self._steps = 0
        self._settling = [0.0, 0]  # secs and global steps of the first settling_secs
        self._total_secs = 0.0
        self._total_steps = 0
        self._cpu_secs = 0.0  # CPU seconds of the intervals after the settling seconds

    def add(self, secs, global_steps, cpu_secs):
        settling = self._total_secs < self._settling_secs
        self._total_secs += secs
        self._total_steps += global_steps
        if settling:
            self._settling[0] += secs
            self._settling[1] += global_steps
            return
        self._cpu_secs += cpu_secs
        self._intervals.append((secs, global_steps))
        self._secs += secs
        self._steps += global_steps
        while self._secs - self._intervals[0][0] >= self._window_secs:
            oldest_secs, oldest_steps = self._intervals.popleft()
            self._secs -= oldest_secs
            self._steps -= oldest_steps

    def measured(self):
        """(seconds trained after the settling seconds, steps/sec over the window), or None
        before a step there."""
        if self._secs > 0 and self._steps > 0:
            return self._total_secs - self._settling[0], self._steps / self._secs
        return None

    def trained(self):
        """(seconds, global steps, the process's CPU seconds) of all the phase's training
        after its settling seconds."""
        return (self._total_secs - self._settling[0], self._total_steps - self._settling[1],
                self._cpu_secs)

    def settling(self):
        """(seconds, steps/sec) of the settling seconds, or None before a step in them."""
        secs, steps = self._settling
        return (secs, steps / secs) if secs > 0 and steps > 0 else None


def console_report(run_console):
    """A RunProgress report that shows each estimate on a run.console.RunConsole."""
    def report(estimate):
        run_console.show_progress(progress_line(estimate),
                                  estimate.global_step / estimate.last_step)
    return report


def _log_progress_line(estimate):
    # TensorFlow's logger is Python's "tensorflow" logger: no need to load TensorFlow.
    logging.getLogger("tensorflow").info(progress_line(estimate))


def duration_text(secs):
    """A duration as a person would say it: 'about 45 s', 'about 4 min 30 s', 'about 21 min',
    'about 1 h 35 min'. Under ten minutes to the nearest 10 s, so that the last minutes
    are not rounded by a third."""
    return "about " + measured_duration_text(secs)


def measured_duration_text(secs):
    """duration_text without its 'about', for a duration measured."""
    if round(secs) < 90:
        return "%d s" % round(secs)
    if secs < 595:
        minutes, tens = divmod(int(secs / 10 + 0.5), 6)
        return "%d min %d0 s" % (minutes, tens) if tens else "%d min" % minutes
    minutes = round(secs / 60)
    if minutes < 60:
        return "%d min" % minutes
    hours, minutes = divmod(minutes, 60)
    return "%d h %d min" % (hours, minutes) if minutes else "%d h" % hours


def duration_secs(text):
    """The seconds of a duration_text or measured_duration_text ('about 4 min 30 s': 270)."""
    words = text.split()
    if words and words[0] == "about":
        words = words[1:]
    units = {"h": 3600, "min": 60, "s": 1}
    if len(words) % 2 or not all(unit in units for unit in words[1::2]):
        raise ValueError("not a duration: %r" % text)
    return sum(int(number) * units[unit] for number, unit in zip(words[::2], words[1::2]))


def progress_line(estimate):
    """The log line of a ProgressEstimate.

    E.g. 'step 4200/10530 (40 %), 489 examples/sec, about 21 min to go', or
    'step 30/10530 (0 %), time to go not known yet' before there is a rate.
    """
    where = "step %d/%d (%d %%)" % (estimate.global_step, estimate.last_step,
                                    round(100 * estimate.global_step / estimate.last_step))
    if estimate.seconds_to_go is None:
        return where + ", time to go not known yet"
    return "%s, %.0f examples/sec, %s to go" % (where, estimate.examples_per_sec,
                                                 duration_text(estimate.seconds_to_go))
