"""The run's progress: where training is, its rate, and when it ends, as one line.

RunProgress keeps the global steps and wall time of the whole run; ProgressHook records
a point every N global steps and reports progress_line, ProgressCheckpointListener pauses
the clock at each checkpoint, since an evaluation may follow, and EvaluationTimer times
the evaluations. The time to go knows the run's plan: its training phases (steps on
smaller images cost less; `training_phases`) and the evaluations still to come, during
training and after the last step (`EvaluationPlan`). Each phase is rated from its own
steps once it has run a while, and until then from the phase before it, scaled by the
relative cost of their steps; an evaluation is timed from the evaluations measured so
far, and until there is one from the training rate (FORWARD_PASSES_PER_TRAINING_EXAMPLE).
"""

import collections
import dataclasses
import time

import tensorflow as tf

from cifar10_estimator import cifar10_utils
from cifar10_estimator.training import console
from cifar10_estimator.training import schedule

# The rate behind the time to go comes from about this much recent training: long enough
# to smooth over a checkpoint or a slow batch, short enough to follow a change of speed.
PROGRESS_WINDOW_SECS = 300
# A phase's first seconds of training are slower (the start of training, and after a
# change of image size the set-up of kernels and memory for it): they rate the phase only
# until it has trained longer, and the phase before it rates it meanwhile.
PHASE_SETTLING_SECS = 20
# A training example costs about five evaluated views of an image: the backward pass
# costs about twice the forward one, and evaluations run larger batches without the
# optimizer. The cost of a view before an evaluation was timed (docs/training.md).
FORWARD_PASSES_PER_TRAINING_EXAMPLE = 5.0
# The share of a full-size training step's time that does not shrink with the images: the
# session's and hooks' work per step, the optimizer's update, the input pipeline's. With
# it a step on 24-pixel images costs 0.67 of a 32-pixel one, where the pixels alone would
# say 0.56; the manual gives the quick recipe's measured steps (docs/training.md).
FIXED_STEP_SHARE = 0.25
# Each evaluation's graph build and restore, and each export, beyond its forward passes.
EVALUATION_SET_UP_SECS = 2.0
EXPORT_SECS = 1.0
# TensorBoard's tag of the run's rate (the recent rate of the time to go).
EXAMPLES_PER_SEC_TAG = "examples/sec"


@dataclasses.dataclass(frozen=True)
class TrainingPhase:
    """A stretch of training with steps of one cost.

    Attributes:
      end_step: the global step at which the phase ends.
      relative_cost: the cost of one of its steps against a step on full-size images.
    """

    end_step: int
    relative_cost: float = 1.0


def training_phases(hparams, full_size):
    """The TrainingPhases of a run: those of schedule.resolution_phases (the
    --lower-resolution and --low-resolution epochs), then full-size images.

    A step's cost is FIXED_STEP_SHARE of a full-size step's, plus the rest in proportion
    to the images' pixels.
    """
    last_step = schedule.last_step(hparams)
    phases = []
    for side, end in schedule.resolution_phases(hparams):
        end = min(end, last_step)
        if end > (phases[-1].end_step if phases else 0):
            pixels = (side / full_size) ** 2
            phases.append(TrainingPhase(end, FIXED_STEP_SHARE + (1 - FIXED_STEP_SHARE) * pixels))
    if not phases or phases[-1].end_step < last_step:
        phases.append(TrainingPhase(last_step))
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
      examples_per_sec: over the recent window, or None before there is a rate.
      seconds_to_go: wall time to last_step, evaluations included, or None when unknown.
    """

    global_step: int
    last_step: int
    examples_per_sec: float = None
    seconds_to_go: float = None


class RunProgress:
    """The global steps and wall time of a whole training run, and the time it has to go.

    Create one per training process and hand it to every ProgressHook and
    ProgressCheckpointListener: a hook lives for one training session, while the
    recent rate and the time spent in evaluations span the run.

    Time is either training (between two points of one stretch of training) or
    outside it (from a pause to the point that resumes training: evaluations, and
    the start-up of a new session). Only training time gives the rate; the time to
    go is the remaining global steps at that rate, stretched by the run's ratio of
    wall time to training time, so evaluations are expected to keep taking their
    share. The start-up before the first point is counted as neither: it happens
    once and must not be extrapolated.
    """

    def __init__(self, last_step, examples_per_global_step, window_secs=PROGRESS_WINDOW_SECS,
                 clock=time.monotonic, phases=None, evaluations=None, report=None):
        """Args:
          last_step: the global step at which training stops.
          examples_per_global_step: examples behind one global step (the global batch
            with --sync, one worker's batch without).
          window_secs: the rate comes from the newest training intervals spanning at
            least this many seconds of training.
          clock: callable returning seconds; differences of its values are durations.
          phases: the run's TrainingPhases in order; None: one phase of equal steps.
          evaluations: the EvaluationPlan of this process, or None where it runs no
            evaluations or they are not known (then the time outside training so far
            is expected to keep its share of the wall time).
          report: callable(ProgressEstimate) told of each point the hooks report;
            default: log its progress_line.
        """
        self._last_step = last_step
        self._examples_per_global_step = examples_per_global_step
        self._clock = clock
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
        now = self._clock()
        if self._global_step is not None:
            # The global step never goes back; a hook's fetch in the same run as the
            # update may read it one step before the value a checkpoint listener saw.
            global_step = max(global_step, self._global_step)
        if self._paused_since is not None:
            self._outside_secs += now - self._paused_since
            self._paused_since = None
        elif self._time_of_global_step is not None:
            self._add_training(now - self._time_of_global_step, global_step - self._global_step)
        else:
            self._training_start = now
        self._global_step, self._time_of_global_step = global_step, now

    def pause(self, global_step):
        """Note that training stops at global_step until the next record (an evaluation may
        run, or the session ends). Does nothing unless training is running."""
        if not self.running:
            return
        self.record(global_step)
        self._paused_since = self._time_of_global_step

    @property
    def last_evaluation_secs(self):
        """How long the newest timed evaluation took, or None before one."""
        return self._last_evaluation_secs

    def add_evaluation(self, start, secs, views):
        """Note an evaluation that started at `start` (the clock's) and took secs for
        `views` forward passes of an image (EvaluationTimer)."""
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
        current = min(self._phase_of(self._global_step), len(phase_rates) - 1)
        return ProgressEstimate(
            self._global_step, self._last_step,
            examples_per_sec=phase_rates[current] * self._examples_per_global_step,
            seconds_to_go=training_to_go + self._evaluations_to_go_secs(training_to_go,
                                                                        phase_rates[-1]))

    def _phase_rates(self):
        """Global steps/sec of each phase: measured where it has trained long enough
        (or where no phase has), else scaled from the nearest measured phase before it
        (after it, for phases before the first measured one). None: no rate yet."""
        any_settled = any(window.settled for window in self._windows)
        settled = [window.steps_per_sec() if window.settled or not any_settled else None
                   for window in self._windows]
        known = [index for index, rate in enumerate(settled) if rate]
        if not known:
            return None
        rates = []
        for index, phase in enumerate(self._phases):
            if settled[index]:
                rates.append(settled[index])
                continue
            earlier = [known_index for known_index in known if known_index < index]
            source = earlier[-1] if earlier else known[0]
            rates.append(settled[source] * self._phases[source].relative_cost
                         / phase.relative_cost)
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
        period = plan.every_secs
        if plan.checkpoint_every_secs:
            period = max(period, plan.checkpoint_every_secs)
        if plan.checkpoint_every_steps:
            period = max(period, plan.checkpoint_every_steps / full_size_steps_per_sec)
        since = self._last_evaluation_start or self._training_start or self._clock()
        during_training = int((self._clock() - since + training_to_go) // (period + evaluation_secs))
        final_secs = (plan.final_views * secs_per_view
                      + plan.num_final_evaluations * EVALUATION_SET_UP_SECS
                      + plan.exports_per_evaluation * EXPORT_SECS)
        return during_training * evaluation_secs + final_secs

    def _evaluation_secs_per_view(self):
        # Each timed evaluation's set-up is taken out, as the plan adds it per evaluation.
        forward_secs = self._evaluation_secs - self._num_evaluations * EVALUATION_SET_UP_SECS
        return max(forward_secs, 0.5 * self._evaluation_secs) / self._evaluation_views

    def _add_training(self, secs, global_steps):
        self._training_secs += secs
        # An interval belongs to the phase its first step trains in.
        self._windows[self._phase_of(self._global_step)].add(secs, global_steps)


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

    @property
    def settled(self):
        """Whether intervals after the first settling_secs rate the phase."""
        return bool(self._intervals) and self._steps > 0

    def add(self, secs, global_steps):
        settling = self._total_secs < self._settling_secs
        self._total_secs += secs
        if settling:
            self._settling[0] += secs
            self._settling[1] += global_steps
            return
        self._intervals.append((secs, global_steps))
        self._secs += secs
        self._steps += global_steps
        while self._secs - self._intervals[0][0] >= self._window_secs:
            oldest_secs, oldest_steps = self._intervals.popleft()
            self._secs -= oldest_secs
            self._steps -= oldest_steps

    def steps_per_sec(self):
        """Global steps/sec over the window, or over the settling seconds while there is
        nothing after them; None before a step in a timed interval."""
        secs, steps = (self._secs, self._steps) if self.settled else self._settling
        if secs > 0 and steps > 0:
            return steps / secs
        return None


def console_report(run_console):
    """A RunProgress report that shows each estimate on a training.console.RunConsole."""
    def report(estimate):
        run_console.show_progress(progress_line(estimate),
                                  estimate.global_step / estimate.last_step)
    return report


def _log_progress_line(estimate):
    tf.compat.v1.logging.info(progress_line(estimate))


def duration_text(secs):
    """A duration as a person would say it: 'about 45 s', 'about 4 min 30 s', 'about 21 min',
    'about 1 h 35 min'. Under ten minutes to the nearest 10 s, so that the last minutes
    are not rounded by a third."""
    return "about " + _duration(secs)


def _duration(secs):
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


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Logs where the run is and when it ends every N global steps and when its session ends.

    The line (see progress_line) is the run's, from the global step: in a cluster
    every worker logs the cluster's progress and rate, and the time until the global
    step reaches the last step, whichever workers make the steps. (Each worker's own
    rate is ExamplesPerSecondHook's line.) Per step the hook only fetches the global
    step and compares it; it records a point for RunProgress at each line, and at the
    first step of a session or after an evaluation, which resumes the clock.
    """

    def __init__(self, progress, every_n_steps=100, summary_dir=None,
                 summary_every_n_steps=100):
        """Args:
          progress: the run's RunProgress, shared by every session of the process.
          every_n_steps: report when the global step reaches a multiple of this.
          summary_dir: where the run's rate goes as TensorBoard's `examples/sec` curve
            (the chief's model dir), or None.
          summary_every_n_steps: write the curve's point when the global step reaches a
            multiple of this.
        """
        self._progress = progress
        self._every_n_steps = every_n_steps
        self._summary_writer = (tf.compat.v1.summary.FileWriterCache.get(summary_dir)
                                if summary_dir else None)
        self._summary_every_n_steps = summary_every_n_steps
        self._next_summary_step = 0
        self._global_step = None
        self._next_log_step = 0  # the session's first step records a point
        self._newest_global_step = None
        self._logged_global_step = None

    def begin(self):
        self._global_step = cifar10_utils.global_step_of_graph(self)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        global_step = self._newest_global_step = run_values.results
        if global_step < self._next_log_step and self._progress.running:
            return
        # Not running: the session's first step, or the first after an evaluation,
        # whose point resumes the clock and has no new line to tell.
        resuming = not self._progress.running
        self._progress.record(global_step)
        if not resuming:
            self._log_progress()
        self._write_summary()
        # In a cluster the global step also moves by other workers' steps, so it
        # passes the multiples rather than hitting each one.
        self._next_log_step = ((self._progress.global_step // self._every_n_steps + 1)
                               * self._every_n_steps)

    def end(self, session):
        if self._newest_global_step is None or not self._progress.running:
            return  # no step was run, or the final checkpoint's listener paused and logged
        # The newest global step seen, not a fetch: in a cluster the parameter servers
        # may already be gone when a worker's session ends.
        self._progress.pause(self._newest_global_step)
        if self._progress.global_step != self._logged_global_step:
            self._log_progress()

    def _log_progress(self):
        self._progress.report()
        self._logged_global_step = self._progress.global_step

    def _write_summary(self):
        global_step = self._progress.global_step
        if self._summary_writer is None or global_step < self._next_summary_step:
            return
        examples_per_sec = self._progress.estimate().examples_per_sec
        if examples_per_sec is None:
            return
        self._summary_writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=EXAMPLES_PER_SEC_TAG,
                                       simple_value=examples_per_sec)]), global_step)
        self._next_summary_step = ((global_step // self._summary_every_n_steps + 1)
                                   * self._summary_every_n_steps)


class ProgressCheckpointListener(tf.compat.v1.train.CheckpointSaverListener):
    """Pauses the run's progress at each checkpoint and logs its line: an evaluation may follow.

    tf.estimator.train_and_evaluate on one machine evaluates inside the training
    session, from its own listener right after this one (TrainSpec.saving_listeners
    come first); the next ProgressHook step resumes the clock, so the evaluation
    counts as time outside training instead of slowing the rate.
    """

    def __init__(self, progress):
        """Args:
          progress: the run's RunProgress.
        """
        self._progress = progress

    def after_save(self, session, global_step_value):
        self._pause_and_log(global_step_value)

    def end(self, session, global_step_value):
        self._pause_and_log(global_step_value)

    def _pause_and_log(self, global_step):
        # Not running: the first checkpoint, written before any step, or the final one
        # seen twice (its save and the end of saving).
        if self._progress.running:
            self._progress.pause(global_step)
            self._progress.report()


class EvaluationTimer(tf.compat.v1.train.SessionRunHook):
    """Times each evaluation for the run's RunProgress: from its graph's end to its end."""

    def __init__(self, progress, views_per_batch):
        """Args:
          progress: the run's RunProgress.
          views_per_batch: forward passes of an image in one evaluation step (the batch
            times the views of each image).
        """
        self._progress = progress
        self._views_per_batch = views_per_batch
        self._start = None
        self._steps = 0

    def begin(self):
        self._start = self._progress.clock()
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1

    def end(self, session):
        self._progress.add_evaluation(self._start, self._progress.clock() - self._start,
                                      self._steps * self._views_per_batch)


class EvaluationLineExporter(tf.estimator.Exporter):
    """Logs each evaluation in one line for the console; exports nothing.

    An exporter is what tf.estimator hands every evaluation's results to, during
    training and for the final checkpoint, on one machine and on an evaluator task.
    """

    def __init__(self, evaluated, progress=None):
        """Args:
          evaluated: what the evaluation reads, e.g. 'validation set'.
          progress: the run's RunProgress, whose EvaluationTimer timed the evaluation.
        """
        self._evaluated = evaluated
        self._progress = progress

    @property
    def name(self):
        return "evaluation_line"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        took = ""
        if self._progress is not None and self._progress.last_evaluation_secs is not None:
            took = ", %s" % _duration(self._progress.last_evaluation_secs)
        console.console_logger().info(
            "evaluation of step %d on the %s: accuracy %.2f %%, loss %.4f%s",
            eval_result["global_step"], self._evaluated, 100 * eval_result["accuracy"],
            eval_result["loss"], took)
        return None
