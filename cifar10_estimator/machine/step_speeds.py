"""How long this machine's training steps took at each image size: kept from finished runs.

The time to go rates the image sizes a run has not reached yet from the one it trains at,
by the relative cost of their steps. How that cost grows with the images differs by CPU
and precision more than any one rule holds (the sprint recipe's 32-pixel step costs 2.8
times its 16-pixel one on a Zen 4 in bf16, 5.1 times on a Zen 3 in fp32: docs/training.md),
and a run's first phase cannot tell. So a run on one machine keeps the seconds each of its
image sizes' steps took, and the next run of the same step on the same machine (CPU,
TensorFlow, oneDNN: measurement_cache.machine_key) rates its phases from them. Kept in the
user's cache beside the precision probe's ($XDG_CACHE_HOME/cifar10_estimator/
step_speeds.json); a missing or foreign file is only a missing record. A run whose
machine's load changed between its phases gives none to keep
(time_to_go.MAX_CPU_SHARE_SPREAD).
"""

import datetime
import logging
import os

from cifar10_estimator import files
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.machine import measurement_cache

CACHE_FORMAT = "cifar10_estimator.step_speeds/1"
CACHE_FILENAME = "step_speeds.json"


def step_key(hparams, num_gpus, data_format):
    """What else a step's time depends on: the network, the batch and its towers, the
    precision, the layout, and an update that costs per step (--muon-learning-rate's
    orthogonalisations)."""
    key = "ResNet-%d, batch %d on %s, %s, %s" % (
        hparams.num_layers, hparams.train_batch_size,
        "%d GPUs" % num_gpus if num_gpus else "the CPU", hparams.precision, data_format)
    return key + (", Muon" if hparams.muon_learning_rate else "")


def recorded(hparams, num_gpus, data_format):
    """{image side: seconds a global step took} recorded for this step on this machine
    ({} if none)."""
    machines = measurement_cache.read_cache(measurement_cache.cache_path(CACHE_FILENAME),
                                            CACHE_FORMAT)
    steps = machines.get(measurement_cache.machine_key(), {})
    sides = steps.get(step_key(hparams, num_gpus, data_format), {}) if isinstance(
        steps, dict) else {}
    try:
        return {int(side): float(secs) for side, secs in sides.get("step_secs", {}).items()
                if float(secs) > 0}
    except (AttributeError, TypeError, ValueError):
        return {}


def record(hparams, num_gpus, data_format, step_secs):
    """Keep {image side: seconds a global step took} for this step on this machine: the
    sides given replace those recorded, the others stay. A cache that cannot be written
    costs only the record (one warning line). Steps that leave examples out
    (--skip-learned) cost less than the step, so they are not kept."""
    if not step_secs or hparams.skip_learned:
        return
    path = measurement_cache.cache_path(CACHE_FILENAME)
    machines = measurement_cache.read_cache(path, CACHE_FORMAT)
    steps = machines.setdefault(measurement_cache.machine_key(), {})
    entry = steps.setdefault(step_key(hparams, num_gpus, data_format), {})
    sides = entry.get("step_secs") if isinstance(entry.get("step_secs"), dict) else {}
    sides.update({str(side): round(secs, 6) for side, secs in step_secs.items()})
    entry.update(step_secs=sides, recorded=datetime.date.today().isoformat())
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        files.write_json(path, {"format": CACHE_FORMAT, "machines": machines})
    except (OSError, Cifar10EstimatorError) as error:
        logging.getLogger("tensorflow").warning(
            "The step times of this run were not kept for the next one's time to go: %s",
            error)
