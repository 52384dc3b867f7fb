"""Flag validation of the trainer: every user error is one line and a non-zero exit."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cifar_archives
from cifar10_estimator import cifar10_model, flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import main as trainer
from cifar10_estimator.cli.options import is_option
from cifar10_estimator.distributed import cluster
from cifar10_estimator.errors import UsageError
from cifar10_estimator.settings import recipes
from cifar10_estimator.settings import schedule
from cli_helpers import REPO_ROOT, assert_one_line_error, cli_env, run_module

MODULE = "cifar10_estimator.main"


def run_trainer(*args):
    return run_module(MODULE, list(args), timeout=120)


@pytest.fixture
def base_args(tiny_data_dir, tmp_path):
    return ["--data-dir", tiny_data_dir, "--job-dir", tmp_path / "job", "--num-gpus", "0",
            "--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8"]


def test_help_lists_every_flag_of_the_original_and_the_new_ones():
    result = run_trainer("--help")
    assert result.returncode == 0
    for flag in ("--data-dir", "--job-dir", "--variable-strategy", "--num-gpus", "--num-layers",
                 "--train-steps", "--train-batch-size", "--eval-batch-size", "--momentum",
                 "--weight-decay", "--learning-rate", "--use-distortion-for-training", "--sync",
                 "--num-intra-threads", "--num-inter-threads", "--data-format",
                 "--log-device-placement", "--batch-norm-decay", "--batch-norm-epsilon",
                 "--num-cpu-towers", "--use-synthetic-data", "--save-checkpoints-steps",
                 "--eval-every-secs", "--learning-rate-scaling", "--moving-average-decay",
                 "--eval-flips"):
        assert flag in result.stdout, flag


def test_defaults_are_the_original_tutorials():
    settings = flags.resolve(flags.parse(["--job-dir", "j"]))
    hparams = settings.hparams
    train_steps = schedule.last_step(hparams)
    assert (settings.num_gpus, hparams.num_layers, train_steps, hparams.train_batch_size,
            settings.eval_batch_size, hparams.momentum, hparams.weight_decay,
            hparams.learning_rate, hparams.batch_norm_decay, hparams.batch_norm_epsilon,
            settings.variable_strategy, settings.use_distortion_for_training, hparams.sync,
            settings.data_format, settings.num_intra_threads, settings.num_inter_threads,
            settings.log_device_placement, hparams.learning_rate_scaling) == (
        1, 44, 80000, 128, 100, 0.9, 2e-4, 0.1, 0.997, 1e-5, "CPU", True, False, None,
        0, 0, False, "none")


@pytest.mark.parametrize("text, expected", [("false", False), ("False", False), ("0", False),
                                            ("no", False), ("true", True), ("1", True)])
def test_use_distortion_for_training_is_a_real_boolean(text, expected):
    settings = flags.parse(["--job-dir", "j", "--use-distortion-for-training", text])
    assert settings.use_distortion_for_training is expected


def test_thread_flags_reach_the_session_config(tmp_path):
    settings = flags.parse(
        ["--job-dir", str(tmp_path), "--num-gpus", "0", "--num-cpu-towers", "3",
         "--num-inter-threads", "3", "--num-intra-threads", "2"])
    session_config = trainer.make_run_config(settings).session_config
    assert session_config.inter_op_parallelism_threads == 3
    assert session_config.intra_op_parallelism_threads == 2
    assert session_config.device_count["CPU"] == 3


@pytest.mark.parametrize("extra, fragments", [
    (["--num-layers", "45"], ["--num-layers", "6n+2", "45"]),
    (["--num-gpus", "-1"], ["--num-gpus", "-1"]),
    (["--num-gpus", "0", "--variable-strategy", "GPU"], ["--variable-strategy GPU"]),
    # The nearest batch that splits, the rate scaled as --learning-rate-scaling linear would.
    (["--num-cpu-towers", "3"], ["--train-batch-size 8 does not split evenly over 3 towers; "
                                 "use --train-batch-size 9 --learning-rate 0.1125, the nearest "
                                 "multiple of 3, with the learning rate scaled to it "
                                 "(0.1 x 9/8)"]),
    (["--eval-batch-size", "5"], ["--eval-batch-size 5", "16 validation examples"]),
    (["--eval-batch-size", "5", "--eval-subset", "eval"],
     ["--eval-batch-size 5", "32 eval examples"]),
    (["--train-steps", "0"], ["--train-steps", "positive"]),
    (["--num-cpu-towers", "0"], ["--num-cpu-towers", "positive"]),
    (["--use-distortion-for-training", "maybe"], ["maybe"]),
    (["--num-layers", "many"], ["--num-layers", "many"]),
    (["--moving-average-decay", "1"], ["--moving-average-decay", "between 0 and 1", "'1'"]),
    (["--moving-average-decay", "0"], ["--moving-average-decay", "between 0 and 1", "'0'"]),
    (["--eval-shifts", "9"], ["--eval-shifts 9", "at most 8 pixels"]),
    (["--train-max-shift", "5"], ["--train-max-shift 5", "padded by", "0..4"]),
    (["--use-synthetic-data", "--patch-pca-init"], ["--patch-pca-init", "--use-synthetic-data"]),
    (["--weight-decay-scope", "biases"], ["--weight-decay-scope", "'biases'"]),
    (["--low-resolution", "32"], ["--low-resolution 32", "8..31"]),
    (["--low-resolution", "7"], ["--low-resolution 7", "8..31"]),
    (["--low-resolution-epochs", "1", "--train-steps", "8"],
     ["--low-resolution-epochs 1", "covers the whole run (8 steps", "use fewer"]),
    (["--lower-resolution", "32"], ["--lower-resolution 32", "8..31"]),
    (["--lower-resolution-epochs", "0.5", "--low-resolution-epochs", "0.5", "--train-steps",
      "8"], ["--lower-resolution-epochs 0.5 and --low-resolution-epochs 0.5",
             "cover the whole run (8 steps", "use fewer"]),
    (["--seed", "-1"], ["--seed", "-1"]),
])
def test_flag_errors_are_one_line_with_exit_2(base_args, extra, fragments):
    assert_one_line_error(run_trainer(*(base_args + extra)), 2, *fragments)


def test_more_gpus_than_present_is_one_line_without_tensorflows_import_notices(base_args):
    args = [a for a in base_args] + ["--num-gpus", "64"]
    result = run_module(MODULE, args, timeout=120, env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert_one_line_error(result, 2, "--num-gpus 64", "visible")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_channels_first_on_the_cpu_needs_onednn_kernels(base_args):
    result = run_module(MODULE, base_args + ["--data-format", "channels_first"], timeout=120,
                        env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert_one_line_error(result, 2, "channels_first", "TF_ENABLE_ONEDNN_OPTS=1")


def test_missing_job_dir(tiny_data_dir):
    assert_one_line_error(run_trainer("--data-dir", tiny_data_dir, "--num-gpus", "0"),
                          2, "--job-dir")


def test_missing_data_dir_names_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "nowhere"
    result = run_trainer("--data-dir", missing, "--job-dir", tmp_path / "job", "--num-gpus", "0")
    assert_one_line_error(result, 2, str(missing), "generate_tfrecords")


def test_data_dir_without_train_file_names_the_file(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_trainer("--data-dir", empty, "--job-dir", tmp_path / "job", "--num-gpus", "0")
    assert_one_line_error(result, 2, str(empty / "train.tfrecords"), "generate_tfrecords")


def test_data_dir_flag_is_required_without_synthetic_data(tmp_path):
    result = run_trainer("--job-dir", tmp_path / "job", "--num-gpus", "0")
    assert_one_line_error(result, 2, "--data-dir", "--use-synthetic-data")


def first_training_batch(data_dir, job_dir, distortion, *extra):
    settings = flags.parse(
        ["--data-dir", str(data_dir), "--job-dir", str(job_dir), "--num-gpus", "0",
         "--train-batch-size", "16", "--use-distortion-for-training", distortion, *extra])
    train_input_fn = trainer.make_train_input_fn(settings)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        # What tf.estimator does with the Dataset: the seeds' variable, then the iterator.
        iterator = tf.compat.v1.data.make_initializable_iterator(train_input_fn())
        [images], _ = iterator.get_next()
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(iterator.initializer)
        return session.run(images)


def test_use_distortion_for_training_false_reaches_the_input_pipeline(tmp_path):
    subsets = cifar_archives.make_tiny_tfrecords(str(tmp_path / "data"), num_train=16)
    train_images = subsets["train"][0].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    originals = {image.tobytes() for image in train_images.astype(np.float32)}

    plain = first_training_batch(tmp_path / "data", tmp_path / "job", "false")
    distorted = first_training_batch(tmp_path / "data", tmp_path / "job", "true")

    assert {image.tobytes() for image in plain} == originals  # shuffled, untouched
    assert sum(image.tobytes() not in originals for image in distorted) > 8


def test_train_max_shift_reaches_the_input_pipeline(tmp_path):
    subsets = cifar_archives.make_tiny_tfrecords(str(tmp_path / "data"), num_train=16)
    train_images = subsets["train"][0].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    originals_and_mirrors = {image.tobytes() for image in train_images.astype(np.float32)} | {
        image[:, ::-1].tobytes() for image in train_images.astype(np.float32)}

    unshifted = first_training_batch(tmp_path / "data", tmp_path / "job", "true",
                                     "--train-max-shift", "0")

    assert {image.tobytes() for image in unshifted} <= originals_and_mirrors


def test_a_ps_task_needs_neither_the_gpus_nor_the_data(tmp_path):
    settings = flags.parse(
        ["--job-dir", str(tmp_path / "job"), "--data-dir", str(tmp_path / "on-the-workers"),
         "--num-gpus", "4"])
    spec = {"ps": ["127.0.0.1:2220"], "chief": ["127.0.0.1:2221"]}
    flags.validate(settings, cluster.ClusterTask("ps", 0, spec))
    with pytest.raises(UsageError, match="--num-gpus 4"):
        flags.validate(settings, cluster.ClusterTask("chief", 0, spec))


def test_train_steps_and_train_epochs_exclude_each_other(tmp_path):
    result = run_module("cifar10_estimator.main", [
        "--job-dir", tmp_path, "--use-synthetic-data", "--num-gpus", "0",
        "--train-steps", "10", "--train-epochs", "2"], timeout=120)
    assert_one_line_error(result, 2, "--train-epochs", "not allowed with argument --train-steps")


@pytest.mark.parametrize("given, expected_steps", [
    ([], 80000),
    (["--train-steps", "500"], 500),
    (["--train-epochs", "10"], 3120),
    (["--train-epochs", "10", "--train-batch-size", "64"], 6250),
])
def test_the_last_step_comes_from_steps_epochs_or_the_default(given, expected_steps):
    hparams = flags.resolve(flags.parse(["--job-dir", "j"] + given)).hparams
    assert schedule.last_step(hparams) == expected_steps


@pytest.mark.parametrize("given, workers, rate, described_as", [
    ([], 2, "0.1", "learning rate 0.1, never dropped"),
    (["--learning-rate-scaling", "linear"], 2, "0.2",
     "learning rate 0.2 (0.1 x 256/128, --learning-rate-scaling linear), never dropped"),
    (["--learning-rate-scaling", "linear", "--learning-rate", "0.05"], 4, "0.2",
     "learning rate 0.2 (0.05 x 512/128, --learning-rate-scaling linear), never dropped"),
])
def test_the_log_states_the_learning_rate_the_run_starts_from(tensorflow_info_messages, given,
                                                              workers, rate, described_as):
    settings = flags.resolve(flags.parse(["--job-dir", "j", "--sync", "--train-steps", "1000"]
                                         + given))
    hparams = dataclasses.replace(settings.hparams, num_workers=workers)
    trainer.log_schedule(hparams)
    plan, warning = tensorflow_info_messages
    # Then the run's compute: 1000 steps of the global batch on the tutorial's ResNet-44.
    # and its precision.
    assert plan.endswith("%s; %.1f TFLOP of training in fp32 (float32 throughout, TF32 off)" % (
        described_as, 1000 * 128 * workers * (
            cifar10_model.training_flops_per_example(44, 32)) / 1e12)), plan
    assert "the rate stays %s for the whole run" % rate in warning


def derived_fields():
    """The HParams fields no flag sets: flags.resolve fills them in."""
    return {field.name for field in dataclasses.fields(job_hparams.HParams)
            if not is_option(field)}


def test_every_hyper_parameter_is_a_flag_but_those_derived_on_purpose():
    hparams = flags.resolve(flags.parse(
        ["--job-dir", "j", "--momentum", "0.8", "--train-epochs", "3"])).hparams
    assert (hparams.momentum, hparams.train_epochs, hparams.num_train_examples) == (0.8, 3, 40000)
    assert derived_fields() == {"num_train_examples", "num_workers"}


def test_the_parser_has_a_flag_for_each_declared_option_and_no_other():
    # A flag is its field's name, so renaming one renames the other: they cannot part.
    destinations = {action.dest for action in flags.build_parser()._actions} - {"help"}
    assert destinations == {field.name for field in flags.option_fields()}
    hyper_parameters = {field.name for field in dataclasses.fields(job_hparams.HParams)}
    assert hyper_parameters == (destinations & hyper_parameters) | derived_fields()


def test_resolve_fills_in_what_the_data_the_devices_and_the_cluster_decide():
    spec = {"ps": ["127.0.0.1:2220"], "chief": ["127.0.0.1:2221"],
            "worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    parsed = flags.parse(["--job-dir", "j", "--num-gpus", "0", "--precision", "auto"])
    resolved = flags.resolve(parsed, cluster.ClusterTask("ps", 0, spec))
    # The ps trains nothing: auto takes fp32 there without measuring.
    assert resolved.hparams == dataclasses.replace(
        parsed.hparams, precision="fp32", num_workers=3, num_train_examples=40000)
    assert parsed.hparams.precision == "auto"  # what was parsed stays as it was


def test_the_flags_module_loads_no_tensorflow():
    # The launcher and the converter check flags before TensorFlow's seconds-long import.
    probe = ("import sys; import cifar10_estimator.flags, cifar10_estimator.generate_tfrecords, "
             "cifar10_estimator.distributed.local_cluster; print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_recipe_sets_its_values_and_the_flags_given_override_them():
    settings = flags.parse(["--job-dir", "j", "--recipe", "budget", "--num-layers", "8",
                            "--label-smoothing", "0.2"])
    hparams = settings.hparams
    assert (hparams.recipe, hparams.num_layers, hparams.label_smoothing) == ("budget", 8, 0.2)
    assert (hparams.train_epochs, hparams.train_batch_size, settings.eval_batch_size,
            hparams.precision, hparams.nesterov, hparams.eval_flips, hparams.eval_shifts) == (
        30, 64, 500, "auto", True, True, 1)
    assert (hparams.recipe, hparams.learning_rate_schedule, hparams.weight_decay,
            hparams.weight_decay_scope, hparams.moving_average_decay) == (
        "budget", "cosine", 5e-4, "kernels", 0.999)


@pytest.mark.parametrize("recipe, given, expected_steps", [
    ("budget", ["--train-steps", "500"], 500),
    ("paper", ["--train-epochs", "2"], 2 * (40000 // 128)),
    ("paper", [], 64000),
])
def test_a_run_length_given_replaces_the_recipes_whichever_form_it_takes(
        recipe, given, expected_steps):
    # As parsed: the budget recipe's --precision auto is only decided by resolve.
    hparams = flags.parse(["--job-dir", "j", "--recipe", recipe] + given).hparams
    assert schedule.last_step(hparams) == expected_steps


def test_without_a_recipe_the_trainer_is_the_tutorials_and_says_so_in_hparams():
    settings = flags.resolve(flags.parse(["--job-dir", "j"]))
    assert settings.hparams == job_hparams.DEFAULTS
    assert job_hparams.DEFAULTS.recipe == "tutorial"


# The flags the manual's measured runs of a recipe gave before it had its name, and those
# its rows of docs/runs.csv add to the name to train the same (the sprint recipe before it
# took Muon and no weight decay).
SPELLED_OUT = {
    "sprint": (["--recipe", "quick", "--lower-resolution-epochs", "7",
                "--low-resolution-epochs", "7", "--train-batch-size", "128",
                "--learning-rate", "0.2", "--moving-average-decay", "0.998"],
               ["--muon-learning-rate", "0", "--weight-decay", "5e-4"]),
    "dash": (["--recipe", "sprint", "--train-epochs", "17", "--lower-resolution-epochs", "5.95",
              "--low-resolution-epochs", "5.95"], []),
    "long": (["--recipe", "quick", "--num-layers", "20", "--train-epochs", "40",
              "--lower-resolution-epochs", "12", "--low-resolution-epochs", "12"], []),
}


@pytest.mark.parametrize("recipe", sorted(SPELLED_OUT))
def test_a_named_recipe_trains_what_its_measured_command_spelled_out(recipe):
    spelled_out_flags, added_flags = SPELLED_OUT[recipe]
    named = flags.parse(["--job-dir", "j", "--recipe", recipe] + added_flags)
    spelled_out = flags.parse(["--job-dir", "j"] + spelled_out_flags)
    assert named.hparams.recipe == recipe
    assert named == dataclasses.replace(
        spelled_out, hparams=dataclasses.replace(spelled_out.hparams, recipe=recipe))


@pytest.mark.parametrize("recipe", sorted(recipes.RECIPES))
def test_a_recipe_names_only_declared_options(recipe):
    declared = {field.name for field in flags.option_fields()}
    assert sorted(set(recipes.RECIPES[recipe]) - declared) == []


def test_an_unknown_recipe_is_one_line_naming_the_known_ones(base_args):
    result = run_trainer(*(base_args + ["--recipe", "fast"]))
    assert_one_line_error(result, 2, "--recipe", "budget", "paper", "tutorial")


@pytest.mark.slow
def test_the_plan_line_and_hparams_json_name_the_recipe_and_the_low_resolution_phases(
        base_args, tmp_path):
    # 64 tiny training images at 8 a step: 8 steps an epoch, so 0.5 epochs are 4 steps
    # and 1.5 more end at step 16; the network trains at 8, 16 and 32 pixels.
    result = run_trainer(*(base_args + ["--recipe", "paper", "--train-steps", "20",
                                        "--eval-batch-size", "8", "--lower-resolution-epochs",
                                        "0.5", "--lower-resolution", "8",
                                        "--low-resolution-epochs", "1.5",
                                        "--low-resolution", "16"]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Recipe paper. Training to step 20 " in result.stderr
    assert ("images 8x8 until step 4 (0.5 epochs), 16x16 until step 16 (1.5 epochs), then "
            "32x32") in result.stderr
    assert "test accuracy" in result.stdout
    saved = json.loads((tmp_path / "job" / "hparams.json").read_text())["runs"][-1]["hparams"]
    assert (saved["recipe"], saved["weight_decay"], saved["learning_rate_drops"],
            saved["num_layers"], saved["train_steps"]) == ("paper", 1e-4, "paper", 8, 20)
    assert (saved["low_resolution_epochs"], saved["low_resolution"]) == (1.5, 16)
    assert (saved["lower_resolution_epochs"], saved["lower_resolution"]) == (0.5, 8)
    # The layout the network computed in, which the devices decided, is recorded too.
    assert saved["data_format"] == "channels_last"
