"""Alternating rounds: every contender is measured once a round, in an order that reverses
from one round to the next, and each gets its median and spread."""

import time

from cifar10_estimator.machine import alternating_rounds


def timed(function):
    """A contender: the seconds one call of function takes."""
    def measure():
        start = time.perf_counter()
        function()
        return time.perf_counter() - start
    return measure


def test_real_contenders_take_turns_in_alternating_order_and_get_sane_medians():
    calls = []

    def sleeper():
        calls.append("sleep")
        time.sleep(0.02)

    def counter():
        calls.append("count")
        sum(range(1000))

    reported = []
    results = alternating_rounds.measure(
        {"sleep": timed(sleeper), "count": timed(counter)}, num_rounds=4,
        report=lambda round_index, name, seconds: reported.append((round_index, name)))

    assert calls == ["sleep", "count", "count", "sleep", "sleep", "count", "count", "sleep"]
    assert reported == [(0, "sleep"), (0, "count"), (1, "count"), (1, "sleep"),
                        (2, "sleep"), (2, "count"), (3, "count"), (3, "sleep")]
    assert list(results) == ["sleep", "count"]
    sleep = results["sleep"]
    assert len(sleep.measurements) == 4
    # A sleep lasts at least what it was asked for; the median is one of the middle two.
    assert sleep.median() >= 0.02
    assert min(sleep.measurements) <= sleep.median() <= max(sleep.measurements)
    assert sleep.spread() == max(sleep.measurements) - min(sleep.measurements) >= 0
    assert results["count"].median() > 0


def test_three_contenders_reverse_each_round_and_rounds_are_reported_whole():
    calls = []
    contenders = {name: (lambda name=name: calls.append(name) or len(calls))
                  for name in ("a", "b", "c")}
    rounds = []
    results = alternating_rounds.measure(
        contenders, num_rounds=3,
        report_round=lambda round_index, measured: rounds.append((round_index, measured)))

    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert rounds == [(0, {"a": 1, "b": 2, "c": 3}), (1, {"a": 6, "b": 5, "c": 4}),
                      (2, {"a": 7, "b": 8, "c": 9})]
    assert list(rounds[1][1]) == ["a", "b", "c"]
    assert results["b"].measurements == [2, 5, 8]
    assert (results["b"].median(), results["b"].spread()) == (5, 6)
    assert results["a"].median(lambda value: -value) == -6


def test_one_round_takes_the_given_order():
    assert alternating_rounds.round_order(["x", "y"], 0) == ["x", "y"]
    assert alternating_rounds.round_order(["x", "y"], 1) == ["y", "x"]
