"""docs/other-runtimes.md shows commands the code takes, and links to files that exist."""

import importlib
import os
import re
import shlex

import pytest

from cli_helpers import REPO_ROOT

PAGE = os.path.join(REPO_ROOT, "docs", "other-runtimes.md")


def page_text():
    with open(PAGE) as stream:
        return stream.read()


def shown_commands():
    """(module, arguments) of every `python -m cifar10_estimator...` line in a code block,
    with the lines a trailing backslash continues joined."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", page_text(), re.M | re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["python", "-m"] and words[2].startswith("cifar10_estimator"):
                commands.append((words[2], words[3:]))
    return commands


def test_the_page_shows_every_command_of_the_job():
    modules = {module for module, _ in shown_commands()}
    assert modules >= {"cifar10_estimator.serving.convert", "cifar10_estimator.serving.evaluate",
                       "cifar10_estimator.serving.predict",
                       "cifar10_estimator.benchmarks.runtimes"}


@pytest.mark.parametrize("module, arguments", shown_commands())
def test_each_command_shown_parses(module, arguments):
    importlib.import_module(module).build_parser().parse_args(arguments)


def test_relative_links_lead_to_files_of_the_repository():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page_text()):
        if "://" not in target:
            assert os.path.exists(os.path.join(os.path.dirname(PAGE), target)), target
