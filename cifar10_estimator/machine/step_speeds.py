"""What this machine's training steps and evaluations took in its newest run, kept in the
user's cache of machine measurements (machine.measurement_cache's folder and helpers, a file
of its own) for the next run's time to go (run.time_to_go.Costs): how a step's cost
grows with the images differs by CPU and precision, and a run cannot see it before it
reaches a size. A run of fewer sizes than those kept keeps nothing; a missing or foreign
entry is no record; one that cannot be written costs the record only (one warning line).
"""

import logging
import os

from cifar10_estimator import files
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.machine import measurement_cache
from cifar10_estimator.run import time_to_go

CACHE_FORMAT = "cifar10_estimator.step_speeds/2"
CACHE_FILENAME = "step_speeds.json"


def recorded():
    """The Costs the newest run on this machine kept, or None."""
    machines = measurement_cache.read_cache(measurement_cache.cache_path(CACHE_FILENAME),
                                          CACHE_FORMAT)
    try:
        entry = machines[measurement_cache.machine_key()]
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
    path = measurement_cache.cache_path(CACHE_FILENAME)
    machines = measurement_cache.read_cache(path, CACHE_FORMAT)
    machines[measurement_cache.machine_key()] = {"view_secs": costs.view_secs, "example_secs": {
        str(side): secs for side, secs in sorted(costs.example_secs.items())}}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        files.write_json(path, {"format": CACHE_FORMAT, "machines": machines})
    except (OSError, Cifar10EstimatorError) as error:
        logging.getLogger("tensorflow").warning(
            "This run's costs were not kept for the next one's time to go: %s", error)
