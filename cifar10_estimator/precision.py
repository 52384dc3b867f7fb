"""Training precisions: what each computes in, which machines serve it, fp16's loss scaling.

fp32 computes everything in float32, as the original did. bf16 and fp16 are mixed
precision: variables, optimizer slots, the loss and the batch-norm statistics stay
float32, while each tower reads its variables cast to the compute type
(float32_variables) and runs its convolutions, batch norm, ReLUs and classifier in it.
Checkpoints therefore hold float32 variables whatever the precision, and evaluation,
prediction and exports compute in float32.

float16 has 5 exponent bits, so small gradients underflow: fp16 scales each tower's loss
by a dynamic loss scale and LossScaleOptimizer unscales the averaged gradients. bfloat16
has float32's exponent range and needs no scaling.
"""

import os

import tensorflow as tf

# Keyed by hparams.PRECISIONS.
COMPUTE_DTYPES = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}

CPUINFO_PATH = "/proc/cpuinfo"
# /proc/cpuinfo flags of bfloat16 dot products, the instructions oneDNN's bf16 kernels
# use; without them TensorFlow converts to float32 and back around every op.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# bfloat16 tensor cores arrived with Ampere.
MIN_BF16_GPU_COMPUTE_CAPABILITY = (8, 0)

# The dynamic loss scale of fp16 (the values of TensorFlow's own dynamic scaling): start
# high, halve on every step whose gradients overflow, double after this many good steps.
INITIAL_LOSS_SCALE = 2.0 ** 15
LOSS_SCALE_GROWTH_STEPS = 2000
MIN_LOSS_SCALE = 1.0


def compute_dtype(precision, is_training):
    """The dtype a tower computes in: the precision's while training, float32 otherwise."""
    return COMPUTE_DTYPES[precision] if is_training else tf.float32


def float32_variables(getter, name, *args, **kwargs):
    """variable_scope custom getter: a variable asked for in float16 or bfloat16 is made
    float32 and read through a cast, so checkpoints and the optimizer stay float32."""
    dtype = kwargs.get("dtype")
    if dtype in (tf.float16, tf.bfloat16):
        kwargs["dtype"] = tf.float32
        return tf.cast(getter(name, *args, **kwargs), dtype)
    return getter(name, *args, **kwargs)


def read_cpuinfo(path=CPUINFO_PATH):
    """List of dicts, one per logical CPU, of /proc/cpuinfo's `key : value` lines."""
    processors, current = [], {}
    try:
        with open(path) as stream:
            for line in stream:
                if not line.strip():
                    if current:
                        processors.append(current)
                    current = {}
                    continue
                key, _, value = line.partition(":")
                current[key.strip()] = value.strip()
    except OSError:
        return []
    if current:
        processors.append(current)
    return processors


def cpu_flags(path=CPUINFO_PATH):
    """The first CPU's /proc/cpuinfo flags, as a set (empty where there is no cpuinfo)."""
    processors = read_cpuinfo(path)
    return set(processors[0].get("flags", "").split()) if processors else set()


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels, the only ones with NCHW convolution
    and pooling and with fast bfloat16. It does by default on some CPUs;
    TF_ENABLE_ONEDNN_OPTS=1/0 decides."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a private API: fall back to the user's setting
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1"


def unsupported_reason(precision, num_gpus, cpu_flags, onednn_enabled,
                       gpu_compute_capabilities=()):
    """Why this machine cannot train in `precision` (one line naming what to use), or None.

    Args:
      precision: one of PRECISIONS.
      num_gpus: GPUs the towers run on; 0 is the CPU.
      cpu_flags: the CPU's /proc/cpuinfo flags (a set of strings).
      onednn_enabled: whether TensorFlow runs its oneDNN CPU kernels.
      gpu_compute_capabilities: (major, minor) of each GPU used.
    """
    if precision == "fp32":
        return None
    cpu_has_bf16 = any(flag in cpu_flags for flag in CPU_BF16_FLAGS)
    if num_gpus > 0:
        if precision == "bf16":
            old = [capability for capability in gpu_compute_capabilities
                   if tuple(capability) < MIN_BF16_GPU_COMPUTE_CAPABILITY]
            if old:
                return ("--precision bf16 needs GPUs of compute capability %d.%d or newer, and "
                        "one here is %d.%d: use --precision fp16"
                        % (MIN_BF16_GPU_COMPUTE_CAPABILITY + tuple(old[0])))
        return None
    if precision == "fp16":
        return ("--precision fp16 is for GPUs: TensorFlow's CPU kernels only emulate float16, "
                "slower than float32; use --precision %s"
                % ("bf16 (this CPU has bfloat16 instructions)" if cpu_has_bf16 and onednn_enabled
                   else "fp32"))
    if not cpu_has_bf16:
        return ("--precision bf16 on the CPU needs bfloat16 instructions (%s), which this CPU "
                "lacks: TensorFlow would emulate them, slower than float32; use --precision fp32"
                % " or ".join(CPU_BF16_FLAGS))
    if not onednn_enabled:
        return ("--precision bf16 on the CPU needs TensorFlow's oneDNN kernels, which are off "
                "here: set TF_ENABLE_ONEDNN_OPTS=1, or use --precision fp32")
    return None


class DynamicLossScale:
    """fp16's loss scale: float32 variable `scale`, halved on overflow, doubled after a run.

    Global variables, so a cluster shares one scale (on a ps) and checkpoints keep it;
    LossScaleTolerantSaver resumes checkpoints that lack them.
    """

    def __init__(self, initial_scale=None, growth_steps=None):
        """Defaults: INITIAL_LOSS_SCALE and LOSS_SCALE_GROWTH_STEPS."""
        self._growth_steps = growth_steps or LOSS_SCALE_GROWTH_STEPS
        with tf.compat.v1.variable_scope("dynamic_loss_scale"):
            self.scale = tf.compat.v1.get_variable(
                "scale", initializer=float(initial_scale or INITIAL_LOSS_SCALE),
                trainable=False, use_resource=True)
            self.good_steps = tf.compat.v1.get_variable(
                "good_steps", initializer=tf.constant(0, tf.int64), trainable=False,
                use_resource=True)

    @property
    def variables(self):
        return [self.scale, self.good_steps]

    def update(self, all_finite):
        """Op: after a finite step count it (doubling the scale every growth_steps in a
        row); after a step that overflowed halve the scale, never below MIN_LOSS_SCALE."""
        return tf.cond(all_finite, self._count_good_step, self._drop_scale)

    def _count_good_step(self):
        good_steps = self.good_steps + 1
        grow = good_steps >= self._growth_steps
        return tf.group(
            self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale)),
            self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), good_steps)))

    def _drop_scale(self):
        return tf.group(
            self.scale.assign(tf.maximum(self.scale * 0.5, MIN_LOSS_SCALE)),
            self.good_steps.assign(tf.constant(0, tf.int64)))


class LossScaleOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps an optimizer to apply gradients of loss x loss_scale.scale.

    The towers multiply their losses by the scale before differentiating; the gradients
    given to apply_gradients (averaged over towers, and over workers under
    SyncReplicasOptimizer, which wraps this) are unscaled here. A step where any of them
    is not finite changes no variable and lowers the scale. The global step advances
    either way, so the learning-rate schedule and --train-steps count steps taken.
    """

    def __init__(self, optimizer, loss_scale, name="LossScaleOptimizer"):
        super().__init__(use_locking=False, name=name)
        self._optimizer = optimizer
        self._loss_scale = loss_scale

    def compute_gradients(self, loss, var_list=None, **kwargs):
        """Gradients of loss x scale, for minimize(); the towers differentiate themselves."""
        return self._optimizer.compute_gradients(loss * self._loss_scale.scale, var_list,
                                                 **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        with tf.name_scope(name or self._name):
            inverse_scale = 1.0 / self._loss_scale.scale
            unscaled = [(None if grad is None else grad * inverse_scale, var)
                        for grad, var in grads_and_vars]
            all_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(grad))
                                        for grad, _ in unscaled if grad is not None])
            # The wrapped optimizer creates its slots outside the cond (in init_scope).
            apply_op = tf.cond(
                all_finite,
                lambda: tf.group(self._optimizer.apply_gradients(unscaled)),
                tf.no_op)
            update_scale_op = self._loss_scale.update(all_finite)
            with tf.control_dependencies([apply_op, update_scale_op]):
                if global_step is None:
                    return tf.no_op()
                return tf.compat.v1.assign_add(global_step, 1).op

    # SyncReplicasOptimizer asks the optimizer it wraps for these.
    def get_slot(self, var, name):
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        return self._optimizer.get_slot_names()

    def variables(self):
        return self._optimizer.variables() + self._loss_scale.variables


class LossScaleTolerantSaver(tf.compat.v1.train.Saver):
    """The Estimator's Saver, but resuming a checkpoint without the loss scale's variables.

    A job trained in fp32 or bf16 has none; continuing it with --precision fp16 restores
    every other variable and starts the scale at its initial value. A checkpoint missing
    any other variable still fails as usual.
    """

    def __init__(self, loss_scale_variables, **saver_kwargs):
        super().__init__(**saver_kwargs)
        self._loss_scale_variables = list(loss_scale_variables)
        others = [variable for variable in tf.compat.v1.global_variables()
                  if all(variable is not own for own in self._loss_scale_variables)]
        # Built now: the graph is finalized before restore runs.
        self._restorer_without_scale = tf.compat.v1.train.Saver(
            others, sharded=saver_kwargs.get("sharded", False))

    def restore(self, sess, save_path):
        names = {name for name, _ in tf.train.list_variables(save_path)}
        if all(variable.op.name in names for variable in self._loss_scale_variables):
            return super().restore(sess, save_path)
        tf.compat.v1.logging.info(
            "%s holds no loss scale (trained in another precision): the scale starts at "
            "its initial value", save_path)
        self._restorer_without_scale.restore(sess, save_path)
        sess.run([variable.initializer for variable in self._loss_scale_variables])
        return None
