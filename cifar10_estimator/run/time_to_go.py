"""The run's time to go: where training is, its rate, and when it ends, as one line.

The time to go is the steps left in each image-size phase at the seconds its steps take,
the time outside training (evaluations, checkpoints) in its share so far, and the final
evaluations at the seconds a view of an image takes. Each figure is measured as the run
goes; one not measured yet is scaled from one that is by their Costs (what this
machine's newest run measured, machine.step_speeds; else the pixels). No TensorFlow.
"""

import bisect
import collections
import logging
import math
import time

from cifar10_estimator.data import cifar10_facts

# A phase's rate is that of the newer half of its training (the older holds its slow
# first steps), at most this many seconds: to follow a change of speed.
WINDOW_SECS = 120
# No time to go rests on a rate from less training: it would move with one slow batch.
MIN_RATE_SECS = 10
# An interval this many times longer than the rate says is a pause (SIGSTOP, a suspended
# laptop), not training: it would rule the rate for minutes.
PAUSE_FACTOR = 10
# A training example's FLOPs are its forward pass and the two gradients of each layer
# (cifar10_model.training_flops_per_example): a view's forward pass is a third.
VIEW_SHARE_OF_TRAINING_EXAMPLE = 1 / 3


# Seconds of a training example at each image side ({side: secs}) and of an evaluated
# view, all in (its share of each evaluation's set-up and exports), or None.
Costs = collections.namedtuple("Costs", "example_secs view_secs", defaults=(None,))
# The evaluations of a process besides training: the views of an image one during
# training takes, the wall seconds from the start of one to the next's (None: none), the
# views of those after the last step, and a view's cost against one in the training's
# precision until one is timed (float32 after bf16 training costs more).
EvaluationPlan = collections.namedtuple(
    "EvaluationPlan", "views_each every_secs final_views view_cost", defaults=(0, None, 0, 1.0))
# Where a run is: the rate of the phase training now and the wall time to the run's end,
# each None until known; is_bound: that time is a bound from above, not an estimate.
ProgressEstimate = collections.namedtuple(
    "ProgressEstimate", "global_step last_step examples_per_sec seconds_to_go is_bound",
    defaults=(None, None, False))


class RunProgress:
    """The global steps and wall time of a training run, and the time it has to go.

    One per training process, fed by the hooks of run.progress. Time is training
    (between two points of one stretch of training) or outside it (from a pause to the
    point that resumes training); the start-up before the first point is neither, nor is
    an interval PAUSE_FACTOR calls a pause. The compute report's rate is its training's
    (training_secs, timed_steps_per_phase).
    """

    def __init__(self, last_step, examples_per_global_step, phases=None, costs=None,
                 evaluations=EvaluationPlan(), report=None, clock=time.monotonic):
        """Args:
          last_step: the global step at which training stops.
          examples_per_global_step: examples behind one global step.
          phases: [(image side, end step)] of the run in order
            (training.compute.image_size_phases); None: full-size images throughout.
          costs: the Costs this machine measured before, or None.
          evaluations: the EvaluationPlan of this process.
          report: callable(line, fraction of the steps done) showing each estimate, as
            run.console.RunConsole.show_progress does; default: logs the line.
          clock: callable returning seconds; differences of its values are durations.
        """
        self._last_step = last_step
        self._examples_per_global_step = examples_per_global_step
        self._phases = tuple(phases or ((cifar10_facts.HEIGHT, last_step),))
        self._timings = [[(0.0, 0)] for _ in self._phases]  # (secs, steps) trained so far
        self._costs = costs or Costs({})
        self._evaluations = evaluations
        self._report = report or (lambda line, _: logging.getLogger("tensorflow").info(line))
        self.clock = clock
        self.global_step = self._time_of_global_step = self._paused_since = None
        self._cycle_start = None  # the newest evaluation's pause, or the first point
        self.last_evaluation_secs = None  # how long the newest timed evaluation took
        self.training_secs = self._outside_secs = self._evaluation_secs = 0.0
        self._evaluation_views = self._views_in_pause = 0

    @property
    def timed_steps_per_phase(self):
        """The global steps timed as training in each phase."""
        return [timing[-1][1] for timing in self._timings]

    @property
    def running(self):
        """Whether training is under way: a point was recorded and no pause came after it."""
        return self._time_of_global_step is not None and self._paused_since is None

    def record(self, global_step):
        """Note that training is at global_step now; the first point after a pause resumes it."""
        now, global_step = self.clock(), int(global_step)
        if self.global_step is not None:
            # The global step never goes back; a hook's fetch in the same run as the
            # update may read it one step before the value a checkpoint listener saw.
            global_step = max(global_step, self.global_step)
        if self._paused_since is not None:
            self._end_pause(now)
        elif self._time_of_global_step is not None:
            self._add_training(now - self._time_of_global_step, global_step)
        else:
            self._cycle_start = now
        self.global_step, self._time_of_global_step = global_step, now

    def pause(self, global_step):
        """Note that training stops at global_step until the next record; nothing unless
        training is running."""
        if self.running:
            self.record(global_step)
            self._paused_since = self._time_of_global_step

    def add_evaluation(self, secs, views):
        """Note an evaluation of `views` views that took secs in the pause under way."""
        self.last_evaluation_secs = secs
        self._views_in_pause += views

    def finish(self):
        """Note that the run ends now, after its final evaluations; returns the Costs it
        measured, or None."""
        if self._paused_since is not None:
            now = self.clock()
            self._end_pause(now)
            self._paused_since = now
        rated = {side: _secs_per_step(timing, MIN_RATE_SECS)
                 for (side, _), timing in zip(self._phases, self._timings)}
        if not any(rated.values()):
            return None
        views = self._evaluation_views
        return Costs({side: secs / self._examples_per_global_step
                      for side, secs in rated.items() if secs},
                     self._evaluation_secs / views if views else None)

    def report(self):
        """Show the estimate as of the newest point: its progress_line."""
        estimate = self.estimate()
        self._report(progress_line(estimate), estimate.global_step / estimate.last_step)

    def estimate(self):
        """The ProgressEstimate as of the newest point: no time to go before a phase has a
        rate from MIN_RATE_SECS of training, unless training is done."""
        current = self._phase_of(self.global_step)
        rates = self._rates(0 if self.global_step >= self._last_step else MIN_RATE_SECS)
        if rates is None:
            secs = _secs_per_step(self._timings[current], 0)
            return ProgressEstimate(self.global_step, self._last_step,
                                    secs and self._examples_per_global_step / secs)
        secs_per_step, secs_per_cost = rates
        # With no costs kept, phases to come on larger images are rated by their pixels:
        # a step's work that does not grow with the images makes that a bound from above.
        to_come = [side for side, _ in self._phases[current + 1:]]
        is_bound = bool(not self._costs.example_secs and to_come
                        and min(to_come) > self._phases[current][0])
        training_to_go, start = 0.0, 0
        for (_, end), secs in zip(self._phases, secs_per_step):
            training_to_go += max(0, end - max(start, self.global_step)) * secs
            start = end
        # The time outside training that no evaluation explains keeps its share.
        training_to_go *= (self.training_secs + self._outside_secs) / self.training_secs
        if self._evaluation_views:
            view_secs = self._evaluation_secs / self._evaluation_views
        elif self._costs.view_secs:
            view_secs = self._costs.view_secs * secs_per_cost
        else:
            view_secs = (secs_per_step[-1] / self._examples_per_global_step
                         * VIEW_SHARE_OF_TRAINING_EXAMPLE * self._evaluations.view_cost)
        views_each, every_secs, final_views, _ = self._evaluations
        if every_secs:
            # Evaluations start every_secs of wall time apart, their own time included;
            # one at most is overdue (a run that stood still evaluates once).
            evaluation_secs = views_each * view_secs
            since = min(self.clock() - self._cycle_start, every_secs)
            between_secs = max(every_secs - evaluation_secs, 1.0)
            training_to_go += evaluation_secs * max(0, int(
                (training_to_go + since - evaluation_secs) // between_secs))
        return ProgressEstimate(self.global_step, self._last_step,
                                self._examples_per_global_step / secs_per_step[current],
                                training_to_go + final_views * view_secs, is_bound)

    def _rates(self, min_secs):
        """([seconds of a global step in each phase], seconds of a unit of Costs): a phase's
        own rate after min_secs of training, else the newest such one's scaled by their
        costs; None before there is one."""
        own = [_secs_per_step(timing, min_secs) for timing in self._timings]
        rated = [index for index, secs in enumerate(own) if secs]
        if not rated:
            return None
        secs_per_cost = own[rated[-1]] / self._step_cost(rated[-1])
        return [secs or secs_per_cost * self._step_cost(index)
                for index, secs in enumerate(own)], secs_per_cost

    def _step_cost(self, phase):
        # As kept, or scaled by the pixels from the nearest side kept, or the pixels.
        side, kept = self._phases[phase][0], self._costs.example_secs
        nearest = min(kept, key=lambda known: abs(known - side), default=None)
        cost = (kept[nearest] * (side / nearest) ** 2 if nearest is not None
                else float(side * side))
        return cost * self._examples_per_global_step

    def _phase_of(self, global_step):
        return next((index for index, (_, end) in enumerate(self._phases)
                     if global_step < end), len(self._phases) - 1)

    def _add_training(self, secs, global_step):
        # An interval belongs to the phase its first step trains in.
        phase, steps = self._phase_of(self.global_step), global_step - self.global_step
        rates = self._rates(0)
        if rates and secs > PAUSE_FACTOR * max(steps, 1) * rates[0][phase]:
            return
        self.training_secs += secs
        trained_secs, trained_steps = self._timings[phase][-1]
        self._timings[phase].append((trained_secs + secs, trained_steps + steps))

    def _end_pause(self, now):
        if self._views_in_pause:
            self._cycle_start = self._paused_since
            self._evaluation_secs += now - self._paused_since
            self._evaluation_views += self._views_in_pause
            self._views_in_pause = 0
        else:
            self._outside_secs += now - self._paused_since
        self._paused_since = None


def _secs_per_step(timing, min_secs):
    """Seconds a global step took over the newer half of a phase's training (at most
    WINDOW_SECS), from its [(secs, steps) trained so far]; None before that spans min_secs."""
    secs, steps = timing[-1]
    window_start = secs - min(WINDOW_SECS, secs / 2)
    start = timing[bisect.bisect_right(timing, (window_start, math.inf)) - 1]
    secs, steps = secs - start[0], steps - start[1]
    return secs / steps if steps and secs > 0 and secs >= min_secs else None


def duration_text(secs):
    """A duration as a person says it: '45 s', '4 min 30 s', '21 min', '1 h 35 min'; under
    ten minutes to the nearest 10 s, so that the last minutes are not rounded by a third."""
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


def progress_line(estimate):
    """The line of a ProgressEstimate: 'step 4200/10530 (40 %), 489 examples/sec, about
    21 min to go' ('at most 21 min' where it is a bound), or 'step 30/10530 (0 %), time
    to go not known yet'."""
    where = "step %d/%d (%d %%)" % (estimate.global_step, estimate.last_step,
                                    round(100 * estimate.global_step / estimate.last_step))
    if estimate.seconds_to_go is None:
        return where + ", time to go not known yet"
    return "%s, %.0f examples/sec, %s %s to go" % (
        where, estimate.examples_per_sec, "at most" if estimate.is_bound else "about",
        duration_text(estimate.seconds_to_go))
