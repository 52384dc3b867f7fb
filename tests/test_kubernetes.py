"""The Kubernetes manifests of kubernetes/, checked offline and run as the cluster would run them.

The claims and the data Job pass Kubernetes' own schemas (kubernetes-validate's, strict: no
unknown field), and so does each replica's pod template; the TFJob passes the rules of
Kubeflow's training operator v1, written here from its API types and validation (the CRD
itself cannot be fetched offline). Then the files run: the data Job's command converts an
archive where the data volume would be, and the TFJob's trainer flags, with the data and
job paths and the step count replaced, train a real local cluster of the replicas the
TFJob lists, each TF_CONFIG in the shape the operator writes (a ResNet-8 of batch 8 after
them, so that its five processes train in seconds on two cores), which ends with the
chief having read the evaluator's final result. What a real Kubernetes adds (pods,
volumes, the services' names, restarts, the run policy) is not tested here; the TF_CONFIG
the operator writes is built as it writes it in tests/test_cluster.py.
"""

import copy
import json
import os
import re

import kubernetes_validate
import pytest
import yaml

import cifar_archives
from cifar10_estimator import report
from cli_helpers import REPO_ROOT, many_processes, run_module

MANIFESTS = os.path.join(REPO_ROOT, "kubernetes")
DATA_MANIFEST, TFJOB_MANIFEST = "cifar10-data.yaml", "cifar10-tfjob.yaml"
IMAGE = re.compile(r"^REGISTRY/(?P<name>[\w.-]+):[\w.-]+$")
DATA, JOB = "/data", "/job"
SMALL_MODEL = ["--num-layers", "8", "--train-batch-size", "8"]
# The oldest and the newest Kubernetes whose schemas kubernetes-validate carries.
KUBERNETES_VERSIONS = (kubernetes_validate.utils.all_versions()[0],
                       kubernetes_validate.utils.latest_version())


def read(path):
    with open(os.path.join(REPO_ROOT, path)) as stream:
        return stream.read()


def manifest(name):
    """The objects of a file of kubernetes/, in order."""
    with open(os.path.join(MANIFESTS, name)) as stream:
        return [item for item in yaml.safe_load_all(stream) if item]


def all_objects():
    return manifest(DATA_MANIFEST) + manifest(TFJOB_MANIFEST)


def only(objects, kind):
    found = [item for item in objects if item["kind"] == kind]
    assert len(found) == 1, "the manifests have %d %s objects" % (len(found), kind)
    return found[0]


def console_commands():
    """{console command: its module}, from setup.py's entry points."""
    return dict(re.findall(r'"(cifar10-[\w-]+)=([\w.]+):console_main"', read("setup.py")))


def image_entry_point():
    """The console command the Dockerfile's ENTRYPOINT runs."""
    return re.search(r'^ENTRYPOINT \["/opt/cifar10-estimator/bin/([\w-]+)"\]$',
                     read("Dockerfile"), re.M).group(1)


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


def test_the_manifests_run_the_image_the_dockerfile_builds():
    objects = all_objects()
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
    objects = all_objects()
    claim_names = {item["metadata"]["name"] for item in objects
                   if item["kind"] == "PersistentVolumeClaim"}
    data_job = only(objects, "Job")["spec"]["template"]["spec"]
    assert claims(data_job) == {DATA: "cifar10-data"}
    for spec in replicas(objects).values():
        assert claims(spec["template"]["spec"]) == {DATA: "cifar10-data", JOB: "cifar10-job"}
    assert claim_names == {"cifar10-data", "cifar10-job"}
    for item in objects:  # pods on several nodes mount both
        if item["kind"] == "PersistentVolumeClaim":
            assert item["spec"]["accessModes"] == ["ReadWriteMany"]


# Offline: Kubernetes' own schemas, and the training operator's rules.

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_claims_and_the_data_job_pass_kubernetes_own_schemas(version):
    for item in manifest(DATA_MANIFEST):
        kubernetes_validate.validate(item, version, strict=True)


def as_pod_template(template):
    """A replica's pod template as the PodTemplate object Kubernetes' schemas describe."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "replica"},
            "template": template}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_each_replicas_pod_template_passes_kubernetes_own_schema(version):
    for spec in replicas(manifest(TFJOB_MANIFEST)).values():
        kubernetes_validate.validate(as_pod_template(spec["template"]), version, strict=True)


def test_kubernetes_own_schemas_refuse_a_misspelt_field_and_a_wrong_type():
    data_job = copy.deepcopy(only(manifest(DATA_MANIFEST), "Job"))
    data_job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    claim = copy.deepcopy(manifest(DATA_MANIFEST)[0])
    claim["spec"]["accessModes"] = "ReadWriteMany"
    for broken in (data_job, claim):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


# Kubeflow's training operator v1 (kubeflow.org/v1 TFJob): its replica types, the container
# it sets TF_CONFIG in, and the values its ReplicaSpec and RunPolicy types take.
TFJOB_REPLICA_TYPES = ("PS", "Worker", "Chief", "Master", "Evaluator")
TFJOB_CONTAINER = "tensorflow"
TFJOB_SPEC_FIELDS = {"runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker"}
REPLICA_SPEC_FIELDS = {"replicas", "template", "restartPolicy"}
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
RUN_POLICY_FIELDS = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                     "backoffLimit", "schedulingPolicy", "suspend"}
CLEAN_POD_POLICIES = ("None", "Running", "All")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def whole_number(value, least):
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def run_policy_problems(run_policy):
    problems = ["runPolicy has no field %s" % name
                for name in sorted(set(run_policy) - RUN_POLICY_FIELDS)]
    if run_policy.get("cleanPodPolicy", "None") not in CLEAN_POD_POLICIES:
        problems.append("cleanPodPolicy is one of %s" % ", ".join(CLEAN_POD_POLICIES))
    for name, least in (("backoffLimit", 0), ("ttlSecondsAfterFinished", 0),
                        ("activeDeadlineSeconds", 1)):
        if name in run_policy and not whole_number(run_policy[name], least):
            problems.append("%s is a whole number from %d" % (name, least))
    return problems


def replica_problems(replica_type, spec):
    problems = ["%s has no field %s" % (replica_type, name)
                for name in sorted(set(spec) - REPLICA_SPEC_FIELDS)]
    if replica_type not in TFJOB_REPLICA_TYPES:
        problems.append("%s is no replica type (%s)"
                        % (replica_type, ", ".join(TFJOB_REPLICA_TYPES)))
    if not whole_number(spec.get("replicas", 1), 0):
        problems.append("%s replicas is a whole number" % replica_type)
    if spec.get("restartPolicy", "Never") not in RESTART_POLICIES:
        problems.append("%s restartPolicy is one of %s"
                        % (replica_type, ", ".join(RESTART_POLICIES)))
    containers = spec.get("template", {}).get("spec", {}).get("containers") or []
    if not containers:
        problems.append("%s has no containers" % replica_type)
    if any(not container.get("image") for container in containers):
        problems.append("%s has a container without an image" % replica_type)
    if containers and TFJOB_CONTAINER not in [container.get("name") for container in containers]:
        problems.append("%s has no container named %s" % (replica_type, TFJOB_CONTAINER))
    return problems


def tfjob_problems(tfjob):
    """What Kubeflow's training operator v1 refuses in a TFJob, one message each."""
    problems = []
    if (tfjob.get("apiVersion"), tfjob.get("kind")) != ("kubeflow.org/v1", "TFJob"):
        problems.append("not a kubeflow.org/v1 TFJob")
    if not DNS_1035_LABEL.match(tfjob.get("metadata", {}).get("name", "")):
        problems.append("the name is no DNS-1035 label")
    spec = tfjob.get("spec", {})
    problems += ["spec has no field %s" % name for name in sorted(set(spec) - TFJOB_SPEC_FIELDS)]
    specs = spec.get("tfReplicaSpecs") or {}
    if not specs:
        problems.append("no tfReplicaSpecs")
    for replica_type, replica_spec in specs.items():
        problems += replica_problems(replica_type, replica_spec)
    chiefs = [specs[kind].get("replicas", 1) for kind in ("Chief", "Master") if kind in specs]
    if sum(chiefs) > 1:
        problems.append("more than one chief or master")
    if "Evaluator" in specs and specs["Evaluator"].get("replicas", 1) > 1:
        problems.append("more than one evaluator")
    return problems + run_policy_problems(spec.get("runPolicy", {}))


def test_the_tfjob_passes_the_training_operators_rules():
    assert tfjob_problems(only(manifest(TFJOB_MANIFEST), "TFJob")) == []


def test_the_tfjob_ends_clean_removing_the_ps_and_bounding_restarts():
    run_policy = only(manifest(TFJOB_MANIFEST), "TFJob")["spec"]["runPolicy"]
    # With a chief, the job succeeds when the chief does; the ps never exit by themselves.
    assert run_policy["cleanPodPolicy"] == "Running"
    # ExitCode restarts a pod that ends by a signal, 137 (out of memory) too, without end.
    assert whole_number(run_policy["backoffLimit"], 1)


def broken(change):
    tfjob = copy.deepcopy(only(manifest(TFJOB_MANIFEST), "TFJob"))
    change(tfjob["spec"], tfjob["spec"]["tfReplicaSpecs"])
    return tfjob


@pytest.mark.parametrize("change, problem", [
    (lambda spec, specs: specs.update(Master=specs["Chief"]), "more than one chief or master"),
    (lambda spec, specs: specs["Chief"].update(replicas=2), "more than one chief or master"),
    (lambda spec, specs: specs["Evaluator"].update(replicas=2), "more than one evaluator"),
    (lambda spec, specs: specs.update(Trainer=specs.pop("Worker")), "Trainer is no replica type"),
    (lambda spec, specs: specs["PS"].update(template={"spec": {"containers": [
        {"name": "trainer", "image": "REGISTRY/cifar10-estimator:latest"}]}}),
     "PS has no container named tensorflow"),
    (lambda spec, specs: specs["PS"].update(template={"spec": {"containers": [
        {"name": "tensorflow"}]}}), "PS has a container without an image"),
    (lambda spec, specs: specs["Worker"].update(restartPolicy="OnExit"),
     "Worker restartPolicy is one of"),
    (lambda spec, specs: spec["runPolicy"].update(cleanPodPolicy="Finished"),
     "cleanPodPolicy is one of"),
    (lambda spec, specs: spec["runPolicy"].update(backoffLimit=-1), "backoffLimit is a whole"),
    (lambda spec, specs: spec["runPolicy"].update(cleanPods="Running"),
     "runPolicy has no field cleanPods"),
])
def test_the_operators_rules_refuse_what_the_operator_refuses(change, problem):
    problems = tfjob_problems(broken(change))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


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
    objects = all_objects()
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
    # Each task's TF_CONFIG as the operator writes it: the evaluator in the cluster.
    launcher_flags = ["--num-ps", str(specs["PS"]["replicas"]),
                      "--num-workers", str(specs["Worker"]["replicas"]),
                      "--timeout-secs", "500", "--tf-config-shape", "operator"]
    assert specs["Chief"]["replicas"] == 1
    assert specs["Evaluator"]["replicas"] == 1
    result = run_module("cifar10_estimator.distributed.local_cluster",
                        launcher_flags + ["--"] + trainer_flags + SMALL_MODEL, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[launcher] done" in result.stdout + result.stderr
    assert '"evaluator": ["127.0.0.1:' in result.stdout
    steps = [int(name.split("-")[1].split(".")[0]) for name in os.listdir(str(job_dir))
             if re.match(r"model\.ckpt-\d+\.index$", name)]
    assert max(steps) >= 4
    # The chief, which ends the TFJob (and so the evaluator) by its exit, read the
    # evaluator's final result before it exited: the test evaluation of the final checkpoint.
    with open(str(job_dir / report.TEST_RESULTS_FILENAME)) as stream:
        results = json.load(stream)
    assert results["global_step"] >= 4
    chief_lines = [line for line in result.stdout.splitlines() if line.startswith("[chief] ")]
    assert any(line.startswith("[chief] Training done; waiting up to 600 s "
                               "(--evaluator-wait-secs) for the evaluator's final result")
               for line in chief_lines), chief_lines
    assert "[chief] The evaluator's final result: %s" % report.test_accuracy_line(
        results) in chief_lines, chief_lines
