"""--muon-learning-rate R: Muon (Jordan et al. 2024) for the convolution kernels.

Every convolution kernel of the ResNet is followed by batch norm, so what a kernel
computes does not depend on its scale: only its direction learns. Muon updates each
kernel by its (Nesterov) momentum made orthogonal, so that the update moves every
direction of the kernel's [fan-in, filters] matrix by the same amount rather than mostly
the few its gradient is largest along, and holds the kernel's norm at sqrt(filters),
where a step of rate R changes it by about R of its size:

    momentum = m x momentum + gradient           (m: --muon-momentum)
    update   = orthogonal(gradient + m x momentum)
    kernel   = kernel x sqrt(filters) / |kernel| - R_t x update

orthogonal() is five steps of the quintic Newton-Schulz iteration of Jordan et al.
(coefficients 3.4445, -4.7750, 2.0315), which brings the singular values of the matrix
near 1 (within about a third: the iteration trades exactness for speed). R_t follows
the learning-rate schedule: R x the schedule's rate at the step / --learning-rate. Every
other variable (batch norm's scales and shifts, the dense layer) is updated by the
momentum optimizer as without the flag. The kernels' weight decay stays in their
gradient; with their norm held, it no longer shrinks them.

Checkpoints hold the momenta (VAR/Muon), and the momentum optimizer's slots of the kernels
(VAR/Momentum, under the name optimizer_stack gives it) as they were. A checkpoint without
the momenta (trained without the flag) starts each at zero when training continues with
the flag; training without the flag ignores them, and goes on from the slots as they were.
Each step's orthogonalisation costs FLOPs of its own, per step rather than per example
(`step_flops`), which the trainer adds to the run's compute.
"""

import math

import tensorflow as tf

from cifar10_estimator.training import checkpoint_saver
from cifar10_estimator.training import optimizer_wrapper

# The name of every momentum under its kernel's.
MOMENTUM_NAME = "Muon"
# Jordan et al.'s quintic iteration: X <- a X + (b A + c A A) X with A = X X^T.
NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NEWTON_SCHULZ_STEPS = 5


def is_kernel(variable):
    """Whether Muon updates `variable`: a convolution kernel [height, width, in, out]."""
    return variable.shape.ndims == 4


def _matrix_shape(kernel_shape):
    """(rows, columns) of a kernel as the matrix Muon orthogonalises: fan-in x filters."""
    filters = int(kernel_shape[-1])
    return int(math.prod(int(size) for size in kernel_shape)) // filters, filters


def orthogonalised(matrix, steps=NEWTON_SCHULZ_STEPS):
    """`matrix` [m, n] with its singular values brought near 1 (its nearest semi-orthogonal
    matrix, approximately) by `steps` of the quintic Newton-Schulz iteration."""
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    # The iteration's products are the smaller side squared: the Gram matrix A of the
    # smaller side, multiplied on that side. Taken by the matrix products' own transpose
    # flags rather than by transposing the matrix (oneDNN's transposes of these small
    # matrices took 4 ms of a 100-ms step on a Zen 4). And the polynomial is summed on
    # the small side, X <- X (a I + A (b I + c A)), so that the m x n matrix is touched
    # only by the two products: the 13 kernels' update of ResNet-14 took 0.74 ms a step
    # this way against 0.94 as a X + X (b A + c A A) on a Zen 5, most of it now the
    # products' own FLOPs. Batching the kernels of one shape into one product was slower.
    tall = matrix.shape[0] > matrix.shape[1]
    identity = tf.eye(min(matrix.shape), dtype=matrix.dtype)
    x = matrix / (tf.norm(matrix) + 1e-7)
    for _ in range(steps):
        gram = tf.matmul(x, x, transpose_a=tall, transpose_b=not tall)
        polynomial = tf.matmul(gram, c * gram + b * identity) + a * identity
        x = tf.matmul(x, polynomial) if tall else tf.matmul(polynomial, x)
    return x


def step_flops(kernel_shapes, steps=NEWTON_SCHULZ_STEPS):
    """FLOPs of one step's orthogonalisations of kernels of `kernel_shapes` (multiply and
    add counted as two): per iteration, for an m x n matrix or its transpose (n <= m), the
    n x n Gram matrix A and the product with X take 2 n^2 m each, A A 2 n^3."""
    total = 0
    for shape in kernel_shapes:
        n, m = sorted(_matrix_shape(shape))
        total += steps * (4 * n * n * m + 2 * n ** 3)
    return total


class KernelMomenta:
    """The Muon momenta of the convolution kernels among `variables`, and their update."""

    def __init__(self, variables, momentum, rate, momentum_optimizer_name):
        """Args:
          variables: the trainable variables; the kernels among them get a momentum.
          momentum: m, in [0, 1).
          rate: the step's rate R_t, a scalar tensor.
          momentum_optimizer_name: the name of the momentum optimizer that updates the
            other variables, so of its slots (optimizer_stack.MOMENTUM_OPTIMIZER_NAME).
        """
        self.kernels = [variable for variable in variables if is_kernel(variable)]
        self._momentum = momentum
        self._rate = rate
        self._momenta = {}
        for kernel in self.kernels:
            with tf.compat.v1.name_scope(None), tf.compat.v1.colocate_with(kernel):
                self._momenta[kernel.ref()] = _zeros_like(kernel, MOMENTUM_NAME)
                # The momentum optimizer's slot of the kernel, which it no longer updates,
                # kept in checkpoints as it stands, so that the job can go on without the
                # flag (and a checkpoint trained without it restores here).
                _zeros_like(kernel, momentum_optimizer_name)

    def update(self, gradient, kernel):
        """Op: `kernel`'s momentum and weights moved by `gradient`."""
        momentum_variable = self._momenta[kernel.ref()]
        with tf.compat.v1.colocate_with(kernel):
            momentum = momentum_variable.assign(self._momentum * momentum_variable + gradient)
            nesterov = gradient + self._momentum * momentum
            rows, filters = _matrix_shape(kernel.shape)
            direction = tf.reshape(
                orthogonalised(tf.reshape(nesterov, [rows, filters])), kernel.shape)
            weights = kernel.read_value()
            held = weights * (math.sqrt(filters) / (tf.norm(weights) + 1e-12))
            return kernel.assign(held - self._rate * direction)

    def optional_variables(self):
        """The momenta as a checkpoint may lack them: each then starts at zero."""
        return checkpoint_saver.OptionalVariables(
            {momentum.op.name: momentum for momentum in self._momenta.values()},
            "no Muon momenta (trained without --muon-learning-rate): each starts at zero")


def _zeros_like(variable, name):
    """A variable of zeros beside `variable`, named VAR/name, not trained."""
    return tf.compat.v1.Variable(tf.zeros(variable.shape, variable.dtype.base_dtype),
                                 trainable=False, name="%s/%s" % (variable.op.name, name))


class MuonOptimizer(optimizer_wrapper.OptimizerWrapper):
    """Updates the kernels of `momenta` (KernelMomenta) by Muon, and passes every other
    variable's gradient to `optimizer`, which then increments the global step."""

    def __init__(self, optimizer, momenta, name="MuonOptimizer"):
        super().__init__(optimizer, name)
        self._momenta = momenta

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        kernels = {kernel.ref() for kernel in self._momenta.kernels}
        updates, others = [], []
        for gradient, variable in grads_and_vars:
            if gradient is not None and variable.ref() in kernels:
                updates.append(self._momenta.update(gradient, variable))
            else:
                others.append((gradient, variable))
        with tf.control_dependencies(updates):
            return self._optimizer.apply_gradients(others, global_step, name)
