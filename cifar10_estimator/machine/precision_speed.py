"""How fast this machine trains in a mixed precision against float32: measured, cached.

Whether bfloat16 pays on a CPU depends on more than its instruction flags: the trainer
runs faster in bf16 on an AMD Zen 4, slower on an Intel Xeon with avx512_bf16 but no AMX
(oneDNN's bf16 convolution kernels there are slower backwards; the figures are in
docs/precision.md). No table of CPU kinds stays true, so the trainer measures: a few
training steps of a small ResNet with the same convolutions, in float32 and in the asked
precision in alternating rounds (alternating_rounds), once per machine (CPU, instruction
flags, TensorFlow version, oneDNN), and keeps each one's best round in the user's cache
($XDG_CACHE_HOME/cifar10_estimator/precision_speed.json). The run goes on in the asked
precision either way; a slower one gets one warning line at start.
"""

import contextlib
import datetime
import json
import os
import time

import numpy as np
import tensorflow as tf

from cifar10_estimator.machine import alternating_rounds
from cifar10_estimator.machine import hardware
from cifar10_estimator import files

CACHE_FORMAT = "cifar10_estimator.precision_speed/1"
CACHE_FILENAME = "precision_speed.json"
# The probe: ResNet-8 (every convolution shape of the deeper ResNets, fewer of them),
# batches of 64; rounds alternate the precisions so that both see the same machine.
PROBE_NUM_LAYERS = 8
PROBE_BATCH_SIZE = 64
PROBE_WARMUP_STEPS = 3
PROBE_STEPS_PER_ROUND = 8
PROBE_ROUNDS = 3


def cache_path(filename=CACHE_FILENAME):
    """Where measured speeds are kept, per user (machine/step_speeds keeps its own file
    beside this one)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "cifar10_estimator", filename)


def machine_key():
    """What the speeds depend on: CPU, its bf16 instructions, TensorFlow and oneDNN."""
    first = hardware.first_cpu()
    flags = sorted(hardware.flags_of(first) & {
        "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_tile", "avx512f", "avx2"})
    return "%s | family %s model %s | %s | TensorFlow %s | oneDNN %s" % (
        first.get("model name", "unknown CPU"), first.get("cpu family", "?"),
        first.get("model", "?"), " ".join(flags), tf.__version__,
        "on" if hardware.onednn_enabled() else "off")


def read_cache(path, cache_format=CACHE_FORMAT):
    """{machine key: what was measured there} of a cache file of `cache_format`; {} for a
    missing, unreadable or foreign one, which is measured anew."""
    try:
        with open(path) as stream:
            content = json.load(stream)
        if content.get("format") == cache_format and isinstance(content["machines"], dict):
            return content["machines"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return {}


def measured_speeds(precision_policy, make_probe=None):
    """examples/sec of a training step in float32 and in `precision_policy` on this machine.

    Read from the cache when this machine was measured, else measured now and cached.

    Args:
      precision_policy: a precision.PrecisionPolicy the machine serves.
      make_probe: callable(policy) -> a context manager giving a callable that returns
        the examples/sec of one round; TrainingProbe by default.

    Returns:
      dict with fp32 and the policy's name -> examples/sec, and "measured" (the date).
    """
    path = cache_path()
    machines = read_cache(path)
    key = machine_key()
    speeds = machines.get(key, {})
    if precision_policy.name not in speeds or "fp32" not in speeds:
        from cifar10_estimator.training import precision
        speeds = _measure_alternately([precision.policy("fp32"), precision_policy],
                                      make_probe or TrainingProbe)
        speeds["measured"] = datetime.date.today().isoformat()
        machines[key] = speeds
        os.makedirs(os.path.dirname(path), exist_ok=True)
        files.write_json(path, {"format": CACHE_FORMAT, "machines": machines})
    return speeds


def fastest_precision(num_gpus, cpu_flags, onednn_enabled, make_probe=None,
                      gpu_compute_capabilities=()):
    """(name, log line) of the precision --precision auto trains in on this machine.

    On the CPU, the mixed precisions it serves are measured against fp32 (measured_speeds,
    cached per machine) and the fastest wins; fp32 when none is served or none is faster.
    GPUs are not measured: tf32 where they have TF32 tensor cores, else fp32
    (precision.auto_on_gpus).

    Args:
      num_gpus: GPUs the towers run on; 0 is the CPU.
      cpu_flags, onednn_enabled: what hardware.cpu_flags() and onednn_enabled() say.
      make_probe: as for measured_speeds.
      gpu_compute_capabilities: (major, minor) of each GPU used.
    """
    from cifar10_estimator.training import precision
    prefix = "--precision %s: " % precision.AUTO
    if num_gpus:
        name, why = precision.auto_on_gpus(gpu_compute_capabilities)
        return name, prefix + "%s (%s)" % (name, why)
    served = [policy for policy in precision.POLICIES.values() if policy.is_mixed
              and not precision.unsupported_reason(policy, 0, cpu_flags, onednn_enabled)]
    if not served:
        return "fp32", prefix + ("fp32 (no mixed precision runs fast on this CPU: bf16 "
                                 "needs %s instructions and TensorFlow's oneDNN kernels)"
                                 % " or ".join(precision.CPU_BF16_FLAGS))
    ratios = {}
    for policy in served:
        speeds = measured_speeds(policy, make_probe)
        ratios[policy.name] = (speeds[policy.name] / speeds["fp32"],
                               speeds.get("measured", "earlier"))
    name = max(ratios, key=lambda candidate: ratios[candidate][0])
    ratio, measured = ratios[name]
    if ratio <= 1:
        return "fp32", prefix + ("fp32 (%s trains at %.2fx the speed of fp32 on this machine, "
                                 "measured %s)" % (name, ratio, measured))
    return name, prefix + ("%s (%.2fx the speed of fp32 on this machine, measured %s)"
                           % (name, ratio, measured))


def _measure_alternately(policies, make_probe):
    """The best examples/sec of each policy over PROBE_ROUNDS alternating rounds."""
    with contextlib.ExitStack() as stack:
        results = alternating_rounds.measure(
            {policy.name: stack.enter_context(make_probe(policy)) for policy in policies},
            PROBE_ROUNDS)
    return {name: max(result.measurements) for name, result in results.items()}


def speed_line(precision_policy, make_probe=None):
    """(line, slower) of a mixed precision asked for by name: how it trains against fp32
    on this machine (measured_speeds); slower: it trains slower, and the line, a warning,
    says to use fp32."""
    speeds = measured_speeds(precision_policy, make_probe)
    warning = slower_than_fp32_warning(precision_policy, speeds)
    if warning:
        return warning, True
    return ("--precision %s trains at %.2fx the speed of fp32 on this machine (measured %s)"
            % (precision_policy.name, speeds[precision_policy.name] / speeds["fp32"],
               speeds.get("measured", "earlier"))), False


def slower_than_fp32_warning(precision_policy, speeds):
    """One line telling that `precision_policy` trains slower than fp32 here, or None."""
    ratio = speeds[precision_policy.name] / speeds["fp32"]
    if ratio >= 1:
        return None
    return ("--precision %s trains at %.2fx the speed of fp32 on this machine (measured %s: "
            "%.0f against %.0f examples/sec, ResNet-%d probe; figures in %s): use --precision "
            "fp32 here" % (precision_policy.name, ratio, speeds.get("measured", "earlier"),
                           speeds[precision_policy.name], speeds["fp32"], PROBE_NUM_LAYERS,
                           cache_path()))


class TrainingProbe:
    """The probe's training graph in one precision, ready to time: `with TrainingProbe(p) as
    run_round: run_round()` returns the examples/sec of PROBE_STEPS_PER_ROUND steps."""

    def __init__(self, precision_policy):
        self._policy = precision_policy
        self._session = None

    def __enter__(self):
        from cifar10_estimator import hparams as job_hparams
        from cifar10_estimator import model_fn

        hparams = job_hparams.HParams(num_layers=PROBE_NUM_LAYERS, precision=self._policy.name,
                                      train_batch_size=PROBE_BATCH_SIZE)
        layout = model_fn.TowerLayout.for_devices(num_gpus=0)
        rng = np.random.RandomState(1)
        graph = tf.Graph()
        with graph.as_default():
            images = tf.constant(rng.uniform(0, 255, (PROBE_BATCH_SIZE, 32, 32, 3)), tf.float32)
            labels = tf.constant(rng.randint(0, 10, PROBE_BATCH_SIZE), tf.int32)
            self._train_op = model_fn.make_model_fn(layout, hparams)(
                [images], [labels], tf.estimator.ModeKeys.TRAIN, None).train_op
            self._session = tf.compat.v1.Session(graph=graph)
            self._session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(PROBE_WARMUP_STEPS):
            self._session.run(self._train_op)
        return self._run_round

    def _run_round(self):
        start = time.perf_counter()
        for _ in range(PROBE_STEPS_PER_ROUND):
            self._session.run(self._train_op)
        return PROBE_BATCH_SIZE * PROBE_STEPS_PER_ROUND / (time.perf_counter() - start)

    def __exit__(self, *exc_info):
        self._session.close()
