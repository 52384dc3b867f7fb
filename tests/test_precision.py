"""--precision: mixed bf16 and fp16 training, float32 variables and exports, fp16 loss scaling."""

import glob
import json

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import input_fn, model_fn
from cifar10_estimator import main as trainer
from cifar10_estimator.errors import UsageError
from cifar10_estimator.machine import hardware
from cifar10_estimator.settings import precision
from cifar10_estimator.training import mixed_precision
from cli_helpers import assert_one_line_error, run_module

TRAINER = "cifar10_estimator.main"
TINY_FLAGS = ["--num-gpus", "0", "--num-layers", "8", "--train-batch-size", "8",
              "--eval-batch-size", "8"]


def this_cpu_trains_bf16():
    return precision.unsupported_reason(
        precision.policy("bf16"), 0, hardware.cpu_flags(), hardware.onednn_enabled()) is None


def this_cpu_has_bf16_instructions():
    return any(flag in hardware.cpu_flags() for flag in precision.policy("bf16").cpu_flags_needed)


needs_bf16_cpu = pytest.mark.skipif(not this_cpu_trains_bf16(),
                                    reason="this CPU has no bfloat16 instructions")


def test_every_precision_has_a_compute_dtype():
    assert precision.PRECISIONS == ("fp32", "tf32", "bf16", "fp16")
    assert [tf.as_dtype(precision.policy(name).compute_dtype) for name in precision.PRECISIONS] == [
        tf.float32, tf.float32, tf.bfloat16, tf.float16]
    assert [precision.policy(name).loss_scaling for name in precision.PRECISIONS] == [
        False, False, False, True]
    # TF32 is a choice of its own: no other precision lets TensorFlow take it.
    assert [precision.policy(name).tensor_float_32 for name in precision.PRECISIONS] == [
        False, True, False, False]
    assert job_hparams.DEFAULTS.precision == "fp32"


@pytest.mark.parametrize("precision_name, num_gpus, cpu_flags, onednn, gpus, fragments", [
    ("bf16", 0, {"avx512f"}, True, (), ["avx512_bf16", "--precision fp32"]),
    ("bf16", 0, {"avx512_bf16"}, False, (), ["TF_ENABLE_ONEDNN_OPTS=1", "--precision fp32"]),
    ("fp16", 0, {"avx512_bf16"}, True, (), ["for GPUs", "--precision bf16"]),
    ("fp16", 0, {"avx2"}, True, (), ["for GPUs", "--precision fp32"]),
    ("bf16", 2, set(), False, ((8, 0), (7, 5)), ["8.0", "7.5", "--precision fp16"]),
    ("tf32", 0, {"avx512_bf16"}, True, (), ["--precision tf32 is for GPUs of compute "
                                            "capability 8.0", "use --precision fp32"]),
    ("tf32", 1, set(), False, ((7, 5),), ["--precision tf32 needs GPUs of compute capability "
                                          "8.0 or newer, and one here is 7.5: use --precision "
                                          "fp32"]),
])
def test_a_precision_the_machine_cannot_serve_names_what_to_use(
        precision_name, num_gpus, cpu_flags, onednn, gpus, fragments):
    reason = precision.unsupported_reason(precision.policy(precision_name), num_gpus, cpu_flags,
                                          onednn, gpus)
    for fragment in fragments:
        assert fragment in reason


@pytest.mark.parametrize("precision_name, num_gpus, cpu_flags, gpus", [
    ("fp32", 0, set(), ()),
    ("bf16", 0, {"amx_bf16"}, ()),
    ("bf16", 0, {"avx512_bf16"}, ()),
    ("bf16", 1, set(), ((8, 6),)),
    ("fp16", 1, set(), ((7, 0),)),
    ("tf32", 2, set(), ((8, 0), (9, 0))),
])
def test_a_precision_the_machine_serves_passes(precision_name, num_gpus, cpu_flags, gpus):
    assert precision.unsupported_reason(precision.policy(precision_name), num_gpus, cpu_flags,
                                        True, gpus) is None


@pytest.mark.parametrize("extra, env, fragments", [
    (["--precision", "fp16"], {}, ["--precision fp16", "for GPUs"]),
    # With oneDNN off, bf16 is refused for the first reason that holds on this CPU: the
    # kernels where it has bfloat16 instructions, the instructions where it has none.
    (["--precision", "bf16"], {"TF_ENABLE_ONEDNN_OPTS": "0"},
     ["--precision bf16", "TF_ENABLE_ONEDNN_OPTS=1" if this_cpu_has_bf16_instructions()
      else "which this CPU lacks"]),
])
def test_the_trainer_refuses_an_unserved_precision_in_one_line(tiny_data_dir, tmp_path, extra,
                                                               env, fragments):
    job_dir = tmp_path / "job"
    result = run_module(TRAINER, ["--data-dir", tiny_data_dir, "--job-dir", job_dir]
                        + TINY_FLAGS + extra, timeout=120, env=env)
    assert_one_line_error(result, 2, *fragments)
    assert not job_dir.exists()  # refused before anything was built or written


def resolved(monkeypatch, tmp_path, capabilities, *extra):
    """flags.resolve of a run on GPUs described by `capabilities` ((major, minor) each)."""
    monkeypatch.setattr(hardware, "num_gpus_visible", lambda: len(capabilities))
    monkeypatch.setattr(hardware, "gpu_compute_capabilities",
                        lambda count: list(capabilities)[:count])
    settings = flags.parse(["--job-dir", str(tmp_path / "job"), "--use-synthetic-data",
                            "--num-gpus", str(len(capabilities)), "--train-batch-size", "8",
                            "--eval-batch-size", "8"] + list(extra))
    flags.validate(settings)
    return flags.resolve(settings)


A100, V100 = (8, 0), (7, 0)


@pytest.mark.parametrize("capabilities, extra, expected", [
    ([A100, A100], ["--precision", "auto"], "tf32"),
    ([V100], ["--precision", "auto"], "fp32"),
    ([A100], ["--precision", "auto", "--deterministic", "--seed", "1"], "fp32"),
    ([A100], ["--precision", "tf32"], "tf32"),
    ([A100], [], "fp32"),  # the default: float32 throughout, on any GPU
])
def test_the_precision_a_gpu_run_takes(monkeypatch, tmp_path, capabilities, extra, expected):
    assert resolved(monkeypatch, tmp_path, capabilities, *extra).hparams.precision == expected


@pytest.mark.parametrize("capabilities, extra, fragments", [
    ([A100], ["--precision", "tf32", "--deterministic", "--seed", "1"],
     ["--deterministic runs in fp32; drop --precision tf32"]),
    ([V100, V100], ["--precision", "tf32"], ["--precision tf32 needs GPUs of compute "
                                             "capability 8.0", "7.0", "use --precision fp32"]),
])
def test_tf32_where_it_cannot_be_is_refused(monkeypatch, tmp_path, capabilities, extra,
                                            fragments):
    with pytest.raises(UsageError) as raised:
        resolved(monkeypatch, tmp_path, capabilities, *extra)
    for fragment in fragments:
        assert fragment in str(raised.value)


@pytest.fixture
def tensor_float_32_restored():
    """TensorFlow's TF32 switch is the process's: back to its default after the test."""
    yield
    tf.config.experimental.enable_tensor_float_32_execution(True)


@pytest.mark.parametrize("extra, enabled, plan", [
    ([], False, "in fp32 (float32 throughout, TF32 off)"),
    (["--deterministic", "--seed", "3"], False, "in fp32 (float32 throughout, TF32 off)"),
    (["--precision", "tf32"], True,
     "in tf32 (float32, its matrix multiplies and convolutions in TF32 on the GPUs' tensor "
     "cores)"),
])
def test_after_the_trainers_setup_tf32_is_on_only_where_asked_and_the_plan_line_says_so(
        monkeypatch, tmp_path, tensor_float_32_restored, tensorflow_info_messages, extra,
        enabled, plan):
    # deterministic's op determinism is the process's too: the trainer's switch alone is run.
    monkeypatch.setattr(tf.config.experimental, "enable_op_determinism", lambda: None)
    settings = resolved(monkeypatch, tmp_path, [A100], *extra)
    tf.config.experimental.enable_tensor_float_32_execution(not enabled)
    trainer.start_job(settings, None, trainer.make_run_config(settings), "channels_first")
    assert tf.config.experimental.tensor_float_32_execution_enabled() is enabled
    (line,) = [message for message in tensorflow_info_messages if message.startswith("Recipe ")]
    assert line.endswith(plan), line


def graph_of_mode(mode, precision_name, num_towers=2, **options):
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=4, precision=precision_name,
                                  **options)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=num_towers)
    graph = tf.Graph()
    with graph.as_default():
        images = tf.zeros([4, 32, 32, 3])
        labels = tf.zeros([4], tf.int32)
        if mode == tf.estimator.ModeKeys.PREDICT:
            model_fn.make_model_fn(layout, hparams)(images, None, mode, None)
        else:
            image_shards, label_shards = input_fn.split_batch_into_towers(images, labels,
                                                                          num_towers)
            model_fn.make_model_fn(layout, hparams)(image_shards, label_shards, mode, None)
    return graph


def conv_dtypes(graph):
    return {op.get_attr("T") for op in graph.get_operations()
            if op.type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")}


@pytest.mark.parametrize("precision_name, dtype", [("bf16", tf.bfloat16), ("fp16", tf.float16)])
def test_mixed_precision_trains_in_its_type_on_float32_variables(precision_name, dtype):
    graph = graph_of_mode(tf.estimator.ModeKeys.TRAIN, precision_name)
    assert conv_dtypes(graph) == {dtype}
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    assert {v.dtype.base_dtype for v in variables} <= {tf.float32, tf.int64}
    loss = graph.get_tensor_by_name("mean_loss:0")
    assert loss.dtype == tf.float32


@pytest.mark.parametrize("mode", [tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.PREDICT])
def test_evaluation_and_prediction_compute_in_float32_whatever_the_precision(mode):
    assert conv_dtypes(graph_of_mode(mode, "bf16")) == {tf.float32}


@pytest.mark.parametrize("precision_name, dtype", [("bf16", tf.bfloat16), ("fp16", tf.float16),
                                                   ("fp32", tf.float32)])
def test_evaluation_in_training_precision_computes_in_it_and_keeps_float32_outputs(
        precision_name, dtype):
    graph = graph_of_mode(tf.estimator.ModeKeys.EVAL, precision_name,
                          eval_in_training_precision=True, eval_flips=True)
    assert conv_dtypes(graph) == {dtype}
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    assert {v.dtype.base_dtype for v in variables} <= {tf.float32, tf.int64}
    assert graph.get_tensor_by_name("mean_loss:0").dtype == tf.float32


def test_prediction_and_exports_stay_float32_with_evaluation_in_training_precision():
    graph = graph_of_mode(tf.estimator.ModeKeys.PREDICT, "bf16", eval_in_training_precision=True)
    assert conv_dtypes(graph) == {tf.float32}


def test_bf16_evaluation_agrees_with_float32_on_the_same_weights(tmp_path):
    """The same weights and images evaluated both ways: bfloat16's 8-bit mantissa moves
    the probabilities a little and leaves them float32."""
    images_value = np.random.RandomState(3).randint(0, 256, (8, 32, 32, 3)).astype(np.float32)
    checkpoint = str(tmp_path / "model.ckpt")
    probabilities = {}
    for eval_in_training_precision in (False, True):
        hparams = job_hparams.HParams(num_layers=8, precision="bf16",
                                      eval_in_training_precision=eval_in_training_precision)
        with tf.Graph().as_default():
            spec = model_fn.make_model_fn(model_fn.TowerLayout.for_devices(0), hparams)(
                [tf.constant(images_value)], [tf.zeros([8], tf.int32)],
                tf.estimator.ModeKeys.EVAL, None)
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as session:
                if eval_in_training_precision:
                    saver.restore(session, checkpoint)
                else:
                    session.run(tf.compat.v1.global_variables_initializer())
                    saver.save(session, checkpoint)
                probabilities[eval_in_training_precision] = session.run(
                    spec.predictions["probabilities"])
    assert probabilities[True].dtype == np.float32
    np.testing.assert_allclose(probabilities[True], probabilities[False], atol=0.02)
    assert not np.array_equal(probabilities[True], probabilities[False])


def test_fp16_logs_and_summarises_its_loss_scale():
    graph = graph_of_mode(tf.estimator.ModeKeys.TRAIN, "fp16")
    summaries = {t.op.name for t in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)}
    assert "loss_scale" in summaries
    assert "loss_scale" not in {t.op.name for t in graph_of_mode(
        tf.estimator.ModeKeys.TRAIN, "bf16").get_collection(tf.compat.v1.GraphKeys.SUMMARIES)}


class Fp16Step:
    """One fp16 train step of the real model_fn on 2 logical CPU towers, fed image batches."""

    def __init__(self, batch_size=4):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.images = tf.compat.v1.placeholder(tf.float32, [batch_size, 32, 32, 3])
            labels = tf.constant(np.arange(batch_size) % 10, tf.int32)
            hparams = job_hparams.HParams(num_layers=8, train_batch_size=batch_size,
                                          precision="fp16")
            layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=2)
            image_shards, label_shards = input_fn.split_batch_into_towers(self.images, labels, 2)
            self.spec = model_fn.make_model_fn(layout, hparams)(
                image_shards, label_shards, tf.estimator.ModeKeys.TRAIN, None)
            self.scale, self.good_steps = [
                v for v in tf.compat.v1.global_variables()
                if v.op.name.startswith("dynamic_loss_scale/")]
            self.global_step = tf.compat.v1.train.get_global_step()
            # Everything a step may change but the batch-norm moving averages, which come
            # from the forward pass (finite on a skipped step) and tower 0 alone.
            self.trained = [v for v in tf.compat.v1.global_variables()
                            if "moving_" not in v.op.name
                            and not v.op.name.startswith(("dynamic_loss_scale/", "global_step"))]
            config = tf.compat.v1.ConfigProto(device_count={"CPU": 2}, allow_soft_placement=True)
            self.session = tf.compat.v1.Session(config=config)
            self.session.run(tf.compat.v1.global_variables_initializer())

    def values(self):
        return self.session.run(self.trained)

    def run(self, images):
        self.session.run(self.spec.train_op, {self.images: images})
        return self.session.run([self.scale, self.good_steps, self.global_step])


def batch(seed=0, size=4):
    return np.random.RandomState(seed).uniform(0, 255, (size, 32, 32, 3)).astype(np.float32)


def assert_unchanged(before, after):
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


def test_fp16_step_with_an_overflow_in_one_tower_is_skipped_by_every_tower():
    step = Fp16Step()
    scale, good_steps, global_step = step.run(batch(0))
    assert (scale, good_steps, global_step) == (mixed_precision.INITIAL_LOSS_SCALE, 1, 1)

    before = step.values()
    overflowing = batch(1)
    overflowing[3, 0, 0, 0] = 1e6  # beyond float16's 65504, in the second tower's half
    scale, good_steps, global_step = step.run(overflowing)
    assert_unchanged(before, step.values())
    assert (scale, good_steps, global_step) == (mixed_precision.INITIAL_LOSS_SCALE / 2, 0, 2)

    scale, good_steps, global_step = step.run(batch(2))
    assert (scale, good_steps, global_step) == (mixed_precision.INITIAL_LOSS_SCALE / 2, 1, 3)
    after = step.values()
    assert any(not np.array_equal(old, new) for old, new in zip(before, after))
    assert all(np.all(np.isfinite(value)) for value in after)


@pytest.mark.slow
def test_fp16_gradients_overflowing_a_too_large_scale_lower_it_until_steps_apply(monkeypatch):
    # Scaled gradients beyond float16's range (2**24 x ~1e-2 > 65504) overflow in the
    # backward pass only; the scale halves step by step until they fit (at 2**16 for this
    # batch, 8 halvings), then steps apply.
    initial_scale = 2.0 ** 24
    monkeypatch.setattr(mixed_precision, "INITIAL_LOSS_SCALE", initial_scale)
    step = Fp16Step()
    before = step.values()
    scale, _, _ = step.run(batch(0))
    assert scale == initial_scale / 2
    assert_unchanged(before, step.values())
    for _ in range(24):
        scale, good_steps, _ = step.run(batch(0))
        if good_steps:
            break
    assert good_steps == 1 and 1.0 <= scale < initial_scale / 2
    assert any(not np.array_equal(old, new) for old, new in zip(before, step.values()))


def loss_scale_after(finite_steps, growth_steps=3, initial_scale=8.0):
    with tf.Graph().as_default():
        loss_scale = mixed_precision.DynamicLossScale(initial_scale, growth_steps)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = loss_scale.update(finite)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in finite_steps:
                session.run(update, {finite: value})
            return session.run([loss_scale.scale, loss_scale.good_steps])


@pytest.mark.parametrize("finite_steps, expected", [
    ([True, True], [8.0, 2]),
    ([True, True, True], [16.0, 0]),
    ([True, True, True, True, True, True], [32.0, 0]),
    ([True, True, False, True, True], [4.0, 2]),
    ([False] * 5, [1.0, 0]),  # never below MIN_LOSS_SCALE
])
def test_the_scale_doubles_after_a_run_of_good_steps_and_halves_on_overflow(finite_steps,
                                                                             expected):
    assert loss_scale_after(finite_steps) == expected


def test_minimize_through_the_loss_scale_takes_the_unscaled_step():
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable("v", initializer=5.0, use_resource=True)
        loss_scale = mixed_precision.DynamicLossScale(initial_scale=1024.0)
        optimizer = mixed_precision.LossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5), loss_scale)
        step = optimizer.minimize(3.0 * variable)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(step)
            assert session.run(variable) == 5.0 - 0.5 * 3.0
            assert session.run(loss_scale.scale) == 1024.0


def estimator_of(job_dir, precision_name):
    hparams = job_hparams.HParams(num_layers=8, train_batch_size=4, precision=precision_name)
    layout = model_fn.TowerLayout.for_devices(num_gpus=0, num_cpu_towers=1)
    return tf.estimator.Estimator(model_fn.make_model_fn(layout, hparams), model_dir=job_dir)


def checkpoint_variables(job_dir):
    return dict(tf.train.list_variables(tf.train.latest_checkpoint(job_dir)))


@pytest.mark.slow
def test_a_job_resumes_in_another_precision_from_float32_checkpoints(tmp_path):
    job_dir = str(tmp_path / "job")
    train_input_fn = input_fn.make_synthetic_input_fn(1, 4)
    estimator_of(job_dir, "fp32").train(train_input_fn, max_steps=2)
    assert "dynamic_loss_scale/scale" not in checkpoint_variables(job_dir)

    # No loss scale in the fp32 checkpoint: fp16 starts it, and then keeps it.
    estimator_of(job_dir, "fp16").train(train_input_fn, max_steps=4)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(job_dir))
    assert reader.get_tensor("global_step") == 4
    assert reader.get_tensor("dynamic_loss_scale/scale") > 0
    assert all(reader.get_variable_to_dtype_map()[name] in (tf.float32, tf.int64)
               for name in checkpoint_variables(job_dir))

    estimator_of(job_dir, "fp32").train(train_input_fn, max_steps=6)
    assert tf.train.load_checkpoint(tf.train.latest_checkpoint(job_dir)).get_tensor(
        "global_step") == 6


@pytest.mark.slow
@needs_bf16_cpu
def test_a_bf16_job_exports_float32_serves_predict_and_evaluate_and_resumes_in_fp32(
        tiny_data_dir, tmp_path):
    job_dir = tmp_path / "job"
    common = ["--data-dir", tiny_data_dir, "--job-dir", job_dir] + TINY_FLAGS
    # Evaluating in bf16 during training leaves the exports float32.
    result = run_module(TRAINER, common + ["--precision", "bf16", "--train-steps", "4",
                                           "--eval-in-training-precision"])
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = json.loads((job_dir / "hparams.json").read_text())["runs"][-1]["hparams"]
    assert recorded["precision"] == "bf16" and recorded["eval_in_training_precision"]

    (export_dir,) = glob.glob(str(job_dir / "export" / "latest" / "*"))
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as session:
        tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        assert conv_dtypes(graph) == {tf.float32}
        assert not [op for op in graph.get_operations()
                    if op.type == "Cast" and op.get_attr("DstT") == tf.bfloat16]

    image = tmp_path / "image.png"
    pixels = np.random.RandomState(0).randint(0, 256, (32, 32, 3), dtype=np.uint8)
    image.write_bytes(tf.io.encode_png(pixels).numpy())
    predicted = run_module("cifar10_estimator.serving.predict",
                           ["--export-dir", job_dir / "export" / "latest", image], timeout=120)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert "image.png" in predicted.stdout
    evaluated = run_module("cifar10_estimator.serving.evaluate",
                           ["--job-dir", job_dir, "--data-dir", tiny_data_dir], timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    result = run_module(TRAINER, common + ["--precision", "fp32", "--train-steps", "6"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert tf.train.load_checkpoint(str(job_dir)).get_tensor("global_step") == 6
