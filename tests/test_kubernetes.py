"""The Kubernetes manifests of docs/distributed.md, run as the cluster would run them.

The page's YAML is read as it stands: its data Job's command converts an archive where the
data volume would be, and its TFJob's trainer flags, with the data and job paths and the
step count replaced, train a real local cluster of the replicas the TFJob lists (a ResNet-8
of batch 8 after them, so that its five processes train in seconds on two cores). What a
real Kubernetes adds (pods, volumes, TF_CONFIG, restarts) is not tested here.
"""

import os
import re

import pytest
import yaml

import cifar_archives
from cli_helpers import REPO_ROOT, many_processes, run_module

PAGE = os.path.join(REPO_ROOT, "docs", "distributed.md")
IMAGE = re.compile(r"^REGISTRY/(?P<name>[\w.-]+):[\w.-]+$")
DATA, JOB = "/data", "/job"
SMALL_MODEL = ["--num-layers", "8", "--train-batch-size", "8"]


def read(path):
    with open(os.path.join(REPO_ROOT, path)) as stream:
        return stream.read()


def page_objects():
    """The objects of the YAML blocks of the page's Kubernetes section, in order."""
    section = read(PAGE).split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```$", section, re.M | re.S)
    return [item for block in blocks for item in yaml.safe_load_all(block) if item]


def only(objects, kind):
    found = [item for item in objects if item["kind"] == kind]
    assert len(found) == 1, "the page has %d %s manifests" % (len(found), kind)
    return found[0]


def console_commands():
    """{console command: its module}, from setup.py's entry points."""
    return dict(re.findall(r'"(cifar10-[\w-]+)=([\w.]+):console_main"', read("setup.py")))


def image_entry_point():
    """The console command the Containerfile's ENTRYPOINT runs."""
    return re.search(r'^ENTRYPOINT \["/opt/cifar10-estimator/bin/([\w-]+)"\]$',
                     read("Containerfile"), re.M).group(1)


def data_job_container(objects):
    (container,) = only(objects, "Job")["spec"]["template"]["spec"]["containers"]
    return container


def replicas(objects):
    """{replica type: its spec} of the TFJob."""
    return only(objects, "TFJob")["spec"]["tfReplicaSpecs"]


def trainer_container(spec):
    (container,) = spec["template"]["spec"]["containers"]
    return container


def claims(pod_spec):
    """{mount path: claim name} of a pod's containers."""
    by_volume = {volume["name"]: volume["persistentVolumeClaim"]["claimName"]
                 for volume in pod_spec["volumes"]}
    return {mount["mountPath"]: by_volume[mount["name"]]
            for container in pod_spec["containers"] for mount in container["volumeMounts"]}


def test_the_manifests_run_the_image_the_containerfile_builds():
    objects = page_objects()
    default_image = re.search(r"CONTAINER_IMAGE:-([\w.-]+)\}", read("scripts/container.sh"))
    containers = [data_job_container(objects)] + [
        trainer_container(spec) for spec in replicas(objects).values()]
    for container in containers:
        assert IMAGE.match(container["image"]).group("name") == default_image.group(1)
    commands = console_commands()
    assert commands[image_entry_point()] == "cifar10_estimator.main"
    for spec in replicas(objects).values():
        container = trainer_container(spec)
        assert container["name"] == "tensorflow"  # where the operator sets TF_CONFIG
        assert "command" not in container, "a replica runs the image's entry point, the trainer"
        assert spec["restartPolicy"] == "ExitCode"
    assert commands[data_job_container(objects)["command"][0]] == (
        "cifar10_estimator.generate_tfrecords")


def test_the_data_job_fills_the_volume_the_replicas_read():
    objects = page_objects()
    claim_names = {item["metadata"]["name"] for item in objects
                   if item["kind"] == "PersistentVolumeClaim"}
    data_job = only(objects, "Job")["spec"]["template"]["spec"]
    assert claims(data_job) == {DATA: "cifar10-data"}
    for spec in replicas(objects).values():
        assert claims(spec["template"]["spec"]) == {DATA: "cifar10-data", JOB: "cifar10-job"}
    assert claim_names == {"cifar10-data", "cifar10-job"}


def replaced(args, data_dir, job_dir, train_steps):
    """The manifest's arguments with the data and job paths and the step count replaced."""
    values = {DATA: str(data_dir), JOB: str(job_dir)}
    args = [values.get(arg, arg) for arg in args]
    if "--train-steps" in args:
        args[args.index("--train-steps") + 1] = str(train_steps)
    return args


@pytest.mark.slow
@many_processes
def test_the_manifests_convert_the_data_and_train_as_a_cluster(tmp_path):
    objects = page_objects()
    data_dir, job_dir = tmp_path / "data", tmp_path / "job"
    data_dir.mkdir()
    # In the data volume's place, the archive the Job would download: 100 images a batch,
    # so the trainer's default evaluation batch (100) divides each evaluated set.
    cifar_archives.write_archive_with_md5(str(data_dir / cifar_archives.ARCHIVE_NAME),
                                          cifar_archives.make_batches(100, seed=5))
    job = data_job_container(objects)
    converted = run_module(console_commands()[job["command"][0]],
                           replaced(job["args"], data_dir, job_dir, None), timeout=300)
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert (data_dir / "train.tfrecords").exists()

    specs = replicas(objects)
    args = {tuple(trainer_container(spec)["args"]) for spec in specs.values()}
    assert len(args) == 1, "every replica runs the same flags; only TF_CONFIG differs"
    trainer_flags = replaced(list(args.pop()), data_dir, job_dir, 4)
    launcher_flags = ["--num-ps", str(specs["PS"]["replicas"]),
                      "--num-workers", str(specs["Worker"]["replicas"]),
                      "--timeout-secs", "500"]
    assert specs["Chief"]["replicas"] == 1
    if specs.get("Evaluator", {}).get("replicas", 0) != 1:
        launcher_flags.append("--no-evaluator")
    result = run_module("cifar10_estimator.distributed.local_cluster",
                        launcher_flags + ["--"] + trainer_flags + SMALL_MODEL, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[launcher] done" in result.stdout + result.stderr
    steps = [int(name.split("-")[1].split(".")[0]) for name in os.listdir(str(job_dir))
             if re.match(r"model\.ckpt-\d+\.index$", name)]
    assert max(steps) >= 4
    assert (job_dir / "test_results.json").exists()  # the evaluator's last word
