"""Mixed precision in the graph: float32 variables read in the compute type, fp16 loss scaling.

What a precision computes in is decided by precision.PrecisionPolicy; this is how the
graph does it. Variables, optimizer slots, the loss and the batch-norm statistics stay
float32, while each tower reads its variables cast to the compute type
(float32_variables) and runs its convolutions, batch norm, ReLUs and classifier in it.
Checkpoints therefore hold float32 variables whatever the precision. Prediction and
exports compute in float32; so does evaluation, unless --eval-in-training-precision.

float16 has 5 exponent bits, so small gradients underflow: fp16 scales each tower's loss
by a dynamic loss scale and LossScaleOptimizer unscales the averaged gradients. bfloat16
has float32's exponent range and needs no scaling.
"""

import tensorflow as tf

from cifar10_estimator.training import checkpoint_saver
from cifar10_estimator.training import optimizer_wrapper

# The dynamic loss scale of fp16 (the values of TensorFlow's own dynamic scaling): start
# high, halve on every step whose gradients overflow, double after this many good steps.
INITIAL_LOSS_SCALE = 2.0 ** 15
LOSS_SCALE_GROWTH_STEPS = 2000
MIN_LOSS_SCALE = 1.0


def compute_dtype(precision_policy, in_policy_precision=True):
    """The dtype a tower computes in: the policy's, or float32 where not
    in_policy_precision (evaluation without --eval-in-training-precision)."""
    return tf.as_dtype(precision_policy.compute_dtype) if in_policy_precision else tf.float32


def apply_tensor_float_32(precision_policy):
    """Let the GPUs multiply float32 matrices and convolve in TF32, or not, as
    precision_policy says. TensorFlow's switch is the process's, read by its kernels when
    they run, so call it before the first session; it does nothing on a CPU."""
    tf.config.experimental.enable_tensor_float_32_execution(precision_policy.tensor_float_32)


def float32_variables(getter, name, *args, **kwargs):
    """variable_scope custom getter: a variable asked for in float16 or bfloat16 is made
    float32 and read through a cast, so checkpoints and the optimizer stay float32."""
    dtype = kwargs.get("dtype")
    if dtype in (tf.float16, tf.bfloat16):
        kwargs["dtype"] = tf.float32
        return tf.cast(getter(name, *args, **kwargs), dtype)
    return getter(name, *args, **kwargs)


class DynamicLossScale:
    """fp16's loss scale: float32 variable `scale`, halved on overflow, doubled after a run.

    Global variables, so a cluster shares one scale (on a ps) and checkpoints keep it;
    a checkpoint without them (trained in another precision) resumes through
    checkpoint_saver.TolerantSaver with `optional_variables`.
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

    def optional_variables(self):
        """The scale as a checkpoint may lack it: then it starts at its initial value."""
        return checkpoint_saver.OptionalVariables(
            {variable.op.name: variable for variable in self.variables},
            "no loss scale (trained in another precision): the scale starts at its "
            "initial value")

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


class LossScaleOptimizer(optimizer_wrapper.OptimizerWrapper):
    """Wraps an optimizer to apply gradients of loss x loss_scale.scale.

    The towers multiply their losses by the scale before differentiating; the gradients
    given to apply_gradients (averaged over towers, and over workers under
    SyncReplicasOptimizer, which wraps this) are unscaled here. A step where any of them
    is not finite changes no variable and lowers the scale. The global step advances
    either way, so the learning-rate schedule and --train-steps count steps taken.
    """

    def __init__(self, optimizer, loss_scale, name="LossScaleOptimizer"):
        super().__init__(optimizer, name)
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

    def variables(self):
        return self._optimizer.variables() + self._loss_scale.variables
