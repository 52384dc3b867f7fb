"""Stop signals: SIGTERM and Ctrl-C end a run at a step boundary, its step saved.

Spot and preemptible VMs, evicted Kubernetes pods and preempted SLURM jobs send SIGTERM,
then SIGKILL a grace time later (30 s by default on Kubernetes); Ctrl-C sends SIGINT.
While a StopSignals is installed, the first of either only asks the run to stop:

  - training (StopAtSignalHook) finishes the step in flight and ends its session, which
    writes a checkpoint at that global step, as at the last step; SaveThenStopListener
    then ends the run before the evaluation that would follow the checkpoint;
  - an evaluation (StopEvaluationHook) is abandoned after the batch in flight; it writes
    its results only at its end, so nothing half-written is left;
  - an export in progress finishes (tf.estimator writes it under a temporary name and
    renames it), and the run stops at its next step boundary.

Each ends the command with errors.RunStopped: one line, and exit status 128 + the signal
(143, 130). Rerunning the same command resumes from the saved step, with the batch the
stopped run would have taken next (see input_fn.make_training_input_fn). A second Ctrl-C
ends the process at once without saving; a repeated SIGTERM is ignored while the step is
saved (the platform's SIGKILL ends a save that overruns its grace time).
"""

import os
import signal
import sys
import threading
import time

import tensorflow as tf

from cifar10_estimator.errors import RunStopped, stopped_exit_status

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signal_number):
    """'SIGTERM' for signal.SIGTERM, and so on."""
    return signal.Signals(signal_number).name


class StopSignals:
    """While installed, SIGTERM and SIGINT request a stop instead of ending the process.

    Python runs a signal handler in the main thread between two bytecodes, so one that
    arrives while a step runs in TensorFlow's C++ runtime is seen once the step returns:
    the step in flight always completes.
    """

    def __init__(self, program, stream=None):
        """Args:
          program: the command as the user typed it, for the lines printed on stderr.
          stream: where those lines go (default sys.stderr).
        """
        self._program = program
        self._stream = stream
        self._previous_handlers = {}
        self.signal_number = None
        self.received_at = None

    @property
    def requested(self):
        """Whether a stop signal has arrived."""
        return self.signal_number is not None

    def __enter__(self):
        # Handlers can only be installed from the main thread (a trainer started in a
        # thread, as some tests do, keeps the default behaviour).
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                self._previous_handlers[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info):
        for number, handler in self._previous_handlers.items():
            signal.signal(number, handler)
        self._previous_handlers.clear()
        return False

    def _handle(self, signal_number, frame):
        if self.signal_number is None:
            self.signal_number, self.received_at = signal_number, time.monotonic()
            self._say("%s received: stopping after the step in flight, then saving it%s"
                      % (signal_name(signal_number),
                         " (Ctrl-C again ends at once, without saving)"
                         if signal_number == signal.SIGINT else ""))
        elif signal_number == signal.SIGINT:
            self._say("SIGINT again: ending now, without saving")
            os._exit(stopped_exit_status(signal.SIGINT))

    def _say(self, line):
        stream = self._stream or sys.stderr
        print("%s: %s" % (self._program, line), file=stream, flush=True)

    def stopped(self, what_happened):
        """The RunStopped that ends the command: 'stopped by SIGTERM <what_happened>'."""
        return RunStopped(self.signal_number,
                          "stopped by %s %s" % (signal_name(self.signal_number), what_happened))

    def raise_if_requested(self, what_happened):
        """Raise self.stopped(what_happened) if a stop signal has arrived."""
        if self.requested:
            raise self.stopped(what_happened)


class StopAtSignalHook(tf.compat.v1.train.SessionRunHook):
    """Training: once a stop is requested, end the session after the step in flight.

    The session's end writes a checkpoint at that step (tf.estimator's
    CheckpointSaverHook saves the last step whenever a session ends without an error).
    """

    def __init__(self, stop_signals):
        self._stop_signals = stop_signals

    def after_run(self, run_context, run_values):
        if self._stop_signals.requested:
            run_context.request_stop()


class StopEvaluationHook(tf.compat.v1.train.SessionRunHook):
    """Evaluation: once a stop is requested, abandon the evaluation after the batch in
    flight (it writes its summaries and results only when it ends)."""

    def __init__(self, stop_signals, checkpoint_dir):
        self._stop_signals = stop_signals
        self._checkpoint_dir = checkpoint_dir

    def after_run(self, run_context, run_values):
        if self._stop_signals.requested:
            raise self._stop_signals.stopped(
                "during an evaluation, which was abandoned; the latest checkpoint is %s, and "
                "the same command carries on from it" % tf.train.latest_checkpoint(
                    self._checkpoint_dir))


class SaveThenStopListener(tf.compat.v1.train.CheckpointSaverListener):
    """Ends the run right after the checkpoint a stop request led to.

    It must come before tf.estimator's own listener, which evaluates each new checkpoint
    (TrainSpec's saving_listeners run first).
    """

    def __init__(self, stop_signals, job_dir):
        self._stop_signals = stop_signals
        self._job_dir = job_dir

    def after_save(self, session, global_step_value):
        self._raise_saved(global_step_value)

    def end(self, session, global_step_value):
        # Reached without a save where the last step was already saved on schedule.
        self._raise_saved(global_step_value)

    def _raise_saved(self, global_step_value):
        if not self._stop_signals.requested:
            return
        checkpoint = tf.train.latest_checkpoint(self._job_dir)
        tf.compat.v1.logging.info("Saved %s at step %d after %s; %.1f s after the signal",
                                  checkpoint, global_step_value,
                                  signal_name(self._stop_signals.signal_number),
                                  time.monotonic() - self._stop_signals.received_at)
        raise self._stop_signals.stopped(
            "at step %d: saved %s; the same command resumes from it"
            % (global_step_value, checkpoint))
