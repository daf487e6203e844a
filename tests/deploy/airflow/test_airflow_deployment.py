"""The provider in a real Airflow 3.3 deployment (scripts/start_airflow.sh: PostgreSQL,
LocalExecutor, scheduler, dag processor, triggerer, API server), driven as users drive it:
through the REST API (trigger a run, poll it, read task logs, mark a task failed) and the
``airflow`` command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from core.specs import parse_app_handle
from tests.deploy.airflow.airflow_api import (
    AirflowAPI,
    Run,
    airflow_cli,
    restart_triggerer,
)
from tests.helpers import wait_until
from tests.integration.slurm.slurm_clusters import preempt_node
from tests.services import REMOTE_DIR, docker_problem, require, slurm_problem, slurm_remote_problem

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]


def unique(prefix: str) -> str:
    """An app name no other test run uses."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def lines(prefix: str, items: list[str]) -> list[str]:
    return [f"{prefix}{item}" for item in items]


def counting_script(first: int, last: int, gate: Path | None = None, then: int = 0) -> str:
    """Prints ``line N of replica K`` for N in first..last; with ``gate``, then waits for the
    gate file and prints ``then`` more lines."""
    script = f'for i in $(seq {first} {last}); do echo "line $i of replica ${{replica_id}}"; done'
    if gate is not None:
        script += f"; while [ ! -e {gate} ]; do sleep 0.05; done"
        script += (
            f'; for i in $(seq {last + 1} {last + then}); do echo "line $i of replica '
            '${replica_id}"; done'
        )
    return script


def expected(replica: int, first: int, last: int) -> list[str]:
    return [f"job/{replica} line {i} of replica {replica}" for i in range(first, last + 1)]


def job_handle(run: Run, task_id: str = "job") -> str:
    """The handle of the task's job, from the task log (also there when the task failed)."""
    for event in run.log_events(task_id):
        if event.startswith("submitted "):
            return event.split()[1]
    raise AssertionError(f"no 'submitted' line in the log of {task_id}")


# -- the example DAGs ----------------------------------------------------------------------


def test_local_example_dag(airflow_api: AirflowAPI) -> None:
    run = airflow_api.trigger("shipyard_local_job")
    assert run.wait() == "success"
    for k in (0, 1):
        got = run.job_lines("train", f"trainer/{k} ")
        assert got[0] == f"trainer/{k} trainer {k}: run {run.run_id}, 3 epochs"
        assert got[1:] == [
            *(f"trainer/{k} trainer {k}: epoch {i}" for i in (1, 2, 3)),
            f"trainer/{k} trainer {k}: done",
        ]
    # triggered without a logical date: the app file falls back to the run's run_after
    day = str(airflow_api.get(run.path)["run_after"])[:10]
    assert run.job_lines("train", "reporter/0 ") == [f"reporter/0 reporter: summary for {day}"]
    assert run.xcom("train", "state") == "SUCCEEDED"
    assert run.xcom("wait_for_evaluate") == "SUCCEEDED"
    # the array task: one entry per element, through the REST API
    assert run.xcom("sweep", "array_states") == ["SUCCEEDED"] * 3
    assert run.xcom("sweep", "result") == [
        {"point": {"0": {"lr": lr}}} for lr in (0.1, 0.01, 0.001)
    ]
    assert "elements: 3 SUCCEEDED (of 3)" in "\n".join(run.log_events("sweep"))


def test_deferrable_example_dag(airflow_api: AirflowAPI) -> None:
    run = airflow_api.trigger("shipyard_deferrable_job")
    assert run.wait() == "success"
    assert "deferred" in run.seen.get("train", []) or any(
        "deferring to ShipyardJobTrigger" in e for e in run.log_events("train")
    )
    for k in (0, 1):
        assert run.job_lines("train", f"trainer/{k} ") == [
            f"trainer/{k} trainer {k}: step {i}" for i in (1, 2, 3)
        ]
    # the deferrable sensor put the other job's line in its log, once
    assert run.job_lines("wait", "post/0 ") == ["post/0 post done"]


def test_docker_example_dag(airflow_api: AirflowAPI) -> None:
    require("docker", docker_problem())
    run = airflow_api.trigger("shipyard_docker_job")
    assert run.wait() == "success", run.log_events("greet")[-20:]
    for k in range(3):
        assert run.job_lines("greet", f"greeter/{k} ") == [
            f"greeter/{k} hello from container {k} of shipyard_docker_job"
        ]
    # greeter/0's result, copied out of its stopped container (the check task read it too)
    assert run.xcom("greet", "result") == {"greeter": {"0": {"greeted": 0}}}


def test_slurm_example_dag(airflow_api: AirflowAPI) -> None:
    require("slurm", slurm_problem())
    run = airflow_api.trigger("shipyard_slurm_job")
    assert run.wait() == "success", run.log_events("simulate")[-20:]
    assert run.xcom("simulate").startswith("slurm://")
    assert run.job_lines("simulate", "worker/1 ") == [
        "worker/1 worker 1: step 1",
        "worker/1 worker 1: done",
    ]
    (coordinator,) = run.job_lines("simulate", "coordinator/0 ")
    assert coordinator.endswith(f": run {run.run_id}")
    assert run.xcom("simulate", "result") == {"coordinator": {"0": {"run": run.run_id}}}


def test_connection_based_dag(airflow_api: AirflowAPI) -> None:
    """A connection made with `airflow connections add` (a Slurm login node over SSH; the key
    by path, so no secret is on any command line) drives the example Slurm DAG."""
    require("slurm", slurm_remote_problem())
    conn_id = unique("deploy_ssh_")
    extra = (
        '{"scheduler": "slurm", "transport": "ssh",'
        f' "identity_file": "{REMOTE_DIR}/userkey",'
        f' "known_hosts": "{REMOTE_DIR}/known_hosts",'
        ' "remote_dir": "/home/hpcuser/shipyard"}'
    )
    airflow_cli(
        "connections",
        "add",
        conn_id,
        "--conn-type",
        "shipyard",
        "--conn-host",
        "127.0.0.1",
        "--conn-port",
        "2222",
        "--conn-login",
        "hpcuser",
        "--conn-extra",
        extra,
    )
    try:
        run = airflow_api.trigger("shipyard_slurm_job", {"shipyard_conn_id": conn_id})
        assert run.wait() == "success", run.log_events("simulate")[-20:]
        # the handle names the connection, and the job ran as the login node's user
        assert run.xcom("simulate").startswith(f"slurm://shipyard/{conn_id}:")
        assert run.job_lines("simulate", "worker/0 ") == [
            "worker/0 worker 0: step 1",
            "worker/0 worker 0: done",
        ]
        # the coordinator's result, read back over SSH by the task
        assert run.xcom("simulate", "result") == {"coordinator": {"0": {"run": run.run_id}}}
    finally:
        airflow_cli("connections", "delete", conn_id)


# -- deferrable: the worker slot, the log ----------------------------------------------------


def test_deferred_task_frees_its_worker_slot(airflow_api: AirflowAPI, gate: Path) -> None:
    """Two tasks in a pool of one slot: the second runs while the first is deferred."""
    airflow_api.ensure_pool("shipyard_deploy_one_slot", 1)
    run = airflow_api.trigger(
        "shipyard_deploy_slot",
        {"name": unique("slot"), "script": counting_script(1, 2, gate, then=2)},
    )
    run.wait_deferred("deferred")
    other = run.wait_ti("other", {"success", "failed"})
    assert other["state"] == "success"
    # the first task was deferred all along, and its job still waits for the gate
    assert run.ti("deferred")["state"] == "deferred"
    gate.touch()
    assert run.wait() == "success"
    for k in (0, 1):
        assert run.job_lines("deferred", f"job/{k} ") == expected(k, 1, 4)


def test_deferrable_job_lines_reach_the_task_log_while_deferred(
    airflow_api: AirflowAPI, gate: Path
) -> None:
    run = airflow_api.trigger(
        "shipyard_deploy_deferrable",
        {"name": unique("lines"), "script": counting_script(1, 30, gate, then=30)},
    )
    run.wait_deferred("job")
    # the trigger logs the lines into the task log while the task is deferred
    wait_until(
        lambda: all(run.job_lines("job", f"job/{k} ") == expected(k, 1, 30) for k in (0, 1)),
        60,
        "the first 30 lines of each replica in the task log",
    )
    assert run.ti("job")["state"] == "deferred"
    gate.touch()
    assert run.wait() == "success"
    events = run.log_events("job")
    for k in (0, 1):
        assert [e for e in events if e.startswith(f"job/{k} ")] == expected(k, 1, 60)
    # the lines came from the trigger, before the task resumed
    resumed = max(i for i, e in enumerate(events) if "Trigger fired event" in e)
    assert sum(1 for e in events[:resumed] if e.startswith("job/")) == 120


def test_deferrable_sensor_streams_the_job_lines(airflow_api: AirflowAPI, gate: Path) -> None:
    run = airflow_api.trigger(
        "shipyard_deploy_deferrable_sensor",
        {"name": unique("sensor"), "script": counting_script(1, 5, gate, then=5)},
    )
    run.wait_deferred("wait")
    wait_until(
        lambda: run.job_lines("wait", "job/1 ") == expected(1, 1, 5),
        60,
        "the sensor's trigger to log the first lines",
    )
    gate.touch()
    assert run.wait() == "success"
    for k in (0, 1):
        assert run.job_lines("wait", f"job/{k} ") == expected(k, 1, 10)
    assert run.xcom("wait") == "SUCCEEDED"


def test_triggerer_restart_resumes_the_log_where_it_stopped(
    airflow_api: AirflowAPI, gate: Path
) -> None:
    run = airflow_api.trigger(
        "shipyard_deploy_deferrable",
        {"name": unique("restart"), "script": counting_script(1, 20, gate, then=20)},
    )
    run.wait_deferred("job")
    wait_until(
        lambda: all(run.job_lines("job", f"job/{k} ") == expected(k, 1, 20) for k in (0, 1)),
        60,
        "the first 20 lines of each replica in the task log",
    )
    restart_triggerer()
    gate.touch()
    assert run.wait() == "success"
    events = run.log_events("job")
    for k in (0, 1):
        # every line once, in order: the new triggerer went on after the 20 lines
        assert [e for e in events if e.startswith(f"job/{k} ")] == expected(k, 1, 40)
    assert any(e.endswith("after 40 lines") and "resuming the logs" in e for e in events)
    assert run.xcom("job", "state") == "SUCCEEDED"


# -- failures and cancellation ----------------------------------------------------------------


@pytest.mark.parametrize("dag_id", ["shipyard_deploy_deferrable", "shipyard_deploy_blocking"])
def test_failing_job_fails_the_task_with_its_exit_code(
    airflow_api: AirflowAPI, dag_id: str, gate: Path
) -> None:
    script = f'echo "about to fail"; while [ ! -e {gate} ]; do sleep 0.05; done; exit 3'
    run = airflow_api.trigger(dag_id, {"name": unique("fail"), "script": script})
    if dag_id == "shipyard_deploy_deferrable":
        run.wait_deferred("job")
    gate.touch()
    assert run.wait() == "failed"
    ti = run.ti("job")
    assert ti["state"] == "failed"
    try_number = int(ti["try_number"])
    # the task's error (an entry with the exception's details) names the state and exit codes;
    # the first replica to fail has code 3 (the local scheduler then stops the other one)
    log = json.dumps(run.log("job", try_number))
    failed = re.search(r"ended FAILED \(exit codes: [^)]*job/(\d)=3", log)
    assert failed, log[-3000:]
    k = int(failed.group(1))
    assert run.job_lines("job", f"job/{k} ", try_number) == [f"job/{k} about to fail"]
    # the task's "Shipyard job" link names its job (the DAG's ui_url template)
    app_id = parse_app_handle(job_handle(run)).app_id
    assert run.links("job") == {"Shipyard job": f"https://dashboard.invalid/local_cwd/{app_id}"}


@pytest.mark.parametrize("dag_id", ["shipyard_deploy_deferrable", "shipyard_deploy_blocking"])
def test_result_and_usage_reach_xcom(airflow_api: AirflowAPI, dag_id: str) -> None:
    script = 'echo "{\\"replica\\": ${replica_id}}" > "$SHIPYARD_RESULT_FILE"'
    run = airflow_api.trigger(dag_id, {"name": unique("result"), "script": script})
    assert run.wait() == "success"
    assert run.xcom("job", "result") == {"job": {"0": {"replica": 0}}}
    usage = run.xcom("job", "usage")
    assert sorted(usage) == ["job/0", "job/1"], usage
    assert all(u["wall_time"] >= 0 and u["cpu_time"] >= 0 for u in usage.values()), usage


def test_docker_usage_sampled_by_the_triggerer_reaches_xcom(airflow_api: AirflowAPI) -> None:
    """The worker resuming the task never saw the container run: the CPU time and peak in
    its usage XCom are the triggerer's samples, handed over in the trigger event."""
    require("docker", docker_problem())
    # (the sleep: a triggerer that has just started takes a few seconds to its first poll)
    burn = "t=$(($(date +%s) + 3)); while [ $(date +%s) -lt $t ]; do :; done; sleep 6"
    run = airflow_api.trigger(
        "shipyard_deploy_docker_deferrable", {"name": unique("dusage"), "script": burn}
    )
    assert run.wait() == "success"
    usage = run.xcom("job", "usage")
    assert sorted(usage) == ["job/0"], usage
    u = usage["job/0"]
    assert u["wall_time"] >= 8 and u["cpu_time"] > 0.5 and u["peak_memory"] > 0, u


def test_marking_a_running_task_failed_cancels_its_job(
    airflow_api: AirflowAPI, deploy_runner: Any, gate: Path
) -> None:
    run = airflow_api.trigger(
        "shipyard_deploy_blocking",
        {"name": unique("markrun"), "script": counting_script(1, 1, gate, then=1)},
    )
    run.wait_ti("job", {"running"})
    wait_until(lambda: run.job_lines("job", "job/0 "), 60, "the job's first line")
    handle = job_handle(run)
    run.mark("job", "failed")
    status = wait_until(
        lambda: (s := deploy_runner.status(handle)) and s.is_terminal() and s,
        60,
        f"{handle} to end",
    )
    assert status.state.name == "CANCELLED"
    assert run.wait() == "failed"


def test_marking_a_deferred_task_failed_cancels_its_job(
    airflow_api: AirflowAPI, deploy_runner: Any, gate: Path
) -> None:
    run = airflow_api.trigger(
        "shipyard_deploy_deferrable",
        {"name": unique("markdef"), "script": counting_script(1, 1, gate, then=1)},
    )
    run.wait_deferred("job")
    # the trigger runs (it logged the job's first line): a task marked failed before the
    # triggerer picked its trigger up has no trigger to kill, and its job is left running
    wait_until(lambda: run.job_lines("job", "job/0 "), 60, "the trigger to log the first line")
    handle = job_handle(run)
    assert deploy_runner.status(handle).state.name == "RUNNING"
    run.mark("job", "failed")
    status = wait_until(
        lambda: (s := deploy_runner.status(handle)) and s.is_terminal() and s,
        60,
        f"{handle} to end",
    )
    assert status.state.name == "CANCELLED"
    assert run.wait() == "failed"


def test_retry_after_the_worker_died_reattaches_to_the_job(
    airflow_api: AirflowAPI, deploy_runner: Any, gate: Path
) -> None:
    name = unique("reattach")
    run = airflow_api.trigger(
        "shipyard_deploy_blocking",
        {"name": name, "script": counting_script(1, 1, gate, then=1)},
    )
    ti = run.wait_ti("job", {"running"})
    wait_until(lambda: run.job_lines("job", "job/1 "), 60, "the job's first line")
    handle = job_handle(run)
    pid = int(ti["pid"])
    os.kill(pid, signal.SIGKILL)  # the task's process dies mid-job (OOM killer, node loss...)
    wait_until(lambda: int(run.ti("job")["try_number"]) == 2, 120, "the retry to start")
    # the retry follows the job that is still running (its first lines again, in its own log)
    wait_until(lambda: run.job_lines("job", "job/1 ", 2), 120, "the retry to follow the job")
    assert not [e for e in run.log_events("job", 2) if e.startswith("submitted ")]
    gate.touch()
    assert run.wait() == "success"
    assert run.xcom("job") == handle
    # one job in the backend for the two tries
    apps = [a for a in deploy_runner.list("local_cwd") if a.app_id.startswith(name)]
    assert [a.app_handle for a in apps] == [handle]
    for k in (0, 1):
        assert run.job_lines("job", f"job/{k} ", 2) == expected(k, 1, 2)


def test_reschedule_sensor_completes_across_scheduler_loops(
    airflow_api: AirflowAPI, gate: Path
) -> None:
    run = airflow_api.trigger(
        "shipyard_deploy_reschedule",
        {"name": unique("resched"), "script": counting_script(1, 2, gate, then=1)},
    )
    # the sensor gives its slot back between pokes
    run.wait_ti("wait", {"up_for_reschedule"})
    wait_until(
        lambda: sum("is RUNNING" in e for e in run.log_events("wait")) >= 2,
        60,
        "a second poke",
    )
    gate.touch()
    assert run.wait() == "success"
    ti = run.ti("wait")
    assert ti["try_number"] == 1  # pokes are reschedules, not retries
    assert "up_for_reschedule" in run.seen["wait"]
    assert run.xcom("wait") == "SUCCEEDED"
    for k in (0, 1):
        assert run.job_lines("wait", f"job/{k} ") == expected(k, 1, 3)


# -- requeue ----------------------------------------------------------------------------------

# the first attempt runs until preempted; a requeued one ends at once
PREEMPTIBLE = (
    '[ "$SHIPYARD_ATTEMPT" -ge 1 ] && { echo "resumed"; exit 0; };'
    ' echo "attempt $SHIPYARD_ATTEMPT"; while :; do sleep 0.2; done'
)


def _running_node(run: Run) -> str:
    """The node the run's Slurm job runs on, once it runs."""
    job_id = str(wait_until(lambda: _submitted(run), 120, "the submit"))

    def node() -> str:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-t", "RUNNING", "-o", "%N"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        return out.strip()

    return str(wait_until(node, 120, f"job {job_id} to run"))


def _submitted(run: Run) -> str | None:
    """The job's id (its ``app_id`` XCom, pushed as it is submitted), once there."""
    try:
        return str(run.xcom("job", "app_id"))
    except Exception:  # (404 until then)
        return None


@pytest.mark.parametrize("requeues", [0, 1])
def test_a_preempted_slurm_job_is_requeued_or_fails_preempted(
    airflow_api: AirflowAPI, requeues: int
) -> None:
    require("slurm", slurm_problem())
    conf = {"name": unique("preempt"), "script": PREEMPTIBLE, "max_requeues": requeues}
    run = airflow_api.trigger("shipyard_deploy_slurm_requeue", conf)
    node = _running_node(run)
    wait_until(lambda: run.job_lines("job", "job/0 ") == ["job/0 attempt 0"], 120, "attempt 0")
    preempt_node(node)
    if requeues == 0:
        assert run.wait() == "failed"
        assert (run.xcom("job", "state"), run.xcom("job", "reason")) == ("FAILED", "preempted")
        return
    assert run.wait() == "success", run.log_events("job")[-20:]
    assert run.xcom("job", "attempts") == [
        {"number": 0, "state": "PREEMPTED", "reason": "preempted", "nodes": node}
    ]
    told = (
        f"attempt 0 ended: PREEMPTED (preempted) on {node}; requeued as attempt 1 (max_requeues 1)"
    )
    assert told in run.log_events("job")
    assert run.job_lines("job", "job/0 ") == ["job/0 attempt 0", "job/0 resumed"]


def test_every_reason_reaches_its_task_xcom(airflow_api: AirflowAPI) -> None:
    """One task per reason (Docker and local processes, blocking and deferred): each fails its
    task and pushes XCom ``reason``, read through the REST API."""
    require("docker", docker_problem())
    run = airflow_api.trigger("shipyard_deploy_reasons")
    assert run.wait() == "failed"
    expected = {"oom": "oom", "timeout": "timeout", "silent": "silent", "signal": "signal",
                "dependent": "dependency"}  # fmt: skip
    assert {task: run.xcom(task, "reason") for task in expected} == expected
    assert run.ti("upstream")["state"] == "success"  # (it only submitted)
    assert run.xcom("dependent", "state") == "CANCELLED"


def test_a_task_shipyard_function_returns_its_value_through_the_api(
    airflow_api: AirflowAPI,
) -> None:
    """``@task.shipyard`` in the deployment: the dag processor's copy of the DAG file sends
    the function by value, the triggerer waits, and the value is the XCom the API gives."""
    name = unique("fn")
    run = airflow_api.trigger("shipyard_deploy_function", {"name": name, "n": 3})
    assert run.wait() == "success"
    value = run.xcom("train")
    assert value["name"] == name and value["losses"] == [1.0, 0.5, 1 / 3], value
    assert run.job_lines("train", "train/0 ") == [f"train/0 training {name} on 3 samples"]
    assert parse_app_handle(run.xcom("train", "shipyard_app_handle")).scheduler_backend == (
        "local_cwd"
    )
