"""What a training prints: a console for a person, and the full log in the job dir.

TensorFlow's Python log (the tutorial's lines: throughput every 10 steps, loss and
learning rate, the network's shapes, the RunConfig, tf.estimator's own) goes whole to
JOB/train.log, each line with its time. The console shows only what a person watches:
the lines this package logs for the console (`console_logger`: the plan, each
evaluation, the test accuracy), every warning and error, and the progress: on a
terminal one line redrawn in place, elsewhere (a file, CI, a cluster's log collector)
one line each PROGRESS_PERCENT_STEP percent or PROGRESS_EVERY_SECS, whichever comes
first. --verbose prints the whole log to the console, as the tutorial did.

TensorFlow's C++ side prints its start-up notices on file descriptor 2 before any of
this is set up; main holds them back and hands them to `RunConsole.startup_output`,
which sends the known notices of a machine without a GPU (STARTUP_NOTICES) to the log
file only.
"""

import logging
import shutil
import sys
import threading
import time

from cifar10_estimator.cli.terminal import is_terminal

# Lines for the console are logged through this child of TensorFlow's logger, so they
# reach TensorFlow's own handler where no RunConsole is installed (tests, other tools).
CONSOLE_LOGGER_NAME = "tensorflow.cifar10_estimator"

# Off a terminal, a progress line each this many percent of the steps, or sooner ...
PROGRESS_PERCENT_STEP = 5
# ... when this long has passed since the last one.
PROGRESS_EVERY_SECS = 60
# On a terminal, the line is redrawn at most this often.
TERMINAL_REDRAW_SECS = 0.5
PROGRESS_BAR_WIDTH = 20

# What TensorFlow 2.15's C++ side prints at start-up on a machine without a GPU or
# TensorRT: true, and nothing to act on, so only the log file keeps them.
STARTUP_NOTICES = (
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "TF-TRT Warning: Could not find TensorRT",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions",
    "oneDNN custom operations are on",
    "Could not find cuda drivers on your machine",
)

# TensorFlow's own format (the console's with --verbose), and the log file's, timed. Lines
# for the console come from a child of TensorFlow's logger but read as TensorFlow's.
VERBOSE_FORMAT = "%(levelname)s:tensorflow:%(message)s"
LOG_FORMAT = "%(asctime)s " + VERBOSE_FORMAT


def console_logger():
    """The logger of the lines a person sees by default (the file log has them too)."""
    return logging.getLogger(CONSOLE_LOGGER_NAME)


def log_file_name(task=None):
    """The log file of a process in the job dir: train.log, or train.<type>-<index>.log
    for a task of a cluster other than its chief (one file per task: they share the dir)."""
    if task is None or task.writes_checkpoints:
        return "train.log"
    return "train.%s-%d.log" % (task.task_type, task.task_index)


def is_startup_notice(line):
    """Whether a line of the C++ side's start-up output is one of STARTUP_NOTICES."""
    return any(notice in line for notice in STARTUP_NOTICES)


class RunConsole:
    """The console and the log file of one training process, while the block runs.

    Installed on TensorFlow's Python logger in place of its own console handler, and
    restored when the block ends. Progress comes in through `show_progress`.
    """

    def __init__(self, log_path, verbose=False, stream=None, clock=time.monotonic):
        """Args:
          log_path: the file that gets the whole log (appended to), or None for none
            (a job dir that is not a local directory): the console then shows it all.
          verbose: the console shows the whole log, as the tutorial's did.
          stream: where the console writes; default sys.stderr.
          clock: callable returning seconds, for the progress lines' cadence.
        """
        self._log_path = log_path
        self._verbose = verbose or log_path is None
        self._stream = stream or sys.stderr
        self._console = _ConsoleHandler(self._stream, self._verbose, clock)
        self._file = None
        self._removed_handlers = []
        self._logger = logging.getLogger("tensorflow")

    def __enter__(self):
        import tensorflow as tf  # sets up TensorFlow's logger and its handler
        del tf
        if self._log_path:
            self._file = logging.FileHandler(self._log_path, mode="a", encoding="utf-8")
            self._file.setFormatter(logging.Formatter(LOG_FORMAT))
            self._logger.addHandler(self._file)
        self._removed_handlers = [handler for handler in self._logger.handlers
                                  if isinstance(handler, logging.StreamHandler)
                                  and not isinstance(handler, logging.FileHandler)]
        for handler in self._removed_handlers:
            self._logger.removeHandler(handler)
        self._logger.addHandler(self._console)
        return self

    def __exit__(self, *exc_info):
        self._console.end_progress()
        self._logger.removeHandler(self._console)
        for handler in self._removed_handlers:
            self._logger.addHandler(handler)
        if self._file:
            self._logger.removeHandler(self._file)
            self._file.close()
        return False

    def startup_output(self, text):
        """What the C++ side wrote to file descriptor 2 before the console was set up:
        every line to the log file, those not in STARTUP_NOTICES to the console too."""
        for line in text.splitlines():
            if not line.strip():
                continue
            if self._file:
                self._file.stream.write(line + "\n")
                self._file.flush()
            if self._verbose or not is_startup_notice(line):
                self._console.write_line(line)

    def show_progress(self, line, fraction_done):
        """Show a progress line (run.time_to_go.progress_line) at fraction_done of the
        steps: redrawn in place on a terminal, else at the cadence the module describes.
        The log file gets it at the same cadence as a file console."""
        self._console.show_progress(line, fraction_done, self._file)


class _ConsoleHandler(logging.Handler):
    """The console: the lines it shows (see RunConsole), and the progress line."""

    def __init__(self, stream, verbose, clock):
        super().__init__(logging.DEBUG)
        self._stream = stream
        self._verbose = verbose
        self._clock = clock
        self._is_terminal = is_terminal(stream)
        self._progress_drawn = ""  # the progress line now on the terminal's last line
        self._last_redraw = None
        self._last_line_time = None
        self._last_line_percent_step = None
        self._finished = False
        self._lock = threading.RLock()
        self.setFormatter(_ConsoleFormatter(verbose))

    def emit(self, record):
        if not (self._verbose or record.levelno >= logging.WARNING
                or record.name == CONSOLE_LOGGER_NAME):
            return
        try:
            self.write_line(self.format(record))
        except Exception:  # logging's contract: a handler never raises
            self.handleError(record)

    def write_line(self, text):
        with self._lock:
            self._clear_progress()
            self._stream.write(text + "\n")
            if self._progress_drawn:
                self._stream.write(self._progress_drawn)
            self._stream.flush()

    def show_progress(self, line, fraction_done, log_file):
        with self._lock:
            if self._finished:
                return  # the last step's line is shown; it is told again at the run's end
            self._finished = fraction_done >= 1
            now = self._clock()
            if self._due_for_a_line(fraction_done, now):
                self._last_line_time = now
                self._last_line_percent_step = _percent_step(fraction_done)
                record = logging.makeLogRecord({"name": "tensorflow", "levelno": logging.INFO,
                                                "levelname": "INFO", "msg": line})
                if log_file:
                    log_file.handle(record)
                if not self._is_terminal or self._verbose:
                    self._stream.write(self.format(record) + "\n")
                    self._stream.flush()
            if self._is_terminal and not self._verbose and (
                    self._last_redraw is None or fraction_done >= 1
                    or now - self._last_redraw >= TERMINAL_REDRAW_SECS):
                self._last_redraw = now
                self._clear_progress()
                self._progress_drawn = _fit_to_terminal(
                    "%s %s" % (_bar(fraction_done), line))
                self._stream.write(self._progress_drawn)
                self._stream.flush()
                if fraction_done >= 1:
                    self.end_progress()

    def end_progress(self):
        """Leave the progress line on the terminal as it is and go to a new line."""
        with self._lock:
            if self._progress_drawn:
                self._stream.write("\n")
                self._stream.flush()
                self._progress_drawn = ""

    def _due_for_a_line(self, fraction_done, now):
        return (self._last_line_time is None or fraction_done >= 1
                or _percent_step(fraction_done) > self._last_line_percent_step
                or now - self._last_line_time >= PROGRESS_EVERY_SECS)

    def _clear_progress(self):
        if self._progress_drawn:
            # A line written now takes the progress line's place; write_line draws it again.
            self._stream.write("\r\x1b[K")


class _ConsoleFormatter(logging.Formatter):
    """Lines for a person: the message alone, with 'warning:'/'error:' where it is one.
    Verbose: TensorFlow's own format, as the tutorial printed it."""

    def __init__(self, verbose):
        super().__init__(VERBOSE_FORMAT if verbose else "%(message)s")
        self._verbose = verbose

    def format(self, record):
        text = super().format(record)
        if self._verbose or record.levelno < logging.WARNING:
            return text
        return "%s: %s" % (record.levelname.lower(), text)


def _percent_step(fraction_done):
    return int(100 * fraction_done // PROGRESS_PERCENT_STEP)


def _bar(fraction_done):
    filled = int(round(PROGRESS_BAR_WIDTH * min(1.0, max(0.0, fraction_done))))
    return "[%s%s]" % ("=" * filled, " " * (PROGRESS_BAR_WIDTH - filled))


def _fit_to_terminal(text):
    # A line longer than the terminal wraps, and "\r" then returns to its second half.
    width = shutil.get_terminal_size((80, 24)).columns
    return text[:max(10, width - 1)]
