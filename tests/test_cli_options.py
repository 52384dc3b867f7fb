"""An option is declared once, as a dataclass field: the parser is built from the fields,
the command line parses into the dataclass, and the options given are told apart from
those left at their defaults."""

import dataclasses
import typing

import pytest

from cifar10_estimator.cli.options import (ArgumentParser, add_options, option, option_fields,
                                           option_per_value, parse, parse_options, positive_int)
from cifar10_estimator.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Options:
    """Every kind of declaration a command uses."""

    source: typing.Optional[str] = option(None, "One source.", exclusive="source")
    other_source: typing.Optional[str] = option(None, "The other.", exclusive="source")
    mode: str = option_per_value("quick", {"smoke": "Tiny.", "quick": "Small."})
    evaluator: bool = option(True, "No evaluator.", flag="--no-evaluator",
                             action="store_false")
    reference: list = option([], "A line; may be repeated.", nargs=2, action="append")
    count: int = option(3, "How many.", type=positive_int)
    files: list = option(None, "The files.", positional=True, nargs="+")


def parser():
    parser = ArgumentParser(prog="command")
    add_options(parser, option_fields(Options), required_exclusive=["source"])
    return parser


def test_the_command_line_parses_into_the_options_class():
    options = parse(parser(), Options, [
        "--other-source", "S", "--smoke", "--no-evaluator", "--reference", "90", "a",
        "--reference", "95", "b", "--count", "5", "x.png", "y.png"])
    assert options == Options(other_source="S", mode="smoke", evaluator=False,
                              reference=[["90", "a"], ["95", "b"]], count=5,
                              files=["x.png", "y.png"])


def test_defaults_come_from_the_declarations_and_a_list_is_each_options_own():
    first = parse(parser(), Options, ["--source", "S", "f"])
    second = parse(parser(), Options, ["--source", "S", "f"])
    assert (first.mode, first.evaluator, first.count, first.reference) == ("quick", True, 3, [])
    first.reference.append(["1", "x"])
    assert second.reference == [] and Options().reference == []


def test_an_option_given_at_its_default_value_counts_as_given():
    values, given = parse_options(parser(), option_fields(Options), [
        "--source", "S", "--count", "3", "--quick", "f"])
    assert given == {"source", "count", "mode", "files"}
    assert (values["count"], values["mode"], values["other_source"]) == (3, "quick", None)


@pytest.mark.parametrize("argv, fragment", [
    (["f"], "one of the arguments --source --other-source is required"),
    (["--source", "S", "--other-source", "T", "f"], "not allowed with"),
    (["--source", "S", "--smoke", "--quick", "f"], "not allowed with"),
    (["--source", "S", "--count", "0", "f"], "expected a positive integer"),
    (["--source", "S"], "the following arguments are required: files"),
])
def test_a_malformed_command_line_is_a_usage_error(argv, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse(parser(), Options, argv)
