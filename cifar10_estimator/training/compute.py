"""A run's training compute: the FLOPs each image-size phase trains with, and the rate
its steps reached.

A phase's FLOPs are the examples it trains (`examples_trained`, the one place that says
how many) times the training FLOPs of one example at its image size, which the trainer
counts from the network's shapes (compute_accounting.training_compute). The plan line
gives the total before training (`TrainingCompute.plan_text`); the training the run's
progress timed (run.time_to_go) and its FLOPs give the GFLOP/s that test_results.json
keeps with the total (`record`) and the closing summary gives (`summary_lines`). Unlike a time, the compute is the same on every machine: recipes
measured on different CPUs compare on it (`python -m cifar10_estimator.curves --x-axis
tflop`). Imports no TensorFlow.
"""

import collections
import dataclasses

from cifar10_estimator.settings import precision
from cifar10_estimator.settings import schedule


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of training on images of one size.

    Attributes:
      image_side: pixels a side of the images it trains on.
      first_step, end_step: it trains the global steps from first_step to end_step - 1.
      flops_per_example: the training FLOPs of one example at image_side.
    """

    image_side: int
    first_step: int
    end_step: int
    flops_per_example: float


def examples_trained(hparams, first_step, end_step):
    """Examples the global steps from first_step to end_step - 1 train on: every example of
    each step's batch. The one place that says so: an option that trains on fewer of them
    changes this."""
    return max(0, end_step - first_step) * hparams.examples_per_global_step


def image_size_phases(hparams, full_side):
    """[(image side, end step)] of the whole run: schedule.resolution_phases' (each with a
    step to train, to the last step at most), then full_side until the last step."""
    last_step = schedule.last_step(hparams)
    phases, start = [], 0
    for side, end in schedule.resolution_phases(hparams):
        end = min(end, last_step)
        if end > start:
            phases.append((side, end))
            start = end
    if start < last_step:
        phases.append((full_side, last_step))
    return phases


class TrainingCompute:
    """The training FLOPs of a run, phase by phase (`phases`, a tuple of Phase)."""

    def __init__(self, hparams, phases):
        self._hparams = hparams
        self.phases = tuple(phases)

    @classmethod
    def of_run(cls, hparams, full_side, flops_per_example):
        """The run's phases (image_size_phases), each example's FLOPs from
        flops_per_example(image side)."""
        phases, first_step = [], 0
        for side, end_step in image_size_phases(hparams, full_side):
            phases.append(Phase(side, first_step, end_step, flops_per_example(side)))
            first_step = end_step
        return cls(hparams, phases)

    def examples(self, phase):
        """Examples `phase` (one of phases) trains on."""
        return examples_trained(self._hparams, phase.first_step, phase.end_step)

    def flops(self, first_step=0, end_step=None):
        """Training FLOPs of the global steps from first_step to end_step - 1 (default: to
        the last step)."""
        total = 0.0
        for phase in self.phases:
            end = phase.end_step if end_step is None else min(end_step, phase.end_step)
            total += phase.flops_per_example * examples_trained(
                self._hparams, max(first_step, phase.first_step), end)
        return total

    def flops_of_counts(self, examples_per_phase):
        """Training FLOPs of `examples_per_phase` (examples trained in each of phases), as
        --skip-learned counts them."""
        return sum(phase.flops_per_example * examples
                   for phase, examples in zip(self.phases, examples_per_phase))

    def plan_text(self):
        """The plan line's words, e.g. '93.8 TFLOP of training (14.2 on 16-pixel images,
        31.6 on 24, 48.0 on 32)'; with --skip-learned those of every example, 'at most'."""
        text = "%s%s TFLOP of training" % ("at most " if self._hparams.skip_learned else "",
                                           tflop_text(self.flops() / 1e12))
        if len(self.phases) == 1:
            return text
        return "%s (%s)" % (text, ", ".join(
            ("%s on %d-pixel images" if index == 0 else "%s on %d") % (
                tflop_text(self.flops(phase.first_step, phase.end_step) / 1e12),
                phase.image_side)
            for index, phase in enumerate(self.phases)))


def tflop_text(tflop):
    """TFLOP for a person: one decimal, or two significant digits below 1."""
    return "%.1f" % tflop if tflop >= 1 else "%.2g" % tflop


# What a process timed of its training: global steps, seconds, their FLOPs, and with
# --skip-learned the examples each phase kept (the final checkpoint's counts), else None.
TimedTraining = collections.namedtuple("TimedTraining", "steps secs flops examples_per_phase",
                                       defaults=(None,))


def record(training_compute, timer=None, precision_name=None, cpu_peak=None):
    """What test_results.json keeps of a run's compute: the total and each phase's, and
    where this process timed training steps, the rate they reached and on a CPU the
    share of its peak in the run's precision.

    Args:
      training_compute: the run's TrainingCompute.
      timer: the TimedTraining of this process, or None.
      precision_name: the --precision the run trained in (one of precision.PRECISIONS).
      cpu_peak: the machine.cpu_peak.CpuPeak of the CPU it trained on; None on GPUs.
    """
    result = {
        "tflop": training_compute.flops() / 1e12,
        "phases": [{"image_side": phase.image_side, "end_step": phase.end_step,
                    "examples": training_compute.examples(phase),
                    "mflop_per_example": phase.flops_per_example / 1e6,
                    "tflop": training_compute.flops(phase.first_step, phase.end_step) / 1e12}
                   for phase in training_compute.phases],
    }
    trained = timer.examples_per_phase if timer else None
    if trained is not None:
        # --skip-learned: the examples the steps kept, as the checkpoints count them.
        result["planned_tflop"] = result["tflop"]
        result["tflop"] = training_compute.flops_of_counts(trained) / 1e12
        for phase_record, phase, examples in zip(result["phases"], training_compute.phases,
                                                 trained):
            phase_record.update(examples=int(examples),
                                tflop=phase.flops_per_example * examples / 1e12)
    if timer is None or not timer.secs:
        return result
    result.update(timed_steps=timer.steps, timed_tflop=timer.flops / 1e12,
                  step_secs=timer.secs, gflop_per_sec=timer.flops / timer.secs / 1e9)
    compute_dtype = precision.policy(precision_name).compute_dtype if precision_name else None
    peak = cpu_peak.gflops(compute_dtype) if cpu_peak and compute_dtype else None
    if peak:
        result.update(peak_precision=precision_name, peak_gflop_per_sec=peak,
                      peak_derivation=cpu_peak.derivation(compute_dtype),
                      share_of_peak=result["gflop_per_sec"] / peak)
    return result


def summary_lines(compute):
    """The closing summary's lines of a run's compute (`record`'s dict)."""
    lines = ["  training compute     %s TFLOP" % tflop_text(compute["tflop"])]
    if "planned_tflop" in compute:
        lines[0] += " (%.0f %% of every example's %s)" % (
            100 * compute["tflop"] / compute["planned_tflop"], tflop_text(compute["planned_tflop"]))
    if "gflop_per_sec" in compute:
        lines[0] += ", %.0f GFLOP/s over %.0f s of training steps" % (
            compute["gflop_per_sec"], compute["step_secs"])
    if "peak_gflop_per_sec" in compute:
        lines.append("  share of CPU peak    %.0f %% of %.0f GFLOP/s, its %s peak: %s" % (
            100 * compute["share_of_peak"], compute["peak_gflop_per_sec"],
            compute["peak_precision"], compute["peak_derivation"]))
    return lines
