"""What this machine's training steps and evaluations took in its newest run, kept in the
cache of machine measurements (precision_speed's file) for the next run's time to go
(training.time_to_go.Costs): how a step's cost grows with the images differs by CPU and
precision, and a run cannot see it before it reaches a size. A run of fewer sizes than
those kept keeps nothing; a missing or foreign entry is no record; one that cannot be
written costs the record only (one warning line).
"""

import logging
import os

from cifar10_estimator import files
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.machine import precision_speed
from cifar10_estimator.training import time_to_go

ENTRY = "run_costs"


def recorded():
    """The Costs the newest run on this machine kept, or None."""
    machine = precision_speed.read_cache(precision_speed.cache_path()).get(
        precision_speed.machine_key())
    try:
        entry = machine[ENTRY]
        return time_to_go.Costs(
            {int(side): float(secs) for side, secs in entry["example_secs"].items()},
            float(entry["view_secs"]) if entry.get("view_secs") else None)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def keep(costs):
    """Keep `costs` (time_to_go.Costs; None: nothing) for the next run on this machine."""
    before = recorded()
    if costs is None or (before and len(costs.example_secs) < len(before.example_secs)):
        return
    path = precision_speed.cache_path()
    machines = precision_speed.read_cache(path)
    machine = machines.get(precision_speed.machine_key())
    if not isinstance(machine, dict):
        machine = machines[precision_speed.machine_key()] = {}
    machine[ENTRY] = {"view_secs": costs.view_secs, "example_secs": {
        str(side): secs for side, secs in sorted(costs.example_secs.items())}}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        files.write_json(path, {"format": precision_speed.CACHE_FORMAT, "machines": machines})
    except (OSError, Cifar10EstimatorError) as error:
        logging.getLogger("tensorflow").warning(
            "This run's costs were not kept for the next one's time to go: %s", error)
