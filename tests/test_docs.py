"""The README and the manual in docs/ show commands the code takes and links that resolve.

Every `python -m cifar10_estimator.X ...` command on a page (in a code block or inline
code, continued over lines with a trailing backslash) must name a module that exists and
only flags that module's own parser declares; the trainer flags after `--` of the local
cluster launcher and of scripts/setup_and_run.sh must be the trainer's. The default trainer
command lines of setup_and_run.sh must be the trainer's flags too. Every relative link must
name a file that exists and every #anchor a heading of that file. The flag table of
docs/training.md must be the one the options' declarations generate.
"""

import difflib
import functools
import glob
import importlib
import importlib.util
import os
import re
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(path, REPO_ROOT) for path in glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))
SETUP_AND_RUN = "scripts/setup_and_run.sh"
TRAINER = "cifar10_estimator.main"
LOCAL_CLUSTER = "cifar10_estimator.distributed.local_cluster"

# Where a command's parser is built when its module does not define build_parser() itself:
# the trainer parses with flags.build_parser (which the cluster launcher shares), and a
# package's __main__ hands over to the module named here.
PARSER_HOMES = {
    TRAINER: "cifar10_estimator.flags",
    "cifar10_estimator.benchmarks": "cifar10_estimator.benchmarks.suite",
    "cifar10_estimator.curves": "cifar10_estimator.curves.plot",
}
# The manual's flag table, generated from the options' declarations (flags.markdown_table),
# sits between these lines.
FLAG_TABLE_PAGE = "docs/training.md"
FLAG_TABLE_BEGIN = "<!-- The flag table: python -m cifar10_estimator.flags --markdown"
FLAG_TABLE_END = "<!-- End of the flag table. -->"
# Scripts the pages show that run a module's command line.
SCRIPT_MODULES = {"scripts/launch_local_cluster.py": LOCAL_CLUSTER}
# Commands whose flags after a bare `--` are passed on to the trainer.
PASS_TO_TRAINER = {LOCAL_CLUSTER, SETUP_AND_RUN}

COMMAND = re.compile(r"(?:-m\s+(cifar10_estimator(?:\.\w+)*)"
                     r"|python\S*\s+(%s)"
                     r"|bash\s+(%s))(?![\w.])"
                     % ("|".join(map(re.escape, SCRIPT_MODULES)), re.escape(SETUP_AND_RUN)))
# What ends a command inside a line of shell.
SHELL_SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>&1"}
FLAG = re.compile(r"--[A-Za-z0-9][\w-]*")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def read(page):
    with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as stream:
        return stream.read().split("\n")


def code_line_numbers(lines):
    """Indexes of the lines in fenced or indented code blocks."""
    code, fenced, previous_blank_or_code = set(), False, True
    for index, line in enumerate(lines):
        if FENCE.match(line):
            code.add(index)
            fenced = not fenced
        elif fenced or (line.startswith("    ") and line.strip() and previous_blank_or_code):
            code.add(index)
        previous_blank_or_code = not line.strip() or index in code
    return code


def snippets(page):
    """(line number, text) of every piece of code on a page, with newlines where it wraps.

    A line of a code block is one piece, with the lines that a trailing backslash joins to
    it; in the prose, each inline code span is one.
    """
    lines = read(page)
    code = code_line_numbers(lines)
    index = 0
    while index < len(lines):
        if index in code:
            start, text = index, lines[index]
            while text.endswith("\\") and index + 1 in code:
                index += 1
                text = text[:-1] + "\n" + lines[index]
            yield start + 1, text
            index += 1
            continue
        start = index
        while index < len(lines) and index not in code and lines[index].strip():
            index += 1
        paragraph = "\n".join(lines[start:index])
        for span in INLINE_CODE.finditer(paragraph):
            yield start + 1 + paragraph.count("\n", 0, span.start(2)), span.group(2)
        index = max(index, start + 1)


def commands(page):
    """(line number, program, [(line number, token)]) of each command shown on a page."""
    for first_line, text in snippets(page):
        for command in COMMAND.finditer(text):
            program = next(group for group in command.groups() if group)
            tokens = []
            for token in re.finditer(r"\S+", text[command.end():]):
                word = token.group()
                if word in SHELL_SEPARATORS or word.startswith("#"):
                    break
                tokens.append((first_line + text.count("\n", 0, command.end() + token.start()),
                               word))
            yield first_line + text.count("\n", 0, command.start()), program, tokens


def flag_of(token):
    """The flag a command-line token names ('--flag=value' names --flag), or None."""
    match = FLAG.match(token.lstrip("[(\"'"))
    return match.group() if match else None


@functools.lru_cache(maxsize=None)
def options_of(module):
    """The options (`--flag`, `-h`) of `python -m module`, from the parser the module builds."""
    home = importlib.import_module(PARSER_HOMES.get(module, module))
    if not callable(getattr(home, "build_parser", None)):
        raise LookupError("%s has no build_parser() to ask for its flags" % home.__name__)
    parser = home.build_parser()
    return frozenset(option for action in parser._actions for option in action.option_strings)


def module_exists(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def setup_and_run_options():
    """The options setup_and_run.sh's own `case` takes (before its `--`)."""
    options = set()
    for line in read(SETUP_AND_RUN):
        pattern = re.match(r"\s*([-\w|]+)\)", line)
        if pattern:
            options.update(option for option in pattern.group(1).split("|")
                           if option.startswith("--") and option != "--")
    return options


def command_problems(page, line, program, tokens):
    """What is wrong with one command on a page, one message each."""
    where = "%s:%d" % (page, line)
    if program == SETUP_AND_RUN:
        own_options = setup_and_run_options()
    else:
        module = SCRIPT_MODULES.get(program, program)
        if not module_exists(module):
            return ["%s: python -m %s: no such module" % (where, module)]
        try:
            own_options = options_of(module)
        except Exception as error:  # a command whose flags can't be had fails the check
            return ["%s: cannot get the parser of %s: %s" % (where, module, error)]
    words = [word for _, word in tokens]
    passes_on = SCRIPT_MODULES.get(program, program) in PASS_TO_TRAINER and "--" in words
    shown = program if program.startswith("scripts/") else "python -m " + program
    split = words.index("--") if passes_on else len(tokens)
    problems = []
    for position, (token_line, word) in enumerate(tokens):
        flag = flag_of(word)
        if flag is None or word == "--":
            continue
        if position < split:
            if flag not in own_options:
                problems.append("%s:%d: %s takes no %s" % (page, token_line, shown, flag))
        elif flag not in options_of(TRAINER):
            problems.append("%s:%d: the trainer (after %s's --) takes no %s"
                            % (page, token_line, shown, flag))
    return problems


def slug(heading):
    """GitHub's anchor for a heading: lowercase, spaces to '-', punctuation but '-' and '_' out."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page):
    """The #anchors of a page's headings (GitHub's numbering of repeated ones included)."""
    lines = read(page)
    code = code_line_numbers(lines)
    found, seen = set(), {}
    for index, line in enumerate(lines):
        heading = HEADING.match(line)
        if heading and index not in code:
            base = slug(heading.group(2))
            anchor = base if base not in seen else "%s-%d" % (base, seen[base])
            seen[base] = seen.get(base, 0) + 1
            found.add(anchor)
    return found


def links(page):
    """(line number, target) of every link and image outside code on a page."""
    lines = read(page)
    code = code_line_numbers(lines)
    prose = "\n".join("" if index in code else line for index, line in enumerate(lines))
    prose = INLINE_CODE.sub(lambda span: span.group().replace("[", " ").replace("]", " "), prose)
    for link in LINK.finditer(prose):
        yield 1 + prose.count("\n", 0, link.start()), link.group(1)


def link_problem(page, line, target):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
        return None
    path, _, anchor = target.partition("#")
    where = "%s:%d" % (page, line)
    linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(os.path.join(REPO_ROOT, linked)):
        return "%s: link to %s: no such file" % (where, target)
    if anchor and anchor not in anchors(linked):
        return "%s: link to %s: %s has no heading with that anchor" % (where, target, linked)
    return None


def test_the_pages_are_the_readme_and_the_manual():
    assert "README.md" in PAGES and "docs/README.md" in PAGES
    assert all(os.path.isfile(os.path.join(REPO_ROOT, page)) for page in PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_commands_name_modules_and_flags_the_code_takes(page):
    problems = [problem for command in commands(page)
                for problem in command_problems(page, *command)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_and_anchors_resolve(page):
    problems = [problem for link in links(page) if (problem := link_problem(page, *link))]
    assert not problems, "\n".join(problems)


def test_setup_and_run_default_command_lines_are_trainer_flags():
    trainer_flags = options_of(TRAINER)
    lines = read(SETUP_AND_RUN)
    problems, found = [], 0
    for index, line in enumerate(lines):
        if not re.match(r"\s*set -- ", line):
            continue
        found += 1
        words = [(index + 1, word) for word in line.split()[2:]]
        while line.endswith("\\") and index + 1 < len(lines):
            index += 1
            line = lines[index]
            words += [(index + 1, word) for word in line.split()]
        problems += ["%s:%d: the trainer takes no %s" % (SETUP_AND_RUN, number, flag_of(word))
                     for number, word in words
                     if flag_of(word) and flag_of(word) not in trainer_flags]
    assert found, "%s has no `set -- ...` default command line any more" % SETUP_AND_RUN
    assert not problems, "\n".join(problems)


def test_the_checks_see_commands_over_lines_and_flags_with_values(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "Run `python -m cifar10_estimator.main --num-gpus=0\n--no-such-flag` here.\n\n"
        "    python -m cifar10_estimator.main --job-dir JOB \\\n"
        "        --num-layerz 20 [RECIPE]   # --not-this-one\n\n"
        "    python scripts/launch_local_cluster.py --num-ps 1 -- --sinc\n\n"
        "    python -m cifar10_estimator.nowhere --x\n\n"
        "    python -m cifar10_estimator.cifar10 --data-dir D\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", str(tmp_path))
    problems = [problem for command in commands("page.md")
                for problem in command_problems("page.md", *command)]
    assert problems == [
        "page.md:2: python -m cifar10_estimator.main takes no --no-such-flag",
        "page.md:5: python -m cifar10_estimator.main takes no --num-layerz",
        "page.md:7: the trainer (after scripts/launch_local_cluster.py's --) takes no --sinc",
        "page.md:9: python -m cifar10_estimator.nowhere: no such module",
        "page.md:11: cannot get the parser of cifar10_estimator.cifar10: "
        "cifar10_estimator.cifar10 has no build_parser() to ask for its flags",
    ]


def test_the_readme_shows_the_test_command_ci_runs():
    assert "bash scripts/test.sh" in [line.strip() for line in read(".ci/run")]
    readme_code = [text.split("#")[0].strip() for _, text in snippets("README.md")]
    assert "bash scripts/test.sh" in readme_code


def flag_table(page=FLAG_TABLE_PAGE):
    """The lines between the flag table's markers on `page`, blank lines at either end
    left out."""
    lines = read(page)
    begin = next(index for index, line in enumerate(lines) if line.startswith(FLAG_TABLE_BEGIN))
    end = lines.index(FLAG_TABLE_END, begin)
    return "\n".join(lines[begin + 1:end]).strip("\n").split("\n")


def test_the_flag_table_is_the_one_the_declarations_generate():
    from cifar10_estimator import flags
    shown, generated = flag_table(), flags.markdown_table().split("\n")
    difference = "\n".join(difflib.unified_diff(shown, generated, FLAG_TABLE_PAGE, "generated",
                                                lineterm=""))
    assert shown == generated, (
        "the flag table of %s is stale: replace the lines between its markers with the "
        "output of `python -m cifar10_estimator.flags --markdown`\n%s"
        % (FLAG_TABLE_PAGE, difference))


def test_the_command_the_stale_table_names_prints_the_table():
    from cli_helpers import run_module
    result = run_module("cifar10_estimator.flags", ["--markdown"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n").split("\n") == flag_table()


def test_the_flag_table_lists_every_trainer_flag_and_no_other():
    page = FLAG_TABLE_PAGE
    trainer_flags = options_of(TRAINER) - {"-h", "--help"}
    rows = [(number, row.group(1)) for number, line in enumerate(read(page), 1)
            for row in [re.match(r"\|\s*`(--[\w-]+)[^`]*`\s*\|", line)] if row]
    listed = {flag for _, flag in rows}
    problems = ["%s:%d: the flag table lists %s, which the trainer does not take"
                % (page, number, flag) for number, flag in rows if flag not in trainer_flags]
    problems += ["%s: the flag table lacks the trainer's %s" % (page, flag)
                 for flag in sorted(trainer_flags - listed)]
    assert not problems, "\n".join(problems)
