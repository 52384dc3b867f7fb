"""--muon-learning-rate: the kernels' orthogonalised updates at a held norm, the other
variables' momentum updates, the compute they add, and continuations from checkpoints
without the momenta."""

import math

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10_model
from cifar10_estimator import compute_accounting
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import model_fn
from cifar10_estimator.training import muon
from cifar10_estimator.settings import schedule

from small_jobs import checkpoint_values, train

MOMENTUM_SUFFIX = "/" + muon.MOMENTUM_NAME


def singular_values(matrix):
    return np.linalg.svd(matrix, compute_uv=False)


@pytest.mark.parametrize("shape", [(576, 64), (64, 576), (27, 16), (32, 32)])
def test_the_iteration_brings_every_singular_value_near_one(shape):
    # A gradient-like matrix: its directions' strengths spread over a factor of 100.
    generator = np.random.default_rng(0)
    rank = min(shape)
    left, _ = np.linalg.qr(generator.normal(size=(shape[0], rank)))
    right, _ = np.linalg.qr(generator.normal(size=(shape[1], rank)))
    matrix = left @ np.diag(np.geomspace(100.0, 1.0, rank)) @ right.T
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        result = session.run(muon.orthogonalised(tf.constant(matrix, tf.float32)))
    assert result.shape == shape
    values = singular_values(result)
    # The quintic iteration leaves them between about 0.7 and 1.2 (Jordan et al.); the
    # weakest direction is raised 40-fold relative to the strongest.
    assert 0.5 < values.min() and values.max() < 1.3, values


@pytest.mark.parametrize("shape", [(144, 16), (16, 144)])
def test_the_iteration_is_jordan_et_als_quintic_as_written(shape):
    # X <- a X + b A X + c A A X with A = X X^T, in float64 from the matrix over its norm
    # (X^T X on the right for a tall matrix): the graph sums the polynomial on the small
    # side instead, which must come to the same.
    matrix = np.random.default_rng(3).normal(size=shape)
    a, b, c = muon.NEWTON_SCHULZ_COEFFICIENTS
    x = matrix / np.linalg.norm(matrix)
    for _ in range(muon.NEWTON_SCHULZ_STEPS):
        if shape[0] > shape[1]:
            gram = x.T @ x
            x = a * x + b * x @ gram + c * x @ gram @ gram
        else:
            gram = x @ x.T
            x = a * x + b * gram @ x + c * gram @ gram @ x
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        result = session.run(muon.orthogonalised(tf.constant(matrix, tf.float32)))
    np.testing.assert_allclose(result, x, rtol=1e-3, atol=1e-5)
    # Five iterations moved it: the test would not pass on the normalised input.
    assert np.abs(x - matrix / np.linalg.norm(matrix)).max() > 1e-2


def test_a_tall_matrix_gets_the_transpose_of_what_its_transpose_gets():
    # The iteration works on the smaller side's Gram matrix whichever way the matrix
    # stands; a kernel's [fan-in, filters] matrix is tall, its transpose wide.
    tall = np.random.default_rng(1).normal(size=(288, 32))
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        from_tall, from_wide = session.run(
            [muon.orthogonalised(tf.constant(tall, tf.float32)),
             muon.orthogonalised(tf.constant(tall.T, tf.float32))])
    np.testing.assert_allclose(from_tall, from_wide.T, rtol=1e-4, atol=1e-5)
    # Not the identity's trivial agreement: the result is no multiple of the input.
    assert np.abs(from_tall / np.linalg.norm(from_tall)
                  - tall / np.linalg.norm(tall)).max() > 1e-2


def test_the_update_flops_are_those_of_the_products_counted_by_hand():
    # One 3x3 kernel from 64 to 64 channels: the 64 x 576 form, 5 iterations of
    # 2 x 64 x 64 x 576 twice and 2 x 64^3 once.
    assert muon.step_flops([(3, 3, 64, 64)]) == 5 * (4 * 64 * 64 * 576 + 2 * 64 ** 3)
    hparams = job_hparams.HParams(num_layers=14, train_batch_size=128)
    plain = compute_accounting.training_compute(hparams).flops()
    with_muon = compute_accounting.training_compute(
        job_hparams.HParams(num_layers=14, train_batch_size=128, muon_learning_rate=0.2))
    shapes = cifar10_model.kernel_shapes(14)
    assert len(shapes) == 13 and shapes[-1] == (3, 3, 64, 64)
    assert with_muon.flops() == pytest.approx(
        plain + schedule.last_step(hparams) * muon.step_flops(shapes))


def test_a_kernel_keeps_its_norm_and_moves_by_an_orthogonal_step_the_rest_by_momentum():
    rate, momentum = 0.1, 0.6
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        kernel = tf.compat.v1.Variable(
            np.random.default_rng(1).normal(size=(3, 3, 8, 16)).astype(np.float32) * 3,
            name="conv2d/kernel")
        bias = tf.compat.v1.Variable(np.zeros(16, np.float32), name="dense/bias")
        inputs = tf.constant(np.random.default_rng(2).normal(size=(4, 6, 6, 8)), tf.float32)
        outputs = tf.nn.conv2d(inputs, kernel, 1, "SAME") + bias
        loss = tf.reduce_mean(tf.square(outputs - 1.0))
        momenta = muon.KernelMomenta([kernel, bias], momentum, tf.constant(rate), "Momentum")
        optimizer = muon.MuonOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5), momenta)
        gradients = optimizer.compute_gradients(loss)
        step = optimizer.apply_gradients(gradients, global_step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before, bias_gradient = session.run([kernel, gradients[1][0]])
            session.run(step)
            after, bias_after, step_reached = session.run([kernel, bias, global_step])
    assert step_reached == 1
    # The bias, not a kernel, had plain gradient descent at its own rate.
    np.testing.assert_allclose(bias_after, -0.5 * bias_gradient, rtol=1e-5)
    # The kernel: its norm held at sqrt(filters), then a step of rate x an orthogonal
    # matrix, whose 16 singular values are near 1.
    held = before * math.sqrt(16) / np.linalg.norm(before)
    values = singular_values(((held - after) / rate).reshape(72, 16))
    assert 0.5 < values.min() and values.max() < 1.3, values
    assert np.linalg.norm(after) == pytest.approx(4.0, rel=0.1)


def resnet8_training_graph(**fields):
    """The graph of the model_fn's training step of ResNet-8 with the HParams `fields`."""
    graph = tf.Graph()
    with graph.as_default():
        hparams = job_hparams.HParams(num_layers=8, train_batch_size=2, **fields)
        model_fn.make_model_fn(model_fn.TowerLayout.for_devices(num_gpus=0), hparams)(
            [tf.zeros([2, 32, 32, 3])], [tf.constant([1, 2])], tf.estimator.ModeKeys.TRAIN,
            None)
    return graph


def test_a_checkpoint_of_a_run_with_muon_restores_into_one_without_it(tmp_path):
    # Muon keeps the kernels' momentum slots under the momentum optimizer's name
    # (optimizer_stack.MOMENTUM_OPTIMIZER_NAME): a run without Muon finds each there.
    with resnet8_training_graph(muon_learning_rate=0.05).as_default():
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            checkpoint = tf.compat.v1.train.Saver().save(session, str(tmp_path / "muon.ckpt"))
    saved = dict(tf.train.list_variables(checkpoint))
    with resnet8_training_graph().as_default():
        variables = {variable.op.name: variable.shape.as_list()
                     for variable in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session() as session:
            # A Saver of every variable of the run: any the checkpoint lacks fails here.
            tf.compat.v1.train.Saver().restore(session, checkpoint)
    kernels = [name for name, shape in variables.items()
               if name.endswith("/kernel") and len(shape) == 4]
    assert len(kernels) == len(cifar10_model.kernel_shapes(8))
    # The checkpoints' names of the slots, VAR/Momentum, as every earlier job wrote them.
    assert all(saved[kernel + "/Momentum"] == variables[kernel] for kernel in kernels)
    # Beyond the run's variables the checkpoint holds Muon's momenta alone.
    assert sorted(set(saved) - set(variables)) == sorted(
        kernel + MOMENTUM_SUFFIX for kernel in kernels)


@pytest.mark.slow
def test_a_job_continues_with_muon_from_a_checkpoint_without_momenta_and_back(
        tmp_path, tensorflow_info_messages):
    job_dir = tmp_path / "job"
    train(job_dir, 2)
    at_2 = checkpoint_values(str(job_dir / "model.ckpt-2"))
    assert not [name for name in at_2 if name.endswith(MOMENTUM_SUFFIX)]

    train(job_dir, 4, muon_learning_rate=0.05)
    assert any("model.ckpt-2 holds no Muon momenta" in message
               for message in tensorflow_info_messages)
    at_4 = checkpoint_values(str(job_dir / "model.ckpt-4"))
    momenta = {name[:-len(MOMENTUM_SUFFIX)]: value for name, value in at_4.items()
               if name.endswith(MOMENTUM_SUFFIX)}
    # One momentum per convolution kernel of ResNet-8 (7), none for other variables.
    assert len(momenta) == len(cifar10_model.kernel_shapes(8))
    for name, value in momenta.items():
        assert value.shape == at_4[name].shape and np.abs(value).max() > 0, name
        filters = value.shape[-1]
        assert np.linalg.norm(at_4[name]) == pytest.approx(math.sqrt(filters), rel=0.1)

    # Without the flag the momenta are ignored and training goes on.
    train(job_dir, 5)
    assert "global_step" in checkpoint_values(str(job_dir / "model.ckpt-5"))
