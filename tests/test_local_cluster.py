"""The local cluster launcher: TF_CONFIG of each task, and supervision of stand-in processes."""

import io
import json
import os
import subprocess
import sys
import time

import pytest

from cifar10_estimator.distributed import cluster
from cifar10_estimator.distributed import local_cluster
from cifar10_estimator.errors import Cifar10EstimatorError
from cifar10_estimator.distributed.local_cluster import LocalCluster, Task
from cli_helpers import REPO_ROOT, assert_one_line_error, cli_env, run_module

LAUNCHER = "cifar10_estimator.distributed.local_cluster"


def test_tasks_are_ps_first_then_chief_workers_and_evaluator():
    names = [task.name for task in local_cluster.cluster_tasks(num_ps=2, num_workers=2)]
    assert names == ["ps0", "ps1", "chief", "worker0", "worker1", "evaluator"]
    assert [task.name for task in local_cluster.cluster_tasks(1, 0, with_evaluator=False)] == [
        "ps0", "chief"]


def test_cluster_lists_ps_chief_and_workers_on_localhost():
    spec = local_cluster.make_cluster(num_ps=2, num_workers=2, ports=[1001, 1002, 1003, 1004, 1005])
    assert spec == {"ps": ["127.0.0.1:1001", "127.0.0.1:1002"], "chief": ["127.0.0.1:1003"],
                    "worker": ["127.0.0.1:1004", "127.0.0.1:1005"]}
    assert local_cluster.make_cluster(1, 0, [2001, 2002]) == {
        "ps": ["127.0.0.1:2001"], "chief": ["127.0.0.1:2002"]}


def test_in_the_operators_shape_the_cluster_lists_the_evaluator_too():
    spec = local_cluster.make_cluster(1, 1, [1001, 1002, 1003, 1004], with_evaluator=True)
    assert spec == {"ps": ["127.0.0.1:1001"], "chief": ["127.0.0.1:1002"],
                    "worker": ["127.0.0.1:1003"], "evaluator": ["127.0.0.1:1004"]}
    for task in local_cluster.cluster_tasks(num_ps=1, num_workers=1):
        text = local_cluster.tf_config(spec, task, local_cluster.OPERATOR_ENVIRONMENT)
        assert json.loads(text)["environment"] == "cloud"
        parsed = cluster.task_from_tf_config(text)
        assert (parsed.task_type, parsed.task_index, parsed.cluster) == (
            task.task_type, task.task_index, spec)


def test_every_task_gets_a_tf_config_the_trainer_accepts_naming_that_task():
    spec = local_cluster.make_cluster(2, 2, local_cluster.free_ports(5))
    for task in local_cluster.cluster_tasks(num_ps=2, num_workers=2):
        config = json.loads(local_cluster.tf_config(spec, task))
        assert config == {"cluster": spec,
                          "task": {"type": task.task_type, "index": task.task_index}}
        parsed = cluster.task_from_tf_config(local_cluster.tf_config(spec, task))
        assert (parsed.task_type, parsed.task_index, parsed.cluster) == (
            task.task_type, task.task_index, spec)


def test_free_ports_are_distinct():
    ports = local_cluster.free_ports(6)
    assert len(set(ports)) == 6
    assert all(0 < port < 65536 for port in ports)


def test_task_environment_sets_tf_config_and_puts_this_package_first():
    spec = local_cluster.make_cluster(1, 1, [3001, 3002, 3003])
    environment = local_cluster.task_environment(
        spec, Task("worker", 0), {"PYTHONPATH": "/elsewhere", "TF_CONFIG": "stale"})
    assert json.loads(environment["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    package_root, other = environment["PYTHONPATH"].split(":")
    assert other == "/elsewhere"
    assert local_cluster.__file__.startswith(package_root)


def test_trainer_flags_are_the_ones_after_the_double_dash():
    assert local_cluster.split_argv(["--num-ps", "2", "--", "--job-dir", "J", "--", "x"]) == (
        ["--num-ps", "2"], ["--job-dir", "J", "--", "x"])
    assert local_cluster.split_argv(["--num-ps", "2"]) == (["--num-ps", "2"], [])


def python(code):
    return [sys.executable, "-c", code]


# "Forever": the tests' tasks that run until the launcher stops them sleep 600 s.
SERVE_FOREVER = python("import time; print('serving', flush=True); time.sleep(600)")


def start_cluster(programs, output):
    """A LocalCluster running `programs`: {Task: command}."""
    local = LocalCluster(output=output)
    for task, command in programs.items():
        local.start(task, command, environment=None)
    return local


def test_waits_for_trainers_and_evaluator_then_stops_the_ps():
    output = io.StringIO()
    local = start_cluster({
        Task("ps", 0): SERVE_FOREVER,
        Task("chief"): python("print('chief trains')"),
        Task("worker", 0): python("print('worker trains')"),
        # Still evaluating when the trainers, which print at once, are done: the wait for
        # it is tried. (Should a loaded machine end it first, the test is easier, not false.)
        Task("evaluator"): python("import time; time.sleep(0.5); print('evaluated')"),
    }, output)
    local.run(timeout_secs=None, evaluator_grace_secs=30)  # a hang guard: it takes 0.5 s
    log = output.getvalue()
    for line in ("[chief] chief trains", "[worker0] worker trains", "[evaluator] evaluated",
                 "[ps0] serving", "[launcher] training finished", "[launcher] stopping ps0"):
        assert line in log, log
    assert log.index("[evaluator] evaluated") < log.index("[launcher] stopping ps0")


def test_a_failing_task_stops_the_others_and_is_named():
    output = io.StringIO()
    local = start_cluster({
        Task("ps", 0): SERVE_FOREVER,
        Task("chief"): python("import time; time.sleep(600)"),
        Task("worker", 0): python("import sys; sys.exit(3)"),
    }, output)
    with pytest.raises(Cifar10EstimatorError, match=r"^worker0 failed \(exit status 3\)"):
        local.run(timeout_secs=60)  # a hang guard (cli_helpers): the failure ends it at once
    assert "[launcher] stopping chief" in output.getvalue()
    assert "[launcher] stopping ps0" in output.getvalue()


def test_a_ps_that_exits_is_a_failure_even_with_status_0():
    local = start_cluster({
        Task("ps", 0): python("pass"),
        Task("chief"): python("import time; time.sleep(600)"),
    }, io.StringIO())
    with pytest.raises(Cifar10EstimatorError, match="^ps0 exited while the cluster ran"):
        local.run(timeout_secs=60)  # a hang guard (cli_helpers): the exit ends it at once


def test_the_overall_timeout_stops_everything():
    output = io.StringIO()
    local = start_cluster({
        Task("ps", 0): SERVE_FOREVER,
        Task("chief"): python("import time; time.sleep(600)"),
    }, output)
    with pytest.raises(Cifar10EstimatorError,
                       match=r"did not finish within 1 s \(--timeout-secs\)"):
        local.run(timeout_secs=1)
    assert "[launcher] stopping chief" in output.getvalue()


def test_an_evaluator_past_its_grace_period_is_stopped_and_reported():
    output = io.StringIO()
    local = start_cluster({
        Task("ps", 0): SERVE_FOREVER,
        Task("chief"): python("pass"),
        Task("evaluator"): python("import time; time.sleep(600)"),
    }, output)
    with pytest.raises(Cifar10EstimatorError,
                       match=r"evaluator did not finish the final evaluation within 0.5 s"):
        local.run(timeout_secs=60, evaluator_grace_secs=0.5)  # the first, a hang guard
    assert "[launcher] stopping evaluator" in output.getvalue()


def test_the_evaluator_grace_is_for_the_final_evaluation_not_for_eval_every_secs():
    # The evaluator takes up the final checkpoint within seconds, whatever
    # --eval-every-secs; the grace covers an evaluation under way and the final ones.
    launcher_flags = local_cluster.build_parser().parse_args([])
    assert launcher_flags.evaluator_grace_secs == local_cluster.EVALUATOR_GRACE_SECS == 600


def test_bad_trainer_flags_fail_before_any_task_starts(tmp_path):
    result = run_module(LAUNCHER, ["--num-workers", "1", "--", "--job-dir", tmp_path,
                                   "--num-gpus", "0", "--train-steps", "0"])
    assert_one_line_error(result, 2, "trainer flags (after --)", "--train-steps",
                          "expected a positive integer")
    assert "[launcher] started" not in result.stdout


def test_at_least_one_ps_is_required(tmp_path):
    result = run_module(LAUNCHER, ["--num-ps", "0", "--", "--job-dir", tmp_path])
    assert_one_line_error(result, 2, "--num-ps", "expected a positive integer")


def is_running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_tasks_die_with_a_launcher_killed_outright(tmp_path):
    pid_file = tmp_path / "ps.pid"
    ps_program = ("import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(600)"
                  % str(pid_file))
    launcher = subprocess.Popen(python(
        "import sys, time\n"
        "from cifar10_estimator.distributed.local_cluster import LocalCluster, Task\n"
        "LocalCluster().start(Task('ps', 0), [sys.executable, '-c', %r], environment=None)\n"
        "time.sleep(600)\n" % ps_program), cwd=REPO_ROOT, env=cli_env(),
        stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60  # a hang guard (cli_helpers): a `python -c` start
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.time() < deadline and launcher.poll() is None, "the ps never started"
            time.sleep(0.1)
        ps_pid = int(pid_file.read_text())
        assert is_running(ps_pid)
    finally:
        launcher.kill()
        launcher.wait()
    # The kernel signals the task as its launcher dies (no event this test could wait on
    # for another's child): 10 s is many times a loaded machine's way there.
    deadline = time.time() + 10
    while is_running(ps_pid):
        if time.time() > deadline:
            os.kill(ps_pid, 9)
            pytest.fail("the ps task outlived its killed launcher")
        time.sleep(0.1)
