"""The commands' small shared plumbing: a child's environment, "is this a terminal", a
Markdown table."""

import io
import os

import pytest

import cifar10_estimator
from cifar10_estimator.cli.child_process import child_environment
from cifar10_estimator.cli.markdown import markdown_table
from cifar10_estimator.cli.terminal import is_terminal

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cifar10_estimator.__file__)))


@pytest.mark.parametrize("python_path, expected", [
    (None, [PACKAGE_ROOT]), ("", [PACKAGE_ROOT]),
    ("/elsewhere", [PACKAGE_ROOT, "/elsewhere"])])
def test_a_child_imports_this_package_and_gets_no_empty_path_entry(python_path, expected):
    base = {"HOME": "/home/me"} if python_path is None else {"PYTHONPATH": python_path}
    environment = child_environment(base=base)
    # An empty entry would put the child's working directory on its path.
    assert environment["PYTHONPATH"].split(os.pathsep) == expected
    assert environment["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_a_childs_environment_keeps_the_callers_and_takes_the_extra_values_last():
    environment = child_environment({"TF_CONFIG": "{}", "TF_CPP_MIN_LOG_LEVEL": "0"},
                                    base={"TF_CONFIG": "stale", "LANG": "C"})
    assert (environment["TF_CONFIG"], environment["TF_CPP_MIN_LOG_LEVEL"],
            environment["LANG"]) == ("{}", "0", "C")
    assert child_environment(base={"TF_CPP_MIN_LOG_LEVEL": "3"})["TF_CPP_MIN_LOG_LEVEL"] == "3"


class Terminal(io.StringIO):
    def isatty(self):
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return True


def test_a_terminal_is_a_tty_whose_term_is_not_dumb(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert is_terminal(Terminal())
    assert not is_terminal(io.StringIO())
    closed = Terminal()
    closed.close()
    assert not is_terminal(closed)
    assert not is_terminal(object())
    monkeypatch.setenv("TERM", "dumb")
    assert not is_terminal(Terminal())


def test_a_markdown_tables_cells_keep_their_bars():
    assert markdown_table(["flag", "meaning"], [["--to a|b", 3]]).splitlines() == [
        "| flag | meaning |", "|---|---|", "| --to a\\|b | 3 |"]
