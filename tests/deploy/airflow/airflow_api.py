"""A small client of the real Airflow deployment's REST API (``/api/v2``), used as users do.

The deployment is the one ``scripts/start_airflow.sh`` starts: its home holds the API URL and
the admin's password (readable by root only).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import ROOT, wait_until

REPO = ROOT
HOME = Path(os.environ.get("SHIPYARD_AIRFLOW_HOME", "/var/lib/shipyard-airflow"))
START_SCRIPT = REPO / "scripts" / "start_airflow.sh"
AIRFLOW = REPO / ".venv" / "bin" / "airflow"
#: the deployment's SHIPYARD_STATE_DIR (local jobs it started)
STATE_DIR = HOME / "shipyard-state"

FINISHED_RUN = {"success", "failed"}


def airflow_problem() -> str | None:
    """None if the deployment answers and every component is healthy, else why not."""
    url_file = HOME / "api_url"
    try:
        base = url_file.read_text().strip()
        (HOME / "admin_password").read_text()
    except OSError as e:
        return f"{url_file.parent} is not a deployment this user can read ({e})"
    try:
        health = httpx.get(f"{base}/api/v2/monitor/health", timeout=5).json()
    except Exception as e:
        return f"the API server on {base} does not answer ({e})"
    sick = {
        part: (health.get(part) or {}).get("status")
        for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
        if (health.get(part) or {}).get("status") != "healthy"
    }
    return f"unhealthy components: {sick}" if sick else None


def airflow_env() -> dict[str, str]:
    """The environment of an ``airflow`` command against the deployment (none of this
    process's ``AIRFLOW__*`` settings, e.g. the SQLite home of the dag.test() tests)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(HOME)
    return env


def airflow_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``airflow ARGS`` against the deployment; raises with its output when it fails."""
    proc = subprocess.run(
        [str(AIRFLOW), *args],
        env=airflow_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HOME / "work",
    )
    if proc.returncode != 0:
        raise AssertionError(f"airflow {args[:2]} failed: {proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Run:
    """One DAG run, as the API shows it."""

    api: AirflowAPI
    dag_id: str
    run_id: str
    #: every task-instance state seen while polling, per task
    seen: dict[str, list[str]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"/dags/{self.dag_id}/dagRuns/{self.run_id}"

    def state(self) -> str:
        return str(self.api.get(self.path)["state"])

    def ti(self, task_id: str) -> dict[str, Any]:
        ti: dict[str, Any] = self.api.get(f"{self.path}/taskInstances/{task_id}")
        states = self.seen.setdefault(task_id, [])
        if not states or states[-1] != ti["state"]:
            states.append(ti["state"])
        return ti

    def wait(self, timeout: float = 240) -> str:
        """Waits for the run to finish; returns its state."""
        state = str(
            wait_until(
                lambda: (s := self.state()) in FINISHED_RUN and s,
                timeout,
                f"run {self.run_id} of {self.dag_id} to finish",
            )
        )
        if state == "failed" and self.stale_exit_race():
            raise AssertionError(
                f"run {self.run_id}: Airflow's scheduler failed a resumed deferred task on the"
                " stale exit event of its deferring worker (apache/airflow#72716)"
            )
        return state

    def wait_ti(self, task_id: str, states: Iterable[str], timeout: float = 120) -> dict[str, Any]:
        """Waits until the task instance is in one of ``states``; returns it."""
        wanted = set(states)
        return dict(
            wait_until(
                lambda: (ti := self.ti(task_id))["state"] in wanted and ti,
                timeout,
                f"{self.dag_id}.{task_id} to be {sorted(wanted)} (seen: {self.seen.get(task_id)})",
            )
        )

    def wait_deferred(self, task_id: str, timeout: float = 120) -> dict[str, Any]:
        """Waits until the task is deferred and the scheduler has taken in its worker's exit.

        Until then a trigger that fires (a job let go on) can make the resumed task fail: Airflow
        3.3 takes the late exit event of the deferring worker for the resumed try's end and fails
        it ("finished with state success, but the task instance's state attribute is running",
        apache/airflow#72716). Users see this race too; the tests wait it out.

        The scheduler's receipt of the event is what closes the race: in the same pass it either
        records it ("TaskInstance Finished ... state=deferred") or, when another process holds
        the task instance's row at that instant (its ``SELECT ... FOR UPDATE SKIP LOCKED``),
        drops it without a word; either way no late exit event is left to fail the resumed try.
        """
        ti = self.wait_ti(task_id, {"deferred"}, timeout)
        marker = (
            "Received executor event with state success for task instance TaskInstanceKey("
            f"dag_id='{self.dag_id}', task_id='{task_id}', run_id='{self.run_id}'"
        )
        wait_until(
            lambda: marker in (HOME / "logs" / "scheduler.out").read_text(errors="replace"),
            timeout,
            f"the scheduler to take in the exit of {task_id}'s deferring worker",
        )
        return ti

    def stale_exit_race(self) -> bool:
        """Whether Airflow's scheduler failed a resumed task of this run on a stale exit event
        of its deferring worker (apache/airflow#72716)."""
        text = (HOME / "logs" / "scheduler.out").read_text(errors="replace")
        return any(
            f"run_id={self.run_id}" in line or self.run_id in line
            for line in text.splitlines()
            if "but the task instance's state attribute is running" in line
        )

    def log(self, task_id: str, try_number: int | None = None) -> list[dict[str, Any]]:
        """The task's log entries (the trigger's part included), in the API's order."""
        if try_number is None:
            try_number = int(self.ti(task_id)["try_number"]) or 1
        body = self.api.get(
            f"{self.path}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        return [e for e in body.get("content", []) if isinstance(e, dict)]

    def log_events(self, task_id: str, try_number: int | None = None) -> list[str]:
        """The messages of the task's log, in order."""
        return [str(e.get("event", "")) for e in self.log(task_id, try_number)]

    def job_lines(self, task_id: str, prefix: str, try_number: int | None = None) -> list[str]:
        """The job's lines of replica ``prefix`` (e.g. ``"job/0 "``) in the task's log."""
        return [e for e in self.log_events(task_id, try_number) if e.startswith(prefix)]

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        return self.api.get(f"{self.path}/taskInstances/{task_id}/xcomEntries/{key}")["value"]

    def links(self, task_id: str) -> dict[str, str | None]:
        """The task's extra links, by name, as the UI gets them."""
        return self.api.get(f"{self.path}/taskInstances/{task_id}/links")["extra_links"]  # type: ignore[no-any-return]

    def mark(self, task_id: str, state: str) -> None:
        """Sets the task instance's state, as a user does in the UI."""
        self.api.request("PATCH", f"{self.path}/taskInstances/{task_id}", json={"new_state": state})


class AirflowAPI:
    """The deployment's REST API, authenticated as its admin (token from ``/auth/token``)."""

    def __init__(self) -> None:
        self.base = (HOME / "api_url").read_text().strip()
        self._password = (HOME / "admin_password").read_text().strip()
        self._client = httpx.Client(base_url=f"{self.base}/api/v2", timeout=30)
        self._login()

    def _login(self) -> None:
        r = httpx.post(
            f"{self.base}/auth/token",
            json={"username": "admin", "password": self._password},
            timeout=30,
        )
        r.raise_for_status()
        self._client.headers["Authorization"] = f"Bearer {r.json()['access_token']}"

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self._client.request(method, path, **kwargs)
        if r.status_code == 401:  # the token expired
            self._login()
            r = self._client.request(method, path, **kwargs)
        if r.status_code >= 400:
            raise AssertionError(f"{method} {path}: HTTP {r.status_code}: {r.text}")
        return r.json() if r.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def close(self) -> None:
        self._client.close()

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Waits until the dag processor has parsed ``dag_id`` (fails on an import error)."""

        def parsed() -> bool:
            errors = self.get("/importErrors")["import_errors"]
            if errors:
                raise AssertionError(f"DAG import errors: {json.dumps(errors)[:2000]}")
            r = self._client.get(f"/dags/{dag_id}")
            return r.status_code == 200

        wait_until(parsed, timeout, f"the DAG {dag_id} to be parsed")

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> Run:
        """Triggers a run of ``dag_id`` with ``conf``."""
        self.wait_for_dag(dag_id)
        if self.get(f"/dags/{dag_id}")["is_paused"]:
            self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        run_id = f"test__{uuid.uuid4().hex[:12]}"
        body = self.request(
            "POST",
            f"/dags/{dag_id}/dagRuns",
            json={"dag_run_id": run_id, "logical_date": None, "conf": conf or {}},
        )
        return Run(self, dag_id, body["dag_run_id"])

    def ensure_pool(self, name: str, slots: int) -> None:
        r = self._client.get(f"/pools/{name}")
        if r.status_code == 404:
            self.request(
                "POST", "/pools", json={"name": name, "slots": slots, "include_deferred": False}
            )
        else:
            self.request(
                "PATCH",
                f"/pools/{name}",
                json={"pool": name, "slots": slots, "include_deferred": False},
            )


def pid_of(name: str) -> int:
    """The pid of the deployment's ``airflow NAME`` process (from its pid file)."""
    return int((HOME / "run" / f"{name}.pid").read_text().strip())


def restart_triggerer() -> float:
    """Stops the triggerer (SIGTERM, as a deployment restarts it), waits until it is gone,
    starts it again with scripts/start_airflow.sh; returns how long it took."""
    t0 = time.monotonic()
    pid = pid_of("triggerer")
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not _alive(pid), 60, f"the triggerer (pid {pid}) to exit")
    subprocess.run(["bash", str(START_SCRIPT)], check=True, timeout=300, capture_output=True)
    assert pid_of("triggerer") != pid
    return time.monotonic() - t0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone too (its parent, the shell that started it, may not have reaped it)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
