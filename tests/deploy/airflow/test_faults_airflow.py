"""Fault tests of the real Airflow deployment (issue 30): its scheduler restarted under running
work, what users of Airflow expect of it checked through the REST API (the task's state, its
XComs, its log) and the backend (the jobs the local scheduler knows).

The deployment's scheduler runs the tasks itself (LocalExecutor: its worker processes are its
children). Stopped as a service manager stops it (SIGTERM), it stops scheduling but waits for
the running tasks to end ("Shutting down LocalExecutor; waiting for running tasks to finish"):
a restart under a long task ends in a SIGKILL after the manager's grace (systemd's
``TimeoutStopSec``, Kubernetes' grace period). Its worker processes live on. The new scheduler
cannot adopt another scheduler's LocalExecutor tasks: once the dead one's heartbeat is
``scheduler_health_check_threshold`` (30 s) old, it resets them (a new try of each), and the
worker still running the old try is told to kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from core.specs import AppState, parse_app_handle
from tests.deploy.airflow.airflow_api import HOME, START_SCRIPT, AirflowAPI, Run, _alive, pid_of
from tests.deploy.airflow.test_airflow_deployment import counting_script, expected, unique
from tests.helpers import wait_until

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

SCHEDULER_LOG = HOME / "logs" / "scheduler.out"
#: what a task's log says when its worker kills it because its task instance moved on
KILLED = "Server indicated the task shouldn't be running anymore. Terminating process"


def children(pid: int) -> dict[int, str]:
    """The child processes of ``pid``: their command lines, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        cmd = cmdline(int(entry.name)) if ppid == pid else None
        if cmd is not None:
            found[int(entry.name)] = cmd
    return found


def cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return None


class SchedulerRestart:
    """Stops the deployment's scheduler as a service manager does and starts it again as
    scripts/start_airflow.sh does (it starts the processes that are not running)."""

    def __init__(self) -> None:
        self.pid = pid_of("scheduler")
        self.children = children(self.pid)
        self.signalled = False

    def stop(self) -> None:
        """SIGTERM; once it says it waits for the running tasks, SIGKILL (what a service manager
        does after its grace); then its log server, which holds the port the next one needs."""
        os.kill(self.pid, signal.SIGTERM)
        self.signalled = True
        wait_until(
            lambda: (
                "waiting for running tasks to finish" in SCHEDULER_LOG.read_text(errors="replace")
            ),
            60,
            "the scheduler to shut down its LocalExecutor",
        )
        # it stopped scheduling, and stays for its running task (the blocking one)
        assert _alive(self.pid), "the scheduler exited under a running task"
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        if _alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)
            wait_until(lambda: not _alive(self.pid), 30, f"the scheduler (pid {self.pid}) to die")
        for pid, cmd in self.children.items():
            if "serve-logs" in cmd and _alive(pid) and cmdline(pid) == cmd:
                os.kill(pid, signal.SIGTERM)
                wait_until(lambda: not _alive(pid), 30, f"its log server (pid {pid}) to end")  # noqa: B023

    def start(self) -> None:
        subprocess.run(["bash", str(START_SCRIPT)], check=True, timeout=300, capture_output=True)
        assert pid_of("scheduler") != self.pid

    def restore(self) -> None:
        """Whatever happened: no process of the stopped scheduler but its workers (each ends
        with its task), and a healthy scheduler running (the script waits for its health)."""
        if self.signalled:
            self._kill_leftovers()
        subprocess.run(["bash", str(START_SCRIPT)], check=True, timeout=300, capture_output=True)


def events(run: Run, try_number: int) -> list[str]:
    return run.log_events("job", try_number)


def jobs_named(runner: Any, name: str) -> list[str]:
    """The handles of the local jobs whose app is named ``name`` (app ids start with it)."""
    return [a.app_handle for a in runner.list("local_cwd") if a.app_id.startswith(f"{name}-")]


def submitted(lines: list[str]) -> list[str]:
    """The handles the task log says were submitted."""
    return [e.split()[1] for e in lines if e.startswith("submitted ")]


def first_lines(run: Run, try_number: int | None = None) -> bool:
    """Whether the task log holds the job's first five lines of each replica, once each."""
    return all(run.job_lines("job", f"job/{k} ", try_number) == expected(k, 1, 5) for k in (0, 1))


def test_scheduler_restarted_while_tasks_wait(
    airflow_api: AirflowAPI, deploy_runner: Any, gate: Path
) -> None:
    """A blocking task waits on its job in a worker and a deferred one in the triggerer when
    the scheduler is stopped and started again: each ends in success with one job, whose
    lines reach the task log once each."""
    gate_d = gate.with_name(gate.name + "-deferred")
    name_b, name_d = unique("schedb"), unique("schedd")
    blocking = airflow_api.trigger(
        "shipyard_deploy_blocking", {"name": name_b, "script": counting_script(1, 5, gate, 5)}
    )
    deferred = airflow_api.trigger(
        "shipyard_deploy_deferrable", {"name": name_d, "script": counting_script(1, 5, gate_d, 5)}
    )
    blocking.wait_ti("job", {"running"})
    deferred.wait_deferred("job")
    for run in (blocking, deferred):
        wait_until(lambda: first_lines(run), 60, f"the first lines of {run.dag_id}'s job")  # noqa: B023
    restart = SchedulerRestart()
    try:
        restart.stop()
        # no scheduler: the deferred job ends, its trigger fires, and the task waits (scheduled)
        gate_d.touch()
        deferred.wait_ti("job", {"scheduled"}, 60)
        restart.start()
        assert deferred.wait() == "success"
        # the new scheduler resets the orphaned blocking task: the worker still running its
        # first try kills it (at its next heartbeat), and its next try follows the job
        wait_until(lambda: blocking.ti("job")["try_number"] == 2, 120, "the blocking task's reset")
        wait_until(lambda: KILLED in events(blocking, 1), 60, "Airflow to kill the first try")
        wait_until(lambda: first_lines(blocking, 2), 120, "the second try to follow the job")
        gate.touch()
        assert blocking.wait() == "success", events(blocking, 2)[-20:]
    finally:
        gate.touch()
        gate_d.touch()
        try:
            restart.restore()
        finally:
            gate_d.unlink(missing_ok=True)

    # the deferred task: one try, one job, each line once
    assert "scheduled" in deferred.seen["job"]
    ti = deferred.ti("job")
    assert (ti["state"], ti["try_number"]) == ("success", 1)
    (handle_d,) = submitted(events(deferred, 1))
    assert jobs_named(deploy_runner, name_d) == [handle_d]
    assert deploy_runner.status(handle_d).state == AppState.SUCCEEDED
    assert deferred.xcom("job") == handle_d
    assert deferred.xcom("job", "app_id") == parse_app_handle(handle_d).app_id
    for k in (0, 1):
        assert deferred.job_lines("job", f"job/{k} ") == expected(k, 1, 10)

    # the blocking task: its first try submitted the job and left it to the second, which
    # re-attached to it and followed it to its end
    ti = blocking.ti("job")
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    first, second = events(blocking, 1), events(blocking, 2)
    (handle_b,) = submitted(first)
    assert not submitted(second), second
    assert any(e.startswith(f"leaving {handle_b} running") for e in first), first
    assert not any(e.startswith("cancelling ") for e in first), first
    # the first try stopped when told (it did not go on following the job beside the second)
    stopped = first.index(KILLED)
    assert not any(e.startswith("job/") for e in first[stopped:]), first[stopped:]
    assert "Reconnecting to existing job" in second
    assert jobs_named(deploy_runner, name_b) == [handle_b]
    assert deploy_runner.status(handle_b).state == AppState.SUCCEEDED
    assert blocking.xcom("job") == handle_b
    assert blocking.xcom("job", "app_id") == parse_app_handle(handle_b).app_id
    for k in (0, 1):
        # the second try's log has every line once; the first try's, the first ones once
        assert blocking.job_lines("job", f"job/{k} ", 2) == expected(k, 1, 10)
        early = blocking.job_lines("job", f"job/{k} ", 1)
        assert len(early) >= 5 and early == expected(k, 1, len(early)), early
