"""Options declared once, as dataclass fields, and parsed into them; the argparse types
they take."""

import argparse
import dataclasses

from cifar10_estimator.cli.command import invoked_program
from cifar10_estimator.errors import UsageError


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


def options_parser(options_class, description, required_exclusive=(), **parser_keywords):
    """The ArgumentParser of a command whose flags are the option fields of
    `options_class` (a dataclass), for add_options' `required_exclusive` and argparse's
    other keywords (usage, formatter_class)."""
    parser = ArgumentParser(description=description, **parser_keywords)
    add_options(parser, option_fields(options_class), required_exclusive=required_exclusive)
    return parser


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
