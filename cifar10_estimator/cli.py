"""Shared command-line plumbing: options declared as dataclass fields and parsed into them,
user errors turned into one line on stderr and an exit status, TensorFlow's chatter muted,
a child process's environment, whether a stream is a terminal, a Markdown table."""

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import tempfile

from cifar10_estimator.errors import Cifar10EstimatorError, RunStopped, UsageError

# The folder holding this copy of the package: a child process imports it from there.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose flag errors raise UsageError instead of exiting.

    That keeps flag errors and validation errors on one path: `run_command`. Its
    program name is the one the user typed (`invoked_program`).
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("prog", invoked_program())
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(message)


def option(default, help, group=None, exclusive=None, flag=None, positional=False,
           **add_argument_keywords):
    """A dataclass field that is also the command-line flag --its-name (see flag_of).

    The one declaration of an option: its default (a list default is copied for each
    instance), its help, the title of the argument group --help shows it in (None: the
    parser's own options), and what argparse's add_argument takes besides (type, choices,
    metavar, action, required, nargs). Options that share an `exclusive` name exclude each
    other on the command line. `flag` names a flag other than --its-name (--no-evaluator
    for `evaluator`); a `positional` option is given without a flag.
    """
    metadata = {"help": help, "group": group, "exclusive": exclusive, "flag": flag,
                "positional": positional, "add_argument": add_argument_keywords}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def option_per_value(default, helps, group=None):
    """A dataclass field whose values each have a flag: --smoke stores "smoke".

    Args:
      default: the value when none of the flags is given.
      helps: {value: the help of its flag}, in the order --help lists them; the flags
        exclude each other.
      group: as for `option`.
    """
    return dataclasses.field(default=default, metadata={
        "help": None, "group": group, "exclusive": None, "flag": None, "positional": False,
        "add_argument": {}, "helps_by_value": helps})


def is_option(field):
    """Whether a dataclass field was declared with `option` (the others are no flags)."""
    return "add_argument" in field.metadata


def option_fields(*classes):
    """The option fields of the dataclasses `classes`, in the order they are declared."""
    return [field for cls in classes for field in dataclasses.fields(cls) if is_option(field)]


def flag_of(name):
    """The command-line flag of an option or a parser destination: num_gpus -> --num-gpus."""
    return "--" + name.replace("_", "-")


def default_of(field):
    """The value an option field takes when its flag is not given."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def add_options(parser, fields, groups=(), required_exclusive=()):
    """Add the flag of each option field to `parser`, in its argument group.

    Args:
      parser: an argparse parser.
      fields: option fields (option_fields), in the order --help lists them in a group.
      groups: (title, description) of the fields' argument groups, in the order --help
        shows them.
      required_exclusive: the `exclusive` names of the options of which one must be given.
    """
    containers = {None: parser}
    for title, description in groups:
        containers[title] = parser.add_argument_group(title, description)
    exclusive_groups = {}
    for field in fields:
        metadata = field.metadata
        container = containers[metadata["group"]]
        if metadata["exclusive"]:
            if metadata["exclusive"] not in exclusive_groups:
                exclusive_groups[metadata["exclusive"]] = container.add_mutually_exclusive_group(
                    required=metadata["exclusive"] in required_exclusive)
            container = exclusive_groups[metadata["exclusive"]]
        if "helps_by_value" in metadata:
            _add_flag_per_value(container, field)
            continue
        if metadata["positional"]:
            names, destination = [field.name], {}
        elif metadata["flag"]:
            names, destination = [metadata["flag"]], {"dest": field.name}
        else:
            names, destination = [flag_of(field.name)], {}
        container.add_argument(*names, default=default_of(field), help=metadata["help"],
                               **destination, **metadata["add_argument"])


def _add_flag_per_value(container, field):
    values = container.add_mutually_exclusive_group()
    for value, help in field.metadata["helps_by_value"].items():
        values.add_argument(flag_of(value), dest=field.name, action="store_const", const=value,
                            help=help)
    container.set_defaults(**{field.name: field.default})


def parse_options(parser, fields, argv):
    """Parse the command line argv with `parser`, which add_options built from `fields`.

    Returns:
      ({field name: value}, {the names of the fields whose flags argv gives}).

    Raises:
      UsageError: a malformed command line (see ArgumentParser).
    """
    # Each option starts out as a marker of its own, which argparse replaces only when
    # the command line gives the option; a list (append) starts as a copy of its default.
    markers = {field.name: (default_of(field) if field.default_factory is not dataclasses.MISSING
                            else object())
               for field in fields}
    values = vars(parser.parse_args(argv, argparse.Namespace(**markers)))
    given = {name for name, marker in markers.items() if values[name] is not marker}
    return {field.name: values[field.name] if field.name in given else default_of(field)
            for field in fields}, given


def parse(parser, options_class, argv):
    """The options_class (a dataclass of option fields) of the command line argv, parsed
    by `parser`, which add_options built from its fields."""
    values, _ = parse_options(parser, option_fields(options_class), argv)
    return options_class(**values)


def parse_bool(text):
    """argparse type for real booleans: true/false, yes/no, 1/0, on/off (any case)."""
    value = str(text).strip().lower()
    if value in ("true", "yes", "1", "on", "t", "y"):
        return True
    if value in ("false", "no", "0", "off", "f", "n"):
        return False
    raise argparse.ArgumentTypeError("expected true or false, got %r" % text)


def _number_at_least(text, convert, is_allowed, expected):
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not is_allowed(value):
        raise argparse.ArgumentTypeError("expected %s, got %r" % (expected, text))
    return value


def positive_int(text):
    """argparse type: a whole number > 0."""
    return _number_at_least(text, int, lambda value: value > 0, "a positive integer")


def non_negative_int(text):
    """argparse type: a whole number >= 0."""
    return _number_at_least(text, int, lambda value: value >= 0, "0 or a positive integer")


def positive_float(text):
    """argparse type: a number > 0."""
    return _number_at_least(text, float, lambda value: value > 0, "a positive number")


def non_negative_float(text):
    """argparse type: a number >= 0."""
    return _number_at_least(text, float, lambda value: value >= 0, "0 or a positive number")


def between_zero_and_one(text):
    """argparse type: a number strictly between 0 and 1."""
    return _number_at_least(text, float, lambda value: 0 < value < 1,
                            "a number between 0 and 1 (both excluded)")


def below_one(text):
    """argparse type: a number from 0 up to 1, 1 excluded (0: off, for an option's rate)."""
    return _number_at_least(text, float, lambda value: 0 <= value < 1,
                            "a number from 0 up to 1 (1 excluded)")


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


def quiet_tensorflow_logs(cpp_min_log_level, python_log_level):
    """Mute TensorFlow's chatter: C++ lines below a level and v1 deprecation notices.

    Loads no TensorFlow: call it before TensorFlow is first imported (the C++ level is
    read once), e.g. before checks that may load it. A TF_CPP_MIN_LOG_LEVEL the user
    exported wins.

    Args:
      cpp_min_log_level: "0" all, "1" no INFO, "2" no WARNING, "3" no ERROR.
      python_log_level: level of TensorFlow's Python logger, e.g. "INFO" or "ERROR".
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", cpp_min_log_level)
    # The logger tf.get_logger() returns, which TensorFlow configures without a level.
    logger = logging.getLogger("tensorflow")
    logger.setLevel(python_log_level)
    logger.addFilter(_not_a_deprecation_notice)


def _not_a_deprecation_notice(record):
    """Whether a record of TensorFlow's logger is not a v1 deprecation notice, which its
    deprecation module logs as a warning at the first call of each deprecated function."""
    return record.module != "deprecation"


def child_environment(extra=None, base=None):
    """The environment of a child Python process that imports this copy of the package.

    `base` (default os.environ) with PACKAGE_ROOT first on PYTHONPATH (and no empty entry,
    which Python would read as the working directory), TensorFlow's C++ INFO lines muted
    unless the environment says otherwise, and `extra` (a dict) over it all.
    """
    environment = dict(os.environ if base is None else base)
    environment["PYTHONPATH"] = os.pathsep.join(
        path for path in (PACKAGE_ROOT, environment.get("PYTHONPATH")) if path)
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    environment.update(extra or {})
    return environment


def is_terminal(stream):
    """Whether `stream` is a terminal that redraws a line in place (not TERM=dumb)."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def markdown_table(header, rows):
    """A Markdown table: the header's cells, then a line per row; a `|` in a cell is
    escaped, so that it does not end the cell."""
    def line(cells):
        return "| %s |" % " | ".join(str(cell).replace("|", "\\|") for cell in cells)
    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(row) for row in rows])
