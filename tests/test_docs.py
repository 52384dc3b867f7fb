"""The README and the manual in docs/ show commands the code takes and links that resolve.

Every `python -m cifar10_estimator.X ...` or `tools.X ...` command on a page (in a code
block or inline code, continued over lines with a trailing backslash) must name a module
that exists and only flags that module's own parser declares; the trainer flags after `--`
of the local cluster launcher and of scripts/setup_and_run.sh must be the trainer's. The
default trainer command lines of setup_and_run.sh must be the trainer's flags too. Every
relative link must name a file that exists and every #anchor a heading of that file. The
flag table of docs/training.md must be the one the options' declarations generate.

The figures stay honest: every accuracy, time, count of runs and training FLOPs of the
README's results table is in docs/accuracy.md's summary table, in a row of the same command
and data (and CPU, for a time); each row of both tables prints the training TFLOP the
trainer counts for its command and number of training images; a CPU named beside a
measured figure carries its cpu family and model (and an Intel Xeon 6/207, whether it has
AMX); no page speaks of the sessions that made its figures ("this stop", "today's
recipe"); the accuracy page opens with its summary and stays short; each page of the
manual opens with what to run. Every container build shown finds its file under Docker
and Podman alike, and every `kubectl apply -f` names a file of the checkout.
"""

import csv
import dataclasses
import difflib
import functools
import glob
import importlib
import importlib.util
import os
import re
import shlex
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

COMMAND = re.compile(r"(?:-m\s+((?:cifar10_estimator|tools)(?:\.\w+)*)"
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


# `docker build` (and Podman's, Buildah's) and `kubectl apply` run from the checkout's top.
CONTAINER_BUILD = re.compile(r"\b(?:docker|podman) +build\b|\bbuildah +(?:build|bud)\b")
KUBECTL_APPLY = re.compile(r"\bkubectl +apply\b")


def shell_commands(pattern):
    """(page, line, [tokens]) of each command a pattern starts on any page, comments aside."""
    for page in PAGES:
        for line, text in snippets(page):
            for found in pattern.finditer(text):
                if "#" in text[:found.start()].rsplit("\n", 1)[-1]:
                    continue  # in a comment: named, not run
                tokens = []
                for word in text[found.end():].split():
                    if word in SHELL_SEPARATORS or word.startswith("#"):
                        break
                    tokens.append(word)
                if tokens:
                    yield page, line + text.count("\n", 0, found.start()), tokens


def option_values(tokens, names):
    return [tokens[index + 1] for index, token in enumerate(tokens[:-1]) if token in names]


def build_file_problem(tokens):
    """What keeps Docker or Podman from finding a build's file, or None."""
    context = tokens[-1]
    named = option_values(tokens, ("-f", "--file"))
    if named:
        return None if os.path.isfile(os.path.join(REPO_ROOT, named[0])) else (
            "-f %s: no such file" % named[0])
    # Docker reads only CONTEXT/Dockerfile; Podman and Buildah read a Containerfile first.
    if not os.path.isfile(os.path.join(REPO_ROOT, context, "Dockerfile")):
        return "%s has no Dockerfile, the only file Docker reads without -f" % context
    if os.path.exists(os.path.join(REPO_ROOT, context, "Containerfile")):
        return "%s has a Containerfile, which Podman would build instead of its Dockerfile" % (
            context)
    return None


def test_every_container_build_shown_finds_its_file_under_docker_and_podman():
    builds = list(shell_commands(CONTAINER_BUILD))
    assert any(page == "README.md" for page, _, _ in builds)
    problems = ["%s:%d: %s" % (page, line, build_file_problem(tokens))
                for page, line, tokens in builds if build_file_problem(tokens)]
    assert not problems, "\n".join(problems)


def test_every_kubectl_apply_shown_names_a_file_of_the_checkout():
    applies = list(shell_commands(KUBECTL_APPLY))
    assert any(page == "README.md" for page, _, _ in applies)
    problems = ["%s:%d: kubectl apply -f %s: no such file" % (page, line, path)
                for page, line, tokens in applies
                for path in option_values(tokens, ("-f", "--filename"))
                if not os.path.isfile(os.path.join(REPO_ROOT, path))]
    assert not problems, "\n".join(problems)


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


# The README's results table and the manual's summary of every recipe's runs, each between
# its markers: each cell of either is what docs/runs.csv gives (RUNS_FILE below).
RESULTS_PAGE, SUMMARY_PAGE = "README.md", "docs/accuracy.md"
RESULTS_BEGIN, RESULTS_END = "<!-- The results table:", "<!-- End of the results table. -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- The summary table:", "<!-- End of the summary table. -->"
SUMMARY_MAX_LINES = 300
# Any number with a unit of what was measured: where a CPU is named beside one, it is a
# figure measured on that CPU.
MEASURED = re.compile(r"\d(?:[\d.,]*\d)?\s*(?:%|×|x\b|times\b|s\b|ms\b|min\b|h\b|hours?\b|minutes?\b|"
                      r"examples/sec|images/s|[GT]FLOP)")
# The CPUs the pages name, and how a page must name each beside a figure: by the family and
# model /proc/cpuinfo gives ("25/17", or "cpu family 25, model 17"; "model not recorded" for
# the few early figures whose notes kept the family alone).
CPU_KINDS = {
    "Zen 3": r"\b25/1\b|family\s+25,\s+model\s+1\b",
    "Zen 4": r"\b25/17\b|family\s+25,\s+model\s+(?:17\b|not\s+recorded)",
    "Zen 5": r"\b26/2\b|family\s+26,\s+model\s+(?:2\b|not\s+recorded)",
    "Xeon": r"\b6/(?:207|167)\b|family\s+6,\s+model\s+(?:207|167)\b",
    "EPYC": r"\b25/1\b|\b25/17\b|\b26/2\b|family\s+2[56],\s+model\s+(?:\d+\b|not\s+recorded)",
}
# Two Intel Xeon machines share family 6, model 207, one with AMX and one without:
# a figure of either says which.
XEON_6_207 = re.compile(r"\b6/207\b|family\s+6,\s+model\s+207\b")
# Units the CPU check leaves alone, each with the reason. The README's install and
# one-command sections are rewritten by issue 56 (in progress beside this check); once its
# text lands, the paragraph below no longer matches and the check reads the new one.
CPU_CHECK_EXEMPT = {
    ("README.md", "on a 2-core\n  Zen 4 it reaches the paper's schedule's accuracy"),
}
# Words of the work's sessions, which the manual does not speak in (TensorFlow's sessions and
# "runs today" are the manual's own words).
WORKSHOP_WORDS = re.compile(
    r"\b(?:this|previous|next|last|first|second|third|earlier) stop\b"
    r"|\bstops? (?:before|of that day)\b|\btoday's\b|\bthis session\b|\bthe day before\b"
    r"|\byesterday\b|\bnot to be had\b|\b[a-z]+\d+[a-z]+\d+-s\d+\b", re.I)


def marked_table(page, begin, end):
    """(line number, cells) of each row of the table between a page's markers, header first."""
    lines = read(page)
    first = next(index for index, line in enumerate(lines) if line.startswith(begin))
    last = lines.index(end, first)
    return [(index + 1, [cell.strip() for cell in lines[index].strip().strip("|").split("|")])
            for index in range(first + 1, last)
            if lines[index].startswith("|") and not re.match(r"\|\s*-", lines[index])]


def command_key(cells):
    """A row's command: the code of its first cell and the data directory it names."""
    command = re.search(r"`([^`]+)`", cells[0])
    data = re.search(r"`(data[\w-]*/?)", " ".join(cells))
    return (command.group(1) if command else cells[0], data.group(1) if data else None)


def cpu_of(text):
    """The family/model a header or cell names ('25/17'), or None."""
    found = re.search(r"\b(\d+)/(\d+)\b", text)
    return found.group() if found else None


# The file of every run the manual reports, a row each: the README's results table and the
# accuracy page's summary are derived from it, cell for cell.
RUNS_FILE = "docs/runs.csv"
RUN_FIELDS = ["recipe", "variant", "command", "cpu", "precision", "data", "training_images",
              "seed", "test_accuracy", "validation_accuracy", "tflop", "wall_time_s", "timing",
              "date", "commit", "screen", "note"]
# A run's timing: only a run timed alone on its machine gives a table its time.
ALONE = "alone"
TIMINGS = {ALONE, "alone (stock kernels)", "shared", "paused", ""}
# The summary's row of every CPU's runs of one command.
ALL_CPUS = "all CPUs"
SUMMARY_COLUMNS = ["command", "training images", "CPU", "precision",
                   "test accuracy: mean (lowest–highest), runs", "validation accuracy: mean, runs",
                   "time alone: mean (fastest – slowest), runs", "training", "dates"]
RESULTS_COLUMNS = ["recipe", "what it trains", "test accuracy: mean (lowest–highest), runs",
                   "training"]
# The README's advice for half an hour names the recipe of the most accuracy whose mean time
# alone is within it on some CPU of the results table; the one command's line names it too.
HALF_AN_HOUR_SECS = 1800
HALF_AN_HOUR_ADVICE = re.compile(r"most\s+accuracy\s+in\s+half\s+an\s+hour\b.*?--recipe\s+(\w+)",
                                 re.S)


def read_runs():
    with open(os.path.join(REPO_ROOT, RUNS_FILE), encoding="utf-8", newline="") as stream:
        return list(csv.DictReader(stream))


def table_command(run):
    """How the tables name a run's command: `--recipe NAME [VARIANT]`, or the one command."""
    if run["command"].startswith("bash "):
        return run["command"]
    return " ".join(["--recipe", run["recipe"]] + ([run["variant"]] if run["variant"] else []))


def duration_text(secs):
    """'1 h 51 min', '9 min 43 s' or '45 s'."""
    secs = int(round(secs))
    if secs >= 3600:
        return "%d h %d min" % (secs // 3600, round(secs % 3600 / 60))
    return "%d min %d s" % divmod(secs, 60) if secs >= 60 else "%d s" % secs


def runs_text(count):
    return "%d run%s" % (count, "" if count == 1 else "s")


def accuracy_text(values):
    """'87.04 % (86.64–87.42 %), 24 runs': the mean, the lowest and highest, how many."""
    if not values:
        return ""
    text = "%.2f %%" % (sum(values) / len(values))
    if len(values) > 1:
        text += " (%.2f–%.2f %%)" % (min(values), max(values))
    return "%s, %s" % (text, runs_text(len(values)))


def alone_times(runs):
    """The wall times, in seconds, of the runs timed alone on their machine."""
    return [float(run["wall_time_s"]) for run in runs
            if run["timing"] == ALONE and run["wall_time_s"]]


def time_text(secs):
    """'5 min 5 s (4 min 41 s – 5 min 27 s), 8 runs': the mean, the fastest and slowest."""
    if not secs:
        return ""
    text = duration_text(sum(secs) / len(secs))
    if len(secs) > 1:
        text += " (%s – %s)" % (duration_text(min(secs)), duration_text(max(secs)))
    return "%s, %s" % (text, runs_text(len(secs)))


def figures(runs, field):
    return [float(run[field]) for run in runs if run[field]]


def summary_cells(runs):
    """The summary's cells of a group of runs, by column, but the three that name it."""
    dates = sorted({run["date"] for run in runs})
    return {
        "precision": ", ".join(sorted({run["precision"] for run in runs})),
        SUMMARY_COLUMNS[4]: accuracy_text(figures(runs, "test_accuracy")),
        SUMMARY_COLUMNS[5]: accuracy_text(figures(runs, "validation_accuracy")),
        SUMMARY_COLUMNS[6]: time_text(alone_times(runs)),
        "training": ", ".join("%s TFLOP" % tflop for tflop in sorted({run["tflop"] for run in runs})),
        "dates": " – ".join(sorted({dates[0], dates[-1]})),
    }


def first_code(cell):
    found = re.search(r"`([^`]+)`", cell)
    return found.group(1) if found else cell


def images_of(cell):
    found = TRAINING_IMAGES.search(cell)
    return int(found.group(1)) if found else None


def summary_problems(table, runs):
    """Where the accuracy page's summary (marked_table's rows, header first) is not what
    runs.csv gives, one line each; and the recipes' runs it leaves out."""
    header = table[0][1]
    if header != SUMMARY_COLUMNS:
        return ["%s:%d: the summary's columns are %s, not %s"
                % (SUMMARY_PAGE, table[0][0], header, SUMMARY_COLUMNS)]
    problems, shown = [], set()
    for number, cells in table[1:]:
        row = dict(zip(header, cells))
        command, images, cpu = first_code(row["command"]), images_of(row["training images"]), row["CPU"]
        shown.add((command, images, cpu))
        group = [run for run in runs if table_command(run) == command
                 and int(run["training_images"]) == images and cpu in (ALL_CPUS, run["cpu"])]
        if not group:
            problems.append("%s:%d: %s on %s images (%s) has no run in %s"
                            % (SUMMARY_PAGE, number, command, images, cpu, RUNS_FILE))
            continue
        expected = summary_cells(group)
        if cpu == ALL_CPUS:
            expected[SUMMARY_COLUMNS[6]] = ""  # a mean of different CPUs' times says nothing
        problems += ["%s:%d: %s on %s images (%s): %s is %r; %s gives %r"
                     % (SUMMARY_PAGE, number, command, images, cpu, column, row[column],
                        RUNS_FILE, text)
                     for column, text in expected.items() if row[column] != text]
    recipe_runs = [run for run in runs if run["recipe"] and not run["variant"]]
    for command, images in sorted({(table_command(run), int(run["training_images"]))
                                   for run in recipe_runs}):
        cpus = {run["cpu"] for run in recipe_runs
                if (table_command(run), int(run["training_images"])) == (command, images)}
        problems += ["%s: the summary has no row of %s on %s images (%s), which %s holds"
                     % (SUMMARY_PAGE, command, images, cpu, RUNS_FILE)
                     for cpu in sorted(cpus | ({ALL_CPUS} if len(cpus) > 1 else set()))
                     if (command, images, cpu) not in shown]
    return problems


def results_problems(table, runs):
    """Where the README's results table (a row per recipe; after RESULTS_COLUMNS a column per
    CPU, its mean time alone) is not what runs.csv gives, one line each."""
    header = table[0][1]
    if header[:len(RESULTS_COLUMNS)] != RESULTS_COLUMNS:
        return ["%s:%d: the results' first columns are %s, not %s"
                % (RESULTS_PAGE, table[0][0], header[:len(RESULTS_COLUMNS)], RESULTS_COLUMNS)]
    cpus = header[len(RESULTS_COLUMNS):]
    problems = []
    for number, cells in table[1:]:
        row = dict(zip(header, cells))
        command, images = first_code(row["recipe"]), images_of(row["what it trains"])
        group = [run for run in runs
                 if table_command(run) == command and int(run["training_images"]) == images]
        expected = {RESULTS_COLUMNS[2]: summary_cells(group)[SUMMARY_COLUMNS[4]] if group else "",
                    "training": summary_cells(group)["training"] if group else ""}
        for cpu in cpus:
            secs = alone_times([run for run in group if run["cpu"] == cpu])
            expected[cpu] = duration_text(sum(secs) / len(secs)) if secs else ""
        problems += ["%s:%d: %s on %s images: %s is %r; %s gives %r"
                     % (RESULTS_PAGE, number, command, images, column, row[column], RUNS_FILE, text)
                     for column, text in expected.items() if row[column] != text]
        problems += ["%s:%d: %s on %s images has runs timed alone on %s, which has no column"
                     % (RESULTS_PAGE, number, command, images, cpu)
                     for cpu in sorted({run["cpu"] for run in group if alone_times([run])} - set(cpus))]
    return problems


def half_an_hour_recipe(table, runs):
    """The recipe of the README's results that trains most accurately within half an hour
    alone on one of the table's CPUs."""
    header = table[0][1]
    best = None
    for _, cells in table[1:]:
        row = dict(zip(header, cells))
        command, images = first_code(row["recipe"]), images_of(row["what it trains"])
        group = [run for run in runs
                 if table_command(run) == command and int(run["training_images"]) == images]
        fastest = min((sum(secs) / len(secs) for cpu in header[len(RESULTS_COLUMNS):]
                       for secs in [alone_times([run for run in group if run["cpu"] == cpu])]
                       if secs), default=None)
        accuracy = figures(group, "test_accuracy")
        # A row with flags after the recipe's name is not what the recipe trains now.
        named_alone = len(command.split()) == 2
        if named_alone and fastest is not None and fastest <= HALF_AN_HOUR_SECS and accuracy:
            mean = sum(accuracy) / len(accuracy)
            if best is None or mean > best[0]:
                best = (mean, command.split()[1])
    return best[1] if best else None


def test_the_readmes_results_have_a_row_per_recipe():
    # A row with flags after the name is the recipe as it was before a change (the sprint
    # recipe before it took Muon), kept right below the recipe's row for its times.
    from cifar10_estimator.settings import recipes
    named = [re.fullmatch(r"--recipe (\w+)( --.+)?", command_key(cells)[0])
             for _, cells in marked_table(RESULTS_PAGE, RESULTS_BEGIN, RESULTS_END)[1:]]
    assert all(named), "each row of the README's results is `--recipe NAME [FLAGS]`"
    names = [match.group(1) for match in named if not match.group(2)]
    assert len(names) == len(set(names)) and set(names) <= set(recipes.RECIPES), names
    assert all(below.group(1) == above.group(1) for above, below in zip(named, named[1:])
               if below.group(2)), "a row with flags is not right below its recipe's row"


# How a row says how many images its command trains on: the README's "on all 50000
# training images" or "on 45000", the summary's "`data-45k`: 45000".
TRAINING_IMAGES = re.compile(r"(?:\bon (?:all )?|`: )(\d{4,})\b")
TFLOP_FIGURE = re.compile(r"(\d+(?:\.(\d+))?) TFLOP\b")


def counted_tflop(trainer_flags, images, decimals):
    """The training TFLOP the trainer's plan line (compute_accounting.training_compute)
    counts for `trainer_flags` on `images` training images, with `decimals` decimals."""
    from cifar10_estimator import compute_accounting
    from cifar10_estimator import flags
    hparams = dataclasses.replace(
        flags.parse(shlex.split(trainer_flags) + ["--job-dir", "unused"]).hparams,
        num_train_examples=images)
    return "%.*f" % (decimals, compute_accounting.training_compute(hparams).flops() / 1e12)


def tflop_problems(page, table):
    """Where a row of a results table (marked_table's rows, header first) prints a training
    TFLOP other than the trainer's count for its command, at the precision printed: the
    plan line's (compute_accounting.training_compute) for the row's trainer flags (the code
    spans of its first cell that start with --) on the images it says it trains on."""
    problems = []
    for number, cells in table[1:]:
        row = " | ".join(cells)
        trainer_flags = " ".join(code for code in re.findall(r"`([^`]+)`", cells[0])
                                 if code.startswith("--"))
        images, figure = TRAINING_IMAGES.search(row), TFLOP_FIGURE.search(row)
        if not (trainer_flags and images and figure):
            problems.append("%s:%d: a row without its trainer flags, its number of training "
                            "images or its TFLOP: %s" % (page, number, row))
            continue
        counted = counted_tflop(trainer_flags, int(images.group(1)), len(figure.group(2) or ""))
        if counted != figure.group(1):
            problems.append("%s:%d: %s on %s images prints %s TFLOP; the trainer counts %s"
                            % (page, number, trainer_flags, images.group(1), figure.group(1),
                               counted))
    return problems


def trainer_flags_of(command):
    """The trainer flags a command of runs.csv runs: those after cifar10_estimator.main, or
    for the one command, the recipe setup_and_run.sh gives the trainer without a GPU."""
    if command.startswith("bash " + SETUP_AND_RUN):
        return next(found.group(1) for line in read(SETUP_AND_RUN)
                    for found in [re.match(r"\s*set -- (--num-gpus 0 --recipe \w+)\s*$", line)]
                    if found)
    words = shlex.split(command)
    return " ".join(words[words.index(TRAINER) + 1:])


@pytest.mark.parametrize("page, begin, end", [(RESULTS_PAGE, RESULTS_BEGIN, RESULTS_END),
                                              (SUMMARY_PAGE, SUMMARY_BEGIN, SUMMARY_END)],
                         ids=["results", "summary"])
def test_each_results_row_prints_the_tflop_the_trainer_counts_for_its_command(page, begin, end):
    problems = tflop_problems(page, marked_table(page, begin, end))
    assert not problems, "\n".join(problems)


def test_the_tflop_check_reads_each_rows_command_and_images():
    header = (1, ["command", "what it trains", "training"])
    assert tflop_problems("page.md", [
        header,
        (2, ["`--recipe paper`", "ResNet-20 on 45000, `data-45k`", "2011.1 TFLOP"]),
        (3, ["`bash scripts/setup_and_run.sh` (`--recipe quick`)", "`data/`: 40000",
             "94.7 TFLOP"]),
        (4, ["`--recipe budget --num-layers 56`", "`data-45k`: 45000", "1019 TFLOP"]),
        (5, ["`--recipe sprint`", "ResNet-14", "95.4 TFLOP"]),
    ]) == [
        "page.md:2: --recipe paper on 45000 images prints 2011.1 TFLOP; the trainer counts "
        "2008.4",
        "page.md:5: a row without its trainer flags, its number of training images or its "
        "TFLOP: `--recipe sprint` | ResNet-14 | 95.4 TFLOP",
    ]


def test_the_runs_file_holds_one_run_a_row():
    with open(os.path.join(REPO_ROOT, RUNS_FILE), encoding="utf-8", newline="") as stream:
        assert next(csv.reader(stream)) == RUN_FIELDS
    problems = []
    for number, run in enumerate(read_runs(), 2):
        where = "%s:%d" % (RUNS_FILE, number)
        problems += ["%s: %s %r is not a percentage" % (where, field, run[field])
                     for field in ("test_accuracy", "validation_accuracy")
                     if run[field] and not 0 < float(run[field]) <= 100]
        if not (run["test_accuracy"] or run["validation_accuracy"]):
            problems.append("%s: a run without an accuracy" % where)
        if run["timing"] not in TIMINGS or (run["timing"] == ALONE and not run["wall_time_s"]):
            problems.append("%s: timing %r (wall time %r)" % (where, run["timing"],
                                                              run["wall_time_s"]))
        if not re.fullmatch(r"20\d\d-\d\d-\d\d", run["date"]):
            problems.append("%s: date %r" % (where, run["date"]))
        if not re.search(r"\b\d+/\d+\b", run["cpu"]):
            problems.append("%s: CPU %r without its family/model" % (where, run["cpu"]))
        if not (run["command"].startswith("python -m " + TRAINER + " ")
                or run["command"] == "bash " + SETUP_AND_RUN):
            problems.append("%s: %r is neither the trainer nor the one command" % (
                where, run["command"]))
    assert not problems, "\n".join(problems)


def test_each_run_of_the_runs_file_prints_the_tflop_the_trainer_counts_for_its_command():
    counted = {}
    problems = []
    for number, run in enumerate(read_runs(), 2):
        key = (trainer_flags_of(run["command"]), int(run["training_images"]))
        if key not in counted:
            counted[key] = counted_tflop(*key, decimals=1)
        if run["tflop"] != counted[key]:
            problems.append("%s:%d: %s on %s images: %s TFLOP; the trainer counts %s"
                            % (RUNS_FILE, number, key[0], key[1], run["tflop"], counted[key]))
    assert not problems, "\n".join(problems)


def test_the_accuracy_pages_summary_is_what_the_runs_file_gives():
    problems = summary_problems(marked_table(SUMMARY_PAGE, SUMMARY_BEGIN, SUMMARY_END),
                                read_runs())
    assert not problems, "\n".join(problems)


def test_the_readmes_results_are_what_the_runs_file_gives():
    problems = results_problems(marked_table(RESULTS_PAGE, RESULTS_BEGIN, RESULTS_END),
                                read_runs())
    assert not problems, "\n".join(problems)


def test_the_half_an_hour_advice_names_the_recipe_that_gives_most_in_it():
    recipe = half_an_hour_recipe(marked_table(RESULTS_PAGE, RESULTS_BEGIN, RESULTS_END),
                                 read_runs())
    assert recipe
    for page in (RESULTS_PAGE, SETUP_AND_RUN):
        advice = HALF_AN_HOUR_ADVICE.search("\n".join(read(page)))
        assert advice, "%s gives no advice for half an hour" % page
        assert advice.group(1) == recipe, "%s advises --recipe %s for half an hour; %s gives " \
            "--recipe %s" % (page, advice.group(1), RUNS_FILE, recipe)


def test_the_table_checks_see_what_they_are_for(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    fields = ["recipe", "command", "cpu", "precision", "training_images", "test_accuracy",
              "validation_accuracy", "tflop", "wall_time_s", "timing", "date"]
    rows = [
        ["sprint", "python -m %s --recipe sprint" % TRAINER, "AMD EPYC 26/2", "bf16", "50000",
         "87.00", "", "93.8", "300", ALONE, "2026-11-27"],
        ["sprint", "python -m %s --recipe sprint" % TRAINER, "AMD EPYC 26/2", "bf16", "50000",
         "87.20", "", "93.8", "400", "shared", "2026-11-28"],
        ["sprint", "python -m %s --recipe sprint" % TRAINER, "AMD EPYC 25/17", "bf16", "50000",
         "86.90", "", "93.8", "540", ALONE, "2026-11-28"],
    ]
    with open(tmp_path / RUNS_FILE, "w", encoding="utf-8", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(fields + ["variant"])
        writer.writerows(row + [""] for row in rows)
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", str(tmp_path))
    runs = read_runs()
    summary = [(1, SUMMARY_COLUMNS),
               (2, ["`--recipe sprint`", "`data-50k`: 50000", "AMD EPYC 26/2", "bf16",
                    "87.10 % (87.00–87.20 %), 2 runs", "", "5 min 0 s, 1 run", "93.8 TFLOP",
                    "2026-11-27 – 2026-11-28"]),
               (3, ["`--recipe sprint`", "`data-50k`: 50000", "AMD EPYC 25/17", "bf16",
                    "86.90 %, 1 run", "", "9 min 0 s, 1 run", "93.8 TFLOP", "2026-11-28"])]
    assert summary_problems(summary, runs) == [
        "docs/accuracy.md: the summary has no row of --recipe sprint on 50000 images "
        "(all CPUs), which docs/runs.csv holds"]
    summary[2][1][4] = "86.90 % (86.90–86.90 %), 2 runs"
    summary[1][1][6] = "5 min 50 s (5 min 0 s – 6 min 40 s), 2 runs"
    assert summary_problems(summary, runs)[:2] == [
        "docs/accuracy.md:2: --recipe sprint on 50000 images (AMD EPYC 26/2): time alone: "
        "mean (fastest – slowest), runs is '5 min 50 s (5 min 0 s – 6 min 40 s), 2 runs'; "
        "docs/runs.csv gives '5 min 0 s, 1 run'",
        "docs/accuracy.md:3: --recipe sprint on 50000 images (AMD EPYC 25/17): test accuracy: "
        "mean (lowest–highest), runs is '86.90 % (86.90–86.90 %), 2 runs'; docs/runs.csv "
        "gives '86.90 %, 1 run'"]
    results = [(1, RESULTS_COLUMNS + ["AMD EPYC 26/2"]),
               (2, ["`--recipe sprint`", "ResNet-14 on all 50000", "87.03 % (86.90–87.20 %), "
                    "3 runs", "93.8 TFLOP", "5 min 50 s"])]
    assert results_problems(results, runs) == [
        "README.md:2: --recipe sprint on 50000 images: AMD EPYC 26/2 is '5 min 50 s'; "
        "docs/runs.csv gives '5 min 0 s'",
        "README.md:2: --recipe sprint on 50000 images has runs timed alone on AMD EPYC 25/17, "
        "which has no column"]
    assert half_an_hour_recipe(results, runs) == "sprint"


def test_the_accuracy_page_opens_with_its_summary_and_stays_short():
    lines = read(SUMMARY_PAGE)
    headings = [line for line in lines if HEADING.match(line)]
    assert headings[1] == "## The summary", headings[:2]
    first = next(index for index, line in enumerate(lines) if line.startswith(SUMMARY_BEGIN))
    assert lines.index(headings[1]) < first < lines.index(headings[2])
    assert len(lines) <= SUMMARY_MAX_LINES + 1, (
        "%s has %d lines: screens and notes belong on docs/screens.md"
        % (SUMMARY_PAGE, len(lines)))


def units(page):
    """(line number, text) of each paragraph, list item and table row (with its table's
    header) outside code on a page."""
    lines = read(page)
    code = code_line_numbers(lines)
    unit, start, header = [], None, None
    for index, line in enumerate(lines + [""]):
        if index in code or not line.strip() or re.match(r"\s*(?:[-*]|\d+\.)\s", line) \
                or line.startswith("|"):
            if unit:
                yield start + 1, "\n".join(unit)
            unit, start = [], None
            if line.startswith("|") and index not in code:
                if index == 0 or not lines[index - 1].startswith("|"):
                    header = line
                if not re.match(r"\|\s*-", line):
                    yield index + 1, line if line == header else header + "\n" + line
                continue
            if index in code or not line.strip():
                continue
        if start is None:
            start = index
        unit.append(line)


def cpu_naming_problems(page):
    problems = []
    for line, text in units(page):
        if not MEASURED.search(text) or any(page == exempt_page and phrase in text
                                            for exempt_page, phrase in CPU_CHECK_EXEMPT):
            continue
        for kind, family_and_model in CPU_KINDS.items():
            if re.search(r"\b%s\b" % kind, text) and not re.search(family_and_model, text):
                problems.append("%s:%d: %s beside a figure without its cpu family and model"
                                % (page, line, kind))
        if XEON_6_207.search(text) and "AMX" not in text:
            problems.append("%s:%d: an Intel Xeon 6/207 beside a figure without saying "
                            "whether it has AMX (the project measured one with, one without)"
                            % (page, line))
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_a_cpu_named_beside_a_figure_carries_its_family_and_model(page):
    problems = cpu_naming_problems(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_speak_of_results_not_of_the_sessions_that_made_them(page):
    problems = ["%s:%d: %r" % (page, number, match.group())
                for number, line in enumerate(read(page), 1)
                for match in WORKSHOP_WORDS.finditer(line)]
    assert not problems, "\n".join(problems)


def test_the_cpu_and_session_checks_see_what_they_are_for(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text(
        "| recipe | test |\n|---|---|\n| `--recipe quick` | 86.96 %, 17 runs |\n"
        "| `--recipe sprint` | 87.09 % (86.77–87.39 %) |\n\n"
        "\n\nOn a Zen 4 it took 9 min.\n\nOn the Xeon 6/207 it took 9 min."
        "\n\n- On the AMD EPYC 26/2 (Zen 5): 5 min.\n- On a Zen 5: 5 min.\n\n"
        "| CPU | time |\n|---|---|\n| Zen 4 | 3 s |\n\nThe previous stop's run.\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", str(tmp_path))
    assert cpu_naming_problems("README.md") == [
        "README.md:8: Zen 4 beside a figure without its cpu family and model",
        "README.md:10: an Intel Xeon 6/207 beside a figure without saying whether it has AMX "
        "(the project measured one with, one without)",
        "README.md:13: Zen 5 beside a figure without its cpu family and model",
        "README.md:17: Zen 4 beside a figure without its cpu family and model",
    ]
    assert [match.group() for match in WORKSHOP_WORDS.finditer(
        "The previous stop's run, this stop, today's recipe, ts2af10-s2; TensorFlow's "
        "session and the runs today are fine.")] == [
        "previous stop", "this stop", "today's", "ts2af10-s2"]


@pytest.mark.parametrize("page", [page for page in PAGES
                                  if page.startswith("docs/") and page != "docs/README.md"])
def test_each_page_of_the_manual_opens_with_what_to_run(page):
    lines = read(page)
    code = code_line_numbers(lines)
    first = next(index for index, line in enumerate(lines[1:], 1) if line.strip())
    assert first in code, "%s:%d: the page opens with prose, not with the commands it is about" % (
        page, first + 1)


# A date or a commit: the runs file and the results tables hold them, not the manual's prose.
DATE_OR_COMMIT = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
MAX_LINES = {"README.md": 130, "docs/screens.md": 200}


def dates_and_commits(page):
    """(line number, text) of each date or commit in a page's prose: code blocks, inline
    code and the marked results tables left out."""
    lines = read(page)
    code = code_line_numbers(lines)
    in_table = False
    for number, line in enumerate(lines, 1):
        if number - 1 in code:
            continue
        if line.startswith((RESULTS_BEGIN, SUMMARY_BEGIN)):
            in_table = True
        elif line in (RESULTS_END, SUMMARY_END):
            in_table = False
        if in_table:
            continue
        for found in DATE_OR_COMMIT.finditer(INLINE_CODE.sub("", line)):
            yield number, found.group()


@pytest.mark.parametrize("page", PAGES)
def test_no_date_or_commit_outside_the_runs_file_and_the_results_tables(page):
    problems = ["%s:%d: %s (runs.csv holds each run's date and commit)" % (page, number, text)
                for number, text in dates_and_commits(page)]
    assert not problems, "\n".join(problems)


def test_the_date_check_sees_dates_and_commits_but_not_code(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text(
        "Measured 2026-11-27 at commit 57910c8.\n\n    git log 57910c8\n\n"
        "Its `e564d72` is code; 1e-4, 2008.4 and decade are not commits.\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", str(tmp_path))
    assert list(dates_and_commits("page.md")) == [(1, "2026-11-27"), (1, "57910c8")]


@pytest.mark.parametrize("page", sorted(MAX_LINES))
def test_the_front_door_and_the_screens_stay_short(page):
    assert len(read(page)) <= MAX_LINES[page] + 1, "%s has %d lines, over %d" % (
        page, len(read(page)), MAX_LINES[page])
