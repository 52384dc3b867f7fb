"""A GPU box, played by a stand-in nvidia-smi listing two GPUs that this machine's TensorFlow
cannot use: the trainer's one-line refusal, the one command's plan and its check after the
install, and CUDA_VISIBLE_DEVICES read alike by the script and the trainer."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import stand_ins
from cifar10_estimator import flags
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator import main as trainer
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.distributed import cluster, local_cluster
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.machine import hardware
from cifar10_estimator.serving import evaluate
from cifar10_estimator.settings import schedule
from cli_helpers import REPO_ROOT, assert_one_line_error, cli_env, run_module

MODULE = "cifar10_estimator.main"
SETUP_AND_RUN = os.path.join(REPO_ROOT, "scripts", "setup_and_run.sh")
LISTED = "the NVIDIA driver lists 2 (GPU 0: NVIDIA A100-SXM4-80GB, GPU 1: NVIDIA A100-SXM4-80GB)"


@pytest.fixture
def two_gpus_listed(tmp_path):
    """Environment variables whose PATH starts with a stand-in nvidia-smi listing two GPUs."""
    if hardware.num_gpus_visible():
        pytest.skip("TensorFlow sees GPUs here: the stand-in driver would not be the only one")
    driver = stand_ins.nvidia_smi_dir(tmp_path / "driver")
    return {"PATH": str(driver) + os.pathsep + os.environ["PATH"]}


@pytest.mark.slow
@pytest.mark.parametrize("num_gpus_flags, asked", [(["--num-gpus", "2"], "--num-gpus 2 asked"),
                                                   ([], "--num-gpus 1 asked")])  # the default
def test_gpus_tensorflow_cannot_use_stop_the_trainer_in_one_line_naming_them_and_the_fix(
        tiny_data_dir, tmp_path, two_gpus_listed, num_gpus_flags, asked):
    result = run_module(MODULE, ["--data-dir", tiny_data_dir, "--job-dir", tmp_path / "job"]
                        + num_gpus_flags, timeout=300, env=two_gpus_listed)
    line = assert_one_line_error(
        result, 2, asked, "but 0 GPUs are visible to TensorFlow", LISTED,
        # What TensorFlow 2.15 says where it cannot load CUDA, names and all: its loader's
        # lines, which "Cannot dlopen some GPU libraries" alone does not give.
        'TensorFlow said: "Could not load dynamic library \'libcudart.so.12\'',
        "pip install -e '.[gpu]'", "the GPU image", "--num-gpus 0 trains on the CPU")
    assert "UUID" not in line
    assert not (tmp_path / "job").exists()


def test_num_gpus_0_trains_on_the_cpu_whatever_the_driver_lists(tiny_data_dir, tmp_path,
                                                                 two_gpus_listed, monkeypatch):
    monkeypatch.setenv("PATH", two_gpus_listed["PATH"])
    monkeypatch.setattr(hardware, "gpu_library_messages", lambda: pytest.fail("asked"))
    assert hardware.driver_gpus()  # the stand-in driver lists its two
    settings = flags.parse(["--data-dir", str(tiny_data_dir), "--job-dir", str(tmp_path / "job"),
                            "--num-gpus", "0", "--eval-batch-size", "8"])
    flags.validate(settings)
    assert flags.resolve(settings).num_gpus == 0


def probed(monkeypatch, visible, listed, messages=(), cudnn=None):
    monkeypatch.setattr(hardware, "num_gpus_visible", lambda: visible)
    monkeypatch.setattr(hardware, "driver_gpus", lambda: list(listed))
    monkeypatch.setattr(hardware, "gpu_library_messages", lambda: list(messages))
    monkeypatch.setattr(hardware, "cudnn_wheel_version", lambda: cudnn)


def refusal(num_gpus):
    with pytest.raises(UsageError) as raised:
        flags.check_gpus_present(num_gpus)
    return str(raised.value)


def test_the_refusal_names_the_fix_that_fits_what_is_installed(monkeypatch):
    gpus = ["GPU 0: Tesla T4", "GPU 1: Tesla T4"]
    said = "Cannot dlopen some GPU libraries."
    probed(monkeypatch, 0, gpus, [said])
    message = refusal(2)
    assert 'lists 2 (GPU 0: Tesla T4, GPU 1: Tesla T4); TensorFlow said: "%s"' % said in message
    assert "needs CUDA 12.2 and cuDNN 8.9: pip install -e '.[gpu]' brings them" in message
    probed(monkeypatch, 0, gpus, [said], cudnn="8.9.4.25")
    assert ("TensorFlow's CUDA wheels are installed (nvidia-cudnn-cu12 8.9.4.25), so check "
            "that the driver serves CUDA 12.2") in refusal(2)
    probed(monkeypatch, 1, gpus, [said])  # one of two: still TensorFlow's loading
    assert "1 GPU is visible to TensorFlow, and the NVIDIA driver lists 2" in refusal(2)
    probed(monkeypatch, 2, gpus)  # TensorFlow sees what the driver lists: no more to say
    assert refusal(4) == ("--num-gpus 4 asked, but 2 GPUs are visible to TensorFlow; use "
                          "--num-gpus 2 (0 trains on the CPU)")
    probed(monkeypatch, 0, [])
    assert refusal(1).endswith("use --num-gpus 0 (0 trains on the CPU)")
    probed(monkeypatch, 2, gpus)
    flags.check_gpus_present(2)


SECOND_UUID = "GPU-8b31d7e4-22f0-4a5c-b6d8-3c9a4e1f7a02"


def two_gpus_driver(tmp_path, monkeypatch, visible):
    """The stand-in driver's two GPUs on PATH, CUDA_VISIBLE_DEVICES `visible` (None: unset)."""
    driver = stand_ins.nvidia_smi_dir(tmp_path / "driver")
    monkeypatch.setenv("PATH", str(driver) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


@pytest.mark.parametrize("visible, expected", [
    (None, [0, 1]), ("", []), ("1", [1]), ("1,0", [1, 0]), ("GPU-8b31", [1]),
    (SECOND_UUID + ",0", [1, 0]), ("0,7,1", [0]), ("-1", []), (" 1 ", [1]),
])
def test_cuda_visible_devices_leaves_the_script_and_the_trainer_the_same_gpus(
        tmp_path, monkeypatch, visible, expected):
    two_gpus_driver(tmp_path, monkeypatch, visible)
    script = subprocess.run(["bash", "-c", "source scripts/venv.sh; driver_gpus"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, universal_newlines=True,
                            timeout=60, check=True)
    names = ["GPU %d: NVIDIA A100-SXM4-80GB" % index for index in expected]
    assert script.stdout.splitlines() == names
    assert hardware.driver_gpus() == names


def run_setup_and_run(args, env):
    return subprocess.run(["bash", SETUP_AND_RUN] + args, cwd=REPO_ROOT, env=cli_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300)


def test_the_one_commands_plan_on_a_gpu_box_installs_the_gpu_extra_and_checks_it(
        tmp_path, two_gpus_listed):
    venv = tmp_path / "venv"
    result = run_setup_and_run(["--dry-run"], dict(two_gpus_listed, VENV_DIR=str(venv),
                                                   PYTHON=sys.executable))
    assert result.returncode == 0, result.stderr
    plan = result.stdout
    assert "GPUs: the NVIDIA driver lists 2 (nvidia-smi -L, as CUDA_VISIBLE_DEVICES leaves " \
           "them): GPU 0: NVIDIA A100-SXM4-80GB, GPU 1: NVIDIA A100-SXM4-80GB" in plan
    assert "Install: pip install -e '.[gpu]' into %s" % venv in plan
    assert "CUDA 12.2 and cuDNN 8.9 wheels" in plan
    assert "Check: TensorFlow sees the 2 GPUs, else stop" in plan
    assert "-m cifar10_estimator.main --data-dir data --job-dir job --num-gpus 2\n" in plan
    assert "the tutorial's schedule, ResNet-44 for 80000 steps, on the 2 GPUs" in plan
    assert not venv.exists()

    hidden = run_setup_and_run(["--dry-run"], dict(two_gpus_listed, VENV_DIR=str(venv),
                                                   PYTHON=sys.executable,
                                                   CUDA_VISIBLE_DEVICES=""))
    assert "Install: pip install -e '.' into" in hidden.stdout
    assert "--num-gpus 0 --recipe quick" in hidden.stdout
    assert "Check:" not in hidden.stdout


def venv_of_this_python(directory, requirement):
    """A virtualenv directory whose python is this one, with `requirement` marked installed,
    so that the script installs nothing."""
    (directory / "bin").mkdir(parents=True)
    stand_ins.write_program(directory / "bin" / "python",
                            '#!/bin/sh\nexec "%s" "$@"\n' % sys.executable)
    checksum = subprocess.run("cat setup.py requirements.txt | cksum | cut -d' ' -f1",
                              shell=True, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              universal_newlines=True, check=True).stdout.strip()
    (directory / ".cifar10_estimator-installed").write_text("%s %s\n" % (requirement, checksum))
    return directory


@pytest.mark.slow
def test_where_tensorflow_sees_none_of_the_gpus_the_one_command_stops_after_the_install(
        tmp_path, two_gpus_listed):
    venv = venv_of_this_python(tmp_path / "venv", ".[gpu]")
    data_dir = tmp_path / "data"
    result = run_setup_and_run(["--data-dir", str(data_dir)],
                               dict(two_gpus_listed, VENV_DIR=str(venv)))
    assert_one_line_error(result, 2, "scripts/setup_and_run.sh: error: --num-gpus 2 asked, but "
                          "0 GPUs are visible to TensorFlow", LISTED, "TensorFlow said: ")
    assert not data_dir.exists()  # stopped before the data step, and trained nothing


# Each process on its own GPUs: the session's options, each cluster task's environment.

@pytest.mark.parametrize("task_type, num_gpus, visible", [
    (None, 1, "0"), (None, 4, "0,1,2,3"), ("chief", 2, "0,1"), ("evaluator", 2, "0,1"),
    ("ps", 2, None), (None, 0, None)])
def test_a_process_computes_on_gpus_0_to_n_minus_1_taking_memory_as_it_grows(
        tmp_path, task_type, num_gpus, visible):
    task = None
    if task_type:
        task = cluster.task_from_tf_config(json.dumps({
            "cluster": {"ps": ["127.0.0.1:1"], "chief": ["127.0.0.1:2"]},
            "task": {"type": task_type, "index": 0}}))
    settings = flags.parse(["--job-dir", str(tmp_path), "--num-gpus", str(num_gpus)])
    session_config = trainer.make_run_config(settings, task).session_config
    assert session_config.gpu_options.allow_growth
    if visible is None:  # a ps serves variables, and --num-gpus 0 trains on the CPU
        assert session_config.device_count["GPU"] == 0
    else:
        assert session_config.gpu_options.visible_device_list == visible
        assert "GPU" not in session_config.device_count


def test_a_trainers_server_takes_the_sessions_gpus(tmp_path, monkeypatch):
    import tensorflow as tf
    servers = []
    monkeypatch.setattr(tf.distribute, "Server", lambda *args, **kwargs: servers.append(kwargs))
    text = json.dumps({"cluster": {"ps": ["127.0.0.1:1"], "chief": ["127.0.0.1:2"]},
                       "task": {"type": "chief", "index": 0}})
    monkeypatch.setenv("TF_CONFIG", text)
    settings = flags.parse(["--job-dir", str(tmp_path), "--num-gpus", "2"])
    cluster.start_trainer_server(
        trainer.make_run_config(settings, cluster.task_from_tf_config(text)))
    (server,) = servers
    assert server["config"].gpu_options.visible_device_list == "0,1"
    assert server["config"].gpu_options.allow_growth


def test_the_evaluate_command_takes_at_most_the_first_gpu_as_its_memory_grows(
        tiny_data_dir, tmp_path, monkeypatch):
    import tensorflow as tf
    configs = []

    class RecordedSession(tf.compat.v1.Session):
        def __init__(self, *args, config=None, **kwargs):
            configs.append(config)
            super().__init__(*args, config=config, **kwargs)

    monkeypatch.setattr(tf.compat.v1, "Session", RecordedSession)
    with pytest.raises(Cifar10EstimatorError, match="cannot restore"):
        evaluate.predict_subset(str(tmp_path / "model.ckpt-1"), job_hparams.HParams(num_layers=8),
                                tiny_data_dir, "eval", 8)
    (config,) = configs
    assert config.gpu_options.visible_device_list == "0"
    assert config.gpu_options.allow_growth


def cluster_of(num_workers, evaluator=True):
    return local_cluster.cluster_tasks(num_ps=2, num_workers=num_workers,
                                       with_evaluator=evaluator)


def by_name(gpus):
    return {task.name: value for task, value in gpus.items()}


def test_each_trainer_of_a_local_cluster_gets_gpus_of_its_own_and_the_rest_none():
    eight = [str(index) for index in range(8)]
    assert by_name(local_cluster.task_gpus(cluster_of(2), 2, 0, eight)) == {
        "ps0": "", "ps1": "", "chief": "0,1", "worker0": "2,3", "worker1": "4,5",
        "evaluator": ""}
    assert by_name(local_cluster.task_gpus(cluster_of(1), 3, 2, eight)) == {
        "ps0": "", "ps1": "", "chief": "0,1,2", "worker0": "3,4,5", "evaluator": "6,7"}
    # The launcher's own CUDA_VISIBLE_DEVICES are dealt out, as it spells them.
    assert by_name(local_cluster.task_gpus(cluster_of(1, evaluator=False), 1, 0,
                                           ["5", "GPU-8b31", "2"])) == {
        "ps0": "", "ps1": "", "chief": "5", "worker0": "GPU-8b31"}
    # A machine without GPUs trains on CPU towers, as before: no task gets any.
    assert set(by_name(local_cluster.task_gpus(cluster_of(1), 0, 0, [])).values()) == {""}
    with pytest.raises(UsageError) as raised:
        local_cluster.task_gpus(cluster_of(2), 3, 1, eight)
    assert str(raised.value) == (
        "each task computes on GPUs of its own: chief 3, worker0 3, worker1 3, evaluator 1 "
        "need 10 GPUs, and 8 are visible; ask for fewer (--num-gpus, --num-workers, "
        "--evaluator-gpus)")


def test_the_launcher_starts_each_task_with_its_gpus_and_the_evaluator_on_the_cpu(
        tmp_path, monkeypatch):
    # A box of 8 GPUs, as the driver lists them and TensorFlow would see them; the tasks
    # are recorded, not started.
    driver = stand_ins.nvidia_smi_dir(tmp_path / "driver", stand_ins.gpu_listing(8))
    monkeypatch.setenv("PATH", str(driver) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(hardware, "num_gpus_visible", lambda: 8)
    started = {}
    monkeypatch.setattr(local_cluster.LocalCluster, "start",
                        lambda self, task, command, environment: started.update(
                            {task.name: (command, environment)}))
    monkeypatch.setattr(local_cluster.LocalCluster, "run", lambda self, *args: None)
    monkeypatch.setattr(local_cluster.signal, "signal", lambda *args: None)
    trainer_args = ["--use-synthetic-data", "--job-dir", str(tmp_path / "job"),
                    "--num-gpus", "2", "--variable-strategy", "GPU"]
    local_cluster.main(["--num-workers", "2", "--"] + trainer_args)
    gpus = {name: environment["CUDA_VISIBLE_DEVICES"]
            for name, (_, environment) in started.items()}
    assert gpus == {"ps0": "", "chief": "0,1", "worker0": "2,3", "worker1": "4,5",
                    "evaluator": ""}
    commands = {name: command[command.index(local_cluster.TRAINER_MODULE) + 1:]
                for name, (command, _) in started.items()}
    assert commands["chief"] == commands["ps0"] == commands["worker1"] == trainer_args
    # The evaluator, given no GPU, evaluates on the CPU, its variables there too.
    assert commands["evaluator"] == trainer_args + ["--num-gpus", "0",
                                                    "--variable-strategy", "CPU"]


@pytest.mark.parametrize("visible, expected", [
    (None, ["0", "1"]), ("1", ["1"]), ("GPU-8b31,0", ["GPU-8b31", "0"]), ("", []),
    ("0,7,1", ["0"])])  # CUDA stops at the first entry that names no GPU
def test_the_launcher_deals_out_the_gpus_its_own_cuda_visible_devices_leaves_it(
        tmp_path, monkeypatch, visible, expected):
    two_gpus_driver(tmp_path, monkeypatch, visible)
    # Asked only where the driver lists none: a container may have no nvidia-smi.
    monkeypatch.setattr(hardware, "num_gpus_visible", lambda: 0)
    assert hardware.visible_gpu_entries() == expected


# Defaults that fit any GPU count.

def planned_trainer_flags(tmp_path, num_gpus):
    """The trainer flags and the reason `setup_and_run.sh --dry-run` plans on a box whose
    driver lists num_gpus GPUs."""
    driver = stand_ins.nvidia_smi_dir(tmp_path / "driver", stand_ins.gpu_listing(num_gpus))
    result = run_setup_and_run(["--dry-run"], {
        "PATH": str(driver) + os.pathsep + os.environ["PATH"],
        "VENV_DIR": str(tmp_path / "venv"), "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "venv").exists()
    lines = result.stdout.splitlines()
    train = [index for index, line in enumerate(lines) if line.startswith("  Train: ")]
    assert len(train) == 1, result.stdout
    return lines[train[0]].split(" --job-dir job ")[1].split(), lines[train[0] + 1].strip()


def gpus_seen(monkeypatch, num_gpus):
    monkeypatch.setattr(hardware, "num_gpus_visible", lambda: num_gpus)
    monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda count: [(8, 0)] * count)


@pytest.mark.parametrize("num_gpus", range(1, 9))
def test_the_one_commands_plan_trains_on_every_gpu_and_evaluates_each_example_once(
        tmp_path, monkeypatch, num_gpus):
    planned, why = planned_trainer_flags(tmp_path, num_gpus)
    settings = flags.parse(["--job-dir", "job"] + planned)
    hparams = settings.hparams
    assert settings.num_towers == num_gpus
    # The tutorial's batch of 128, or the nearest multiple of N, at the rate for it.
    assert hparams.train_batch_size % num_gpus == 0
    assert abs(hparams.train_batch_size - 128) <= num_gpus // 2
    assert schedule.base_learning_rate(hparams) == pytest.approx(
        0.1 * hparams.train_batch_size / 128)
    if hparams.train_batch_size != 128:
        assert "its batch of 128 made %d to split evenly over them" % (
            hparams.train_batch_size) in why
    # Every validation and test example evaluated once, on as many GPUs as can share a batch.
    for subset in ("validation", "eval"):
        assert tfrecord_format.num_examples(subset) % settings.eval_batch_size == 0
    assert settings.eval_batch_size % settings.num_eval_towers == 0
    assert settings.num_eval_towers == max(
        towers for towers in range(1, num_gpus + 1) if settings.eval_batch_size % towers == 0)
    # The trainer takes the command on N GPUs; where the tutorial's batch does not split
    # over them, its own refusal of --num-gpus N names the flags the plan added.
    gpus_seen(monkeypatch, num_gpus)
    flags.validate(dataclasses.replace(settings, use_synthetic_data=True))
    alone = flags.parse(["--job-dir", "job", "--use-synthetic-data", "--num-gpus",
                         str(num_gpus)])
    if planned == ["--num-gpus", str(num_gpus)]:
        flags.validate(alone)
        return
    with pytest.raises(UsageError) as raised:
        flags.validate(alone)
    assert "use %s, the nearest multiple of %d" % (" ".join(planned[2:]), num_gpus) in str(
        raised.value)


def test_tensorflows_own_context_sees_the_sessions_gpus_before_the_jobs_summary_starts_it(
        tmp_path, monkeypatch):
    import tensorflow as tf
    from cifar10_estimator.run import hparams_summary
    # Four GPUs as TensorFlow would list them; what the trainer asks of its context, and
    # when the job's summary writer (the first thing that starts that context) comes.
    four = ["GPU:%d" % index for index in range(4)]
    done = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: list(four) if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda devices, kind: done.append(("visible", kind, list(devices))))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth",
                        lambda device, grows: done.append(("growth", device, grows)))
    monkeypatch.setattr(hparams_summary, "write", lambda *args: done.append("summary"))
    settings = flags.resolve(flags.parse(["--job-dir", str(tmp_path), "--use-synthetic-data",
                                          "--num-gpus", "2", "--num-layers", "8"]))
    trainer.start_job(settings, None, trainer.make_run_config(settings), "channels_first")
    assert done == [("visible", "GPU", ["GPU:0", "GPU:1"]), ("growth", "GPU:0", True),
                    ("growth", "GPU:1", True), "summary"]
