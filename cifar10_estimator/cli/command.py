"""Running a command: its exit status, a user's error in one line on stderr, what
TensorFlow's C++ code writes to stderr held back, and the program's name as typed."""

import contextlib
import os
import sys
import tempfile

from cifar10_estimator.errors import Cifar10EstimatorError, RunStopped


def invoked_program():
    """The program as the user typed it, for usage lines and error messages.

    `python -m cifar10_estimator.main` when run as a module (a tool of the checkout's
    too: `python -m tools.step_rates`), the console command's name (`cifar10-train`) when
    run through one, `python scripts/x.py` for a script.
    """
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None:
        module = main_spec.name
        if module.endswith(".__main__"):
            module = module[:-len(".__main__")]
        return "python -m " + module
    command = sys.argv[0] if sys.argv and sys.argv[0] else "cifar10_estimator"
    if command.endswith(".py"):
        return "python " + command
    return os.path.basename(command)


def first_line(error):
    """The first line of an exception's message (TensorFlow's carry whole stacks)."""
    message = (getattr(error, "message", None) or str(error)).strip()
    return message.splitlines()[0] if message else type(error).__name__


def one_line(text):
    """`text` with every run of white space (newlines included) folded into one space."""
    return " ".join(text.split())


def run_command(main, argv=None, prog=None):
    """Run `main(argv)` and return the process exit status.

    Args:
      main: function taking the argument list (without the program name); it may
        return None or an int exit status.
      argv: arguments, default sys.argv[1:].
      prog: program name for messages, default `invoked_program()`.

    Returns:
      0 on success, the error's exit status for a Cifar10EstimatorError
      (printed as one line on stderr), 128 + the signal for a RunStopped (its line
      on stderr too), 130 on Ctrl-C.
    """
    prog = prog or invoked_program()
    try:
        status = main(sys.argv[1:] if argv is None else argv)
    except RunStopped as stop:
        print("%s: %s" % (prog, one_line(str(stop))), file=sys.stderr)
        return stop.exit_status
    except Cifar10EstimatorError as error:
        print("%s: error: %s" % (prog, one_line(str(error))), file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        print("%s: interrupted" % prog, file=sys.stderr)
        return 130
    return int(status or 0)


@contextlib.contextmanager
def _stderr_held(write_out, held_text=None):
    """Hold back what the block writes to file descriptor 2 (C++ code included), then
    write it out if write_out(the exception the block raised, or None) is true; else, if
    the block succeeded, hand it to held_text (a HeldStderr), if given."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        raised = None
        try:
            yield
        except BaseException as error:
            raised = error
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            held.seek(0)
            if write_out(raised):
                sys.stderr.write(held.read().decode("utf-8", "replace"))
                sys.stderr.flush()
            elif raised is None and held_text is not None:
                held_text.text = held.read().decode("utf-8", "replace")


def stderr_dropped_on_user_error():
    """Hold back what the block writes to file descriptor 2 (C++ code included).

    Dropped if the block raises a Cifar10EstimatorError, whose one line is all the
    user needs (TensorFlow prints lines such as "Unable to register cuDNN factory"
    at import); written out once the block ends in any other way.
    """
    return _stderr_held(lambda error: not isinstance(error, Cifar10EstimatorError))


class HeldStderr:
    """What a block wrote to file descriptor 2, once it has ended (`text`)."""

    def __init__(self):
        self.text = ""


@contextlib.contextmanager
def stderr_held_for_the_log():
    """Hold back what the block writes to file descriptor 2 (C++ code included).

    Yields a HeldStderr whose text is what was written, for the caller to place once the
    block succeeds (the trainer's start-up notices go to its log file). Dropped if the
    block raises a Cifar10EstimatorError, written out if it raises anything else.
    """
    held = HeldStderr()

    def write_out(error):
        return error is not None and not isinstance(error, Cifar10EstimatorError)

    with _stderr_held(write_out, held):
        yield held


def stderr_dropped_on_success():
    """Hold back what the block writes to file descriptor 2 (C++ code included).

    Dropped if the block succeeds (for chatter such as the TensorFlow Lite converter's
    summaries); written out if it raises, as what led to the error.
    """
    return _stderr_held(lambda error: error is not None)
