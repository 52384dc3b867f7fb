"""The run's progress: where training is, its rate, and when it ends, logged as one line.

RunProgress keeps the global steps and wall time of the whole run; ProgressHook records
a point every N global steps and logs progress_line, ProgressCheckpointListener pauses
the clock at each checkpoint, since an evaluation may follow.
"""

import collections
import dataclasses
import time

import tensorflow as tf

from cifar10_estimator import cifar10_utils

# The rate behind the time to go comes from about this much recent training: long enough
# to smooth over a checkpoint or a slow batch, short enough to follow a change of speed.
PROGRESS_WINDOW_SECS = 300


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
                 clock=time.monotonic):
        """Args:
          last_step: the global step at which training stops.
          examples_per_global_step: examples behind one global step (the global batch
            with --sync, one worker's batch without).
          window_secs: the rate comes from the newest training intervals spanning at
            least this many seconds of training.
          clock: callable returning seconds; differences of its values are durations.
        """
        self._last_step = last_step
        self._examples_per_global_step = examples_per_global_step
        self._window_secs = window_secs
        self._clock = clock
        self._global_step = None
        self._time_of_global_step = None
        self._paused_since = None
        self._training_secs = 0.0
        self._outside_secs = 0.0
        self._window = collections.deque()  # (secs, global steps) of recent training intervals
        self._window_secs_total = 0.0
        self._window_steps_total = 0

    @property
    def global_step(self):
        """The newest global step seen, or None before the first record."""
        return self._global_step

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
        self._global_step, self._time_of_global_step = global_step, now

    def pause(self, global_step):
        """Note that training stops at global_step until the next record (an evaluation may
        run, or the session ends). Does nothing unless training is running."""
        if not self.running:
            return
        self.record(global_step)
        self._paused_since = self._time_of_global_step

    def estimate(self):
        """Returns: the ProgressEstimate as of the newest point (call after the first record)."""
        if not (self._window_secs_total > 0 and self._window_steps_total > 0):
            return ProgressEstimate(self._global_step, self._last_step)
        global_steps_per_sec = self._window_steps_total / self._window_secs_total
        wall_secs_per_training_sec = ((self._training_secs + self._outside_secs)
                                      / self._training_secs)
        steps_to_go = max(0, self._last_step - self._global_step)
        return ProgressEstimate(
            self._global_step, self._last_step,
            examples_per_sec=global_steps_per_sec * self._examples_per_global_step,
            seconds_to_go=steps_to_go / global_steps_per_sec * wall_secs_per_training_sec)

    def _add_training(self, secs, global_steps):
        self._training_secs += secs
        self._window.append((secs, global_steps))
        self._window_secs_total += secs
        self._window_steps_total += global_steps
        while self._window_secs_total - self._window[0][0] >= self._window_secs:
            oldest_secs, oldest_steps = self._window.popleft()
            self._window_secs_total -= oldest_secs
            self._window_steps_total -= oldest_steps


def duration_text(secs):
    """A duration as a person would say it: 'about 45 s', 'about 21 min', 'about 1 h 35 min'."""
    if round(secs) < 90:
        return "about %d s" % round(secs)
    minutes = round(secs / 60)
    if minutes < 60:
        return "about %d min" % minutes
    hours, minutes = divmod(minutes, 60)
    return "about %d h %d min" % (hours, minutes) if minutes else "about %d h" % hours


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

    def __init__(self, progress, every_n_steps=100):
        """Args:
          progress: the run's RunProgress, shared by every session of the process.
          every_n_steps: log when the global step reaches a multiple of this.
        """
        self._progress = progress
        self._every_n_steps = every_n_steps
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
        tf.compat.v1.logging.info(progress_line(self._progress.estimate()))
        self._logged_global_step = self._progress.global_step


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
            tf.compat.v1.logging.info(progress_line(self._progress.estimate()))
