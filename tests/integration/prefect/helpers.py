"""Helpers for the Prefect tests: apps, reading a flow run's logs and task runs from the Prefect
API, and checking that no job is left running."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from core.runner import get_runner
from core.specs import AppDef, AppState, Role
from tests.helpers import ROOT, pid_alive, wait_until

#: how long a condition may take before a test fails (generous: 2 shared cores)
DEADLINE = 60.0


def flush_logs() -> None:
    """Sends the log records Prefect still buffers to the API."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)


def flow_run_logs(flow_run_id: Any) -> list[str]:
    """Messages of every log record of a flow run (its tasks' included), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    flush_logs()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )
    return [entry.message for entry in logs]


def flow_run_artifacts(flow_run_id: Any) -> list[Any]:
    """The artifacts of a flow run, from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return list(
            client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )
        )


def task_runs(flow_run_id: Any) -> list[Any]:
    """The task runs of a flow run, from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return list(
            client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
        )


def flow_run(flow_run_id: Any) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def sh_app(name: str, roles: dict[str, tuple[int, str]]) -> AppDef:
    """An app whose roles run ``sh -c script`` with ``num_replicas`` replicas each."""
    return AppDef(
        name,
        [
            Role(r, entrypoint="sh", args=["-c", script], num_replicas=n)
            for r, (n, script) in roles.items()
        ],
    )


def sleeper_app(name: str, pid_dir: Path) -> AppDef:
    """Two roles (a x1, b x2) that record their pid, say "started" and sleep for 5 minutes."""
    # (not $$: "$$" is the macro escape for "$")
    script = (
        f'read -r pid rest < /proc/self/stat; echo "$pid" > {pid_dir}/"$0-$1.pid";'
        " echo started; exec sleep 300"
    )
    return AppDef(
        name,
        [
            Role(r, entrypoint="sh", args=["-c", script, r, "${replica_id}"], num_replicas=n)
            for r, n in (("a", 1), ("b", 2))
        ],
    )


def apps_named(name: str, scheduler: str = "local_cwd") -> list[str]:
    """Handles of the apps called ``name`` on ``scheduler``."""
    with get_runner() as runner:
        return [a.app_handle for a in runner.list(scheduler) if a.app_id.startswith(f"{name}-")]


def started_pids(pid_dir: Path, count: int = 3) -> list[int]:
    """Waits until ``count`` replicas wrote their pid; returns the pids."""

    def pids() -> list[int] | None:
        files = list(pid_dir.glob("*.pid"))
        texts = [f.read_text().strip() for f in files]
        if len(files) < count or not all(texts):
            return None
        return [int(t) for t in texts]

    return wait_until(pids, DEADLINE, f"{count} replicas to start")  # type: ignore[no-any-return]


def assert_no_running_job(name: str, pids: list[int], scheduler: str = "local_cwd") -> None:
    """Every app called ``name`` ends CANCELLED and none of its processes is left."""
    handles = apps_named(name, scheduler)
    assert handles, f"no app called {name}"
    with get_runner() as runner:
        for handle in handles:
            status = wait_until(
                lambda h=handle: (s := runner.status(h)) is not None and s.is_terminal() and s,
                DEADLINE,
                f"{handle} to end",
            )
            assert status.state == AppState.CANCELLED, status
    wait_until(lambda: not any(pid_alive(p) for p in pids), DEADLINE, f"processes {pids} to exit")


def job_env(prefect_server: str) -> dict[str, str]:
    """Environment for a subprocess that runs flows against the test server."""
    env = dict(os.environ)
    env["PREFECT_API_URL"] = prefect_server
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    root = str(ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env
