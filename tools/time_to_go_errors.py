"""How close a finished run's time to go came, from its log.

    python -m tools.time_to_go_errors JOB [JOB ...]
        [--at 20 50 70 90]

For each percentage of the steps, the first progress line at or past it in JOB/train.log
(`step G/LAST (P %), R examples/sec, about T to go`, or `at most T`): T, against the time
that remained from that line's time to the time of the `Test accuracy` line, and T's
error. Then each image-size phase's steps: the median rate of its first minute and of
the rest, from the lines ExamplesPerSecondHook logs every 10 steps (a new image size
that starts slowly shows there). A log appended to by a resumed run is read from its
last start.
"""

import dataclasses
import datetime
import os
import re
import statistics

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import (ArgumentParser, add_options, option, option_fields,
                                           parse, positive_int)
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.run import console
from cifar10_estimator.settings import schedule

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+:tensorflow:(.*)$")
PROGRESS = re.compile(r"^step (\d+)/(\d+) \(\d+ %\), [\d.]+ examples/sec, "
                      r"((?:about|at most) .+) to go$")
EXAMPLES_PER_SEC = re.compile(r"^Average examples/sec: [\d.]+ \(([\d.]+)\), step = (\d+)$")
# The schedule's line (main.log_schedule) starts each run of the trainer in the log.
RUN_START = "Training to step "
END = "Test accuracy: "
# A phase's first this many seconds, told apart from the rest of its steps.
FIRST_SECS = 60


@dataclasses.dataclass(frozen=True)
class TimeToGoOptions:
    """The command line: the jobs, and where in their steps to compare."""

    job_dirs: list = option(None, "Job dirs of finished runs.", positional=True,
                                nargs="+")
    at: list = option([20, 50, 70, 90], "Percentages of the steps to compare at.",
                          nargs="+", type=positive_int, metavar="PERCENT")


def build_parser():
    parser = ArgumentParser(
        description="What a finished run's progress lines said was left, against what was.")
    add_options(parser, option_fields(TimeToGoOptions))
    return parser


def read_log(job_dir):
    """[(seconds since the run's first line, message)] of the last run in JOB/train.log."""
    path = os.path.join(job_dir, console.log_file_name())
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            lines = [match.groups() for match in map(LOG_LINE.match, stream) if match]
    except OSError as error:
        raise Cifar10EstimatorError("cannot read %s (%s)" % (path, error.strerror or error))
    starts = [index for index, (_, message) in enumerate(lines) if RUN_START in message]
    lines = lines[starts[-1] if starts else 0:]
    if not lines:
        raise Cifar10EstimatorError("%s holds no log lines" % path)
    times = [datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f") for stamp, _ in lines]
    return [((time - times[0]).total_seconds(), message.rstrip("\n"))
            for time, (_, message) in zip(times, lines)]


def duration_secs(text):
    """The seconds of a duration as the progress line says it ('about 4 min 30 s': 270;
    'at most 4 min 30 s' too)."""
    words = re.sub(r"^(?:about|at most) ", "", text).split()
    units = {"h": 3600, "min": 60, "s": 1}
    if len(words) % 2 or not all(unit in units for unit in words[1::2]):
        raise ValueError("not a duration: %r" % text)
    return sum(int(number) * units[unit] for number, unit in zip(words[::2], words[1::2]))


def errors_at(log, percentages):
    """[(percent, global step, what it said, secs said, secs that remained)] of a log
    (read_log's)."""
    ends = [secs for secs, message in log if message.startswith(END)]
    if not ends:
        raise Cifar10EstimatorError("the run has no '%s' line: it did not finish" % END.strip())
    progress = [(secs, int(match.group(1)), int(match.group(2)), match.group(3))
                for secs, match in ((secs, PROGRESS.match(message)) for secs, message in log)
                if match]
    rows = []
    for percent in percentages:
        reached = [line for line in progress if line[1] >= percent / 100 * line[2]]
        if reached:
            secs, step, _, said = reached[0]
            rows.append((percent, step, said, duration_secs(said),
                         ends[-1] - secs))
    return rows


def phase_rates(log, hparams):
    """[(side, first minute's median examples/sec, the rest's or None)] of each image-size
    phase (the hook counts steps from the run's start: a run from step 0 on one machine)."""
    ends = schedule.resolution_phases(hparams) + [(cifar10_facts.HEIGHT,
                                                   schedule.last_step(hparams))]
    rates = [(secs, float(match.group(1)), int(match.group(2)))
             for secs, match in ((secs, EXAMPLES_PER_SEC.match(message)) for secs, message in log)
             if match]
    rows, start = [], 0
    for side, end in ends:
        phase = [(secs, rate) for secs, rate, step in rates if start <= step < end]
        start = end
        if not phase:
            continue
        first = [rate for secs, rate in phase if secs < phase[0][0] + FIRST_SECS]
        rest = [rate for secs, rate in phase if secs >= phase[0][0] + FIRST_SECS]
        rows.append((side, statistics.median(first),
                     statistics.median(rest) if rest else None))
    return rows


def report(job_dir, percentages):
    """The lines the command prints for one job."""
    log = read_log(job_dir)
    hparams = job_hparams.load(job_dir)
    lines = ["%s (recipe %s):" % (job_dir, hparams.recipe)]
    for percent, step, said, said_secs, remaining_secs in errors_at(log, percentages):
        lines.append("  %d %% (step %d): said %s, %.0f s remained (%+.0f %%)" % (
            percent, step, said, remaining_secs, 100 * (said_secs / remaining_secs - 1)))
    for side, first, rest in phase_rates(log, hparams):
        lines.append("  %d-pixel steps: %.0f examples/sec in their first minute, %s after" % (
            side, first, "-" if rest is None else "%.0f" % rest))
    return lines


def main(argv):
    args = parse(build_parser(), TimeToGoOptions, argv)
    for job_dir in args.job_dirs:
        print("\n".join(report(job_dir, args.at)))


def console_main():
    raise SystemExit(run_command(main))


if __name__ == "__main__":
    console_main()
