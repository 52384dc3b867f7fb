"""--precision: what training computes in, decided once, and whether this machine serves it.

A PrecisionPolicy is the whole decision: the dtype the towers compute in while training,
whether the loss is scaled, and what hardware the compute type needs. model_fn receives
the policy and reads its fields; nothing compares a precision's name. How the graph does
it is mixed_precision's; what the machine has is hardware's.

fp32 computes everything in float32, as the original did: on GPUs from Ampere on
(compute capability 8.0), whose tensor cores multiply float32 matrices in TF32 (a 10-bit
mantissa) where TensorFlow is left to its default, fp32 turns that off. tf32 is float32
with TF32 matrix multiplies and convolutions on those GPUs, named as a choice of its own.
bf16 and fp16 are mixed precision: variables, the loss and batch-norm statistics stay float32, and prediction and
exports compute in float32 (evaluation too, unless --eval-in-training-precision). float16's 5 exponent bits make small
gradients underflow, so fp16 scales the loss; bfloat16 has float32's range and needs no
scaling. Imports no TensorFlow, so the flags can check a precision before it loads.
"""

import dataclasses
import typing

# /proc/cpuinfo flags of bfloat16 dot products, the instructions oneDNN's bf16 kernels
# use; without them TensorFlow converts to float32 and back around every op.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# bfloat16 and TF32 tensor cores arrived with Ampere.
MIN_BF16_GPU_COMPUTE_CAPABILITY = (8, 0)
MIN_TF32_GPU_COMPUTE_CAPABILITY = (8, 0)


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
    """What one --precision means.

    Attributes:
      name: the flag's value.
      compute_dtype: the dtype name the towers compute in while training.
      loss_scaling: whether each tower's loss is scaled by a dynamic loss scale.
      cpu_flags_needed: the CPU serves it only with one of these /proc/cpuinfo flags
        (and TensorFlow's oneDNN kernels); None: any CPU; () : no CPU.
      description: what it computes in, for the plan line.
      min_gpu_compute_capability: the oldest GPU that serves it.
      tensor_float_32: whether the GPUs may multiply float32 matrices (and convolve) in
        TF32; TensorFlow's default is on, so every other policy turns it off.
    """

    name: str
    compute_dtype: str
    loss_scaling: bool
    cpu_flags_needed: typing.Optional[tuple]
    description: str
    min_gpu_compute_capability: tuple = (0, 0)
    tensor_float_32: bool = False

    @property
    def is_mixed(self):
        """Whether the towers compute in another type than their float32 variables."""
        return self.compute_dtype != "float32"

    @property
    def served_everywhere(self):
        """Whether every CPU and every GPU trains in it (fp32)."""
        return self.cpu_flags_needed is None and self.min_gpu_compute_capability == (0, 0)

    def plan_text(self):
        """The plan line's words, e.g. 'in fp32 (float32 throughout, TF32 off)'."""
        return "in %s (%s)" % (self.name, self.description)


POLICIES = {policy.name: policy for policy in (
    PrecisionPolicy("fp32", "float32", loss_scaling=False, cpu_flags_needed=None,
                    description="float32 throughout, TF32 off"),
    # A CPU has no TF32: it computes float32 in full, which is fp32.
    PrecisionPolicy("tf32", "float32", loss_scaling=False, cpu_flags_needed=(),
                    description="float32, its matrix multiplies and convolutions in TF32 "
                                "on the GPUs' tensor cores",
                    min_gpu_compute_capability=MIN_TF32_GPU_COMPUTE_CAPABILITY,
                    tensor_float_32=True),
    PrecisionPolicy("bf16", "bfloat16", loss_scaling=False, cpu_flags_needed=CPU_BF16_FLAGS,
                    description="mixed bfloat16, float32 variables, TF32 off",
                    min_gpu_compute_capability=MIN_BF16_GPU_COMPUTE_CAPABILITY),
    # TensorFlow's CPU kernels only emulate float16, slower than float32.
    PrecisionPolicy("fp16", "float16", loss_scaling=True, cpu_flags_needed=(),
                    description="mixed float16 with loss scaling, float32 variables, TF32 off"),
)}
PRECISIONS = tuple(POLICIES)
# --precision auto: the trainer picks, per machine, the fastest precision it serves
# (precision_speed.fastest_precision); hparams.json records the one it picked.
AUTO = "auto"


def policy(name):
    """The PrecisionPolicy of a --precision value (one of PRECISIONS)."""
    return POLICIES[name]


def auto_on_gpus(gpu_compute_capabilities):
    """(name, why) of the precision --precision auto trains in on GPUs of these (major,
    minor) compute capabilities: tf32 where every one has TF32 tensor cores, which is
    what TensorFlow does there by default, named; else fp32. The mixed precisions change
    what the network computes in, so auto leaves them to be asked for by name."""
    least = MIN_TF32_GPU_COMPUTE_CAPABILITY
    capabilities = [tuple(capability) for capability in gpu_compute_capabilities]
    if capabilities and min(capabilities) >= least:
        return "tf32", ("these GPUs (compute capability %d.%d) have TF32 tensor cores; "
                        "--precision fp32 for float32 throughout" % min(capabilities))
    return "fp32", ("TF32 needs compute capability %d.%d, and a GPU here is %d.%d; "
                    "--precision fp16 asks for mixed float16" % (
                        least + min(capabilities, default=(0, 0))))


def _cpu_serves(precision_policy, cpu_flags, onednn_enabled):
    needed = precision_policy.cpu_flags_needed
    if needed is None:
        return True
    return onednn_enabled and any(flag in cpu_flags for flag in needed)


def unsupported_reason(precision_policy, num_gpus, cpu_flags, onednn_enabled,
                       gpu_compute_capabilities=()):
    """Why this machine cannot train in `precision_policy` (one line naming what to use), or None.

    Args:
      precision_policy: a PrecisionPolicy.
      num_gpus: GPUs the towers run on; 0 is the CPU.
      cpu_flags: the CPU's /proc/cpuinfo flags (a set of strings).
      onednn_enabled: whether TensorFlow runs its oneDNN CPU kernels.
      gpu_compute_capabilities: (major, minor) of each GPU used.
    """
    flag = "--precision %s" % precision_policy.name
    if num_gpus > 0:
        least = precision_policy.min_gpu_compute_capability
        old = [capability for capability in gpu_compute_capabilities
               if tuple(capability) < least]
        if old:
            return ("%s needs GPUs of compute capability %d.%d or newer, and one here is "
                    "%d.%d: use --precision %s" % ((flag,) + least + tuple(old[0]) + (
                        "fp16" if precision_policy.is_mixed else "fp32",)))
        return None
    if _cpu_serves(precision_policy, cpu_flags, onednn_enabled):
        return None
    needed = precision_policy.cpu_flags_needed
    if not precision_policy.is_mixed:
        return ("%s is for GPUs of compute capability %d.%d or newer, whose tensor cores "
                "multiply float32 in TF32; a CPU computes float32 in full: use --precision "
                "fp32" % ((flag,) + precision_policy.min_gpu_compute_capability))
    if not needed:
        served = [other.name for other in POLICIES.values()
                  if other.is_mixed and _cpu_serves(other, cpu_flags, onednn_enabled)]
        return ("%s is for GPUs: TensorFlow's CPU kernels only emulate %s, slower than "
                "float32; use --precision %s" % (
                    flag, precision_policy.compute_dtype,
                    "%s (this CPU has %s instructions)"
                    % (served[0], POLICIES[served[0]].compute_dtype) if served else "fp32"))
    if not any(cpu_flag in cpu_flags for cpu_flag in needed):
        return ("%s on the CPU needs %s instructions (%s), which this CPU lacks: TensorFlow "
                "would emulate them, slower than float32; use --precision fp32"
                % (flag, precision_policy.compute_dtype, " or ".join(needed)))
    return ("%s on the CPU needs TensorFlow's oneDNN kernels, which are off here: set "
            "TF_ENABLE_ONEDNN_OPTS=1, or use --precision fp32" % flag)
