"""Fault tests of the real Prefect deployment (issue 30): the Prefect server restarted under the
Shipyard worker while a flow run of a deployment on the ``shipyard`` pool runs its job; what
users of Prefect expect of it checked through the API (the run's state and logs) and the backend
(the jobs the local scheduler knows).

The job runs the flow's engine, which logs through the API; the worker follows the job and
forwards its output. Neither needs the server while the job runs: Prefect's client retries a
refused connection once it had connected (``PREFECT_CLIENT_MAX_RETRIES`` times, backing off
2, 4, 8... s), so the log batches sent while the server is down reach it once it is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from core.specs import AppState
from tests.deploy.prefect.prefect_api import HOME, REPO, FlowRun, deploy, start_run
from tests.helpers import pid_alive, wait_until

pytestmark = [pytest.mark.prefect, pytest.mark.timeout(600)]

START_SCRIPT = REPO / "scripts" / "start_prefect.sh"


def server_pid() -> int | None:
    """The server's pid, if its pid file names a live ``prefect server start``."""
    try:
        pid = int((HOME / "run" / "server.pid").read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if b"prefect server start" in cmd and pid_alive(pid) else None


def start_prefect() -> None:
    """scripts/start_prefect.sh: starts what is not running, returns once the API answers."""
    proc = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"start_prefect.sh failed: {proc.stderr}")


def run_logs(run: FlowRun) -> list[tuple[float, str]]:
    """Every log of the run (all pages): its time (epoch seconds) and message, in order."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs: list[tuple[float, str]] = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])),
                limit=200,
                offset=len(logs),
            )
            logs += [(log.timestamp.timestamp(), log.message) for log in page]
            if len(page) < 200:
                return logs


def numbered(run: FlowRun, tag: str) -> list[tuple[float, str]]:
    """The logs of the flow's numbered lines (``TAG line N``, ``TAG end N``)."""
    return [(t, m) for t, m in run_logs(run) if m.startswith(f"{tag} ")]


@pytest.mark.parametrize("flow_ends", ["after", "during"])
def test_server_restarted_under_a_running_flow_run(
    prefect_api: str, deploy_runner: Any, gate: Path, flow_ends: str
) -> None:
    """The server stops (SIGTERM, by its pid file) and starts again (the start script) while
    the run's job logs a line every 0.25 s, the flow ending after the restart or while the
    server is down: the run completes, its job ran once, and each line is in the run's logs
    once, those logged while the server was down included."""
    tag = f"srv-{uuid.uuid4().hex[:8]}"
    run = start_run(
        deploy("logged_lines", {"scheduler": "local_cwd"}), {"tag": tag, "gate": str(gate)}
    )
    handle = run.handle()
    wait_until(lambda: len(numbered(run, tag)) >= 5, 300, "the first lines in the run's logs")
    assert run.state() == "RUNNING"
    pid = server_pid()
    assert pid is not None, "the Prefect server is not running"
    try:
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not pid_alive(pid), 60, f"the server (pid {pid}) to stop")
        down = time.time()
        assert deploy_runner.status(handle).state == AppState.RUNNING  # (it needs no server)
        if flow_ends == "during":
            gate.touch()  # its last lines, its final state: sent while no server answers
        start_prefect()
        up = time.time()
        assert server_pid() not in (None, pid)
        if flow_ends == "after":  # the lines logged meanwhile come in, then new ones
            wait_until(
                lambda: any(t > up for t, _ in numbered(run, tag)), 120, "lines after restart"
            )
    finally:
        gate.touch()  # the flow logs its last line and ends
        if server_pid() is None:
            start_prefect()
    assert run.wait() == "COMPLETED", run.logs()
    run.wait_log(f"Shipyard job {handle} ended SUCCEEDED (exit code 0)")

    logs = numbered(run, tag)
    lines = [m for _, m in logs]
    n = int(lines[-1].rsplit(" ", 1)[1])
    # each line once, in order, none missing: those logged while no server ran too
    assert lines == [f"{tag} line {i}" for i in range(n)] + [f"{tag} end {n}"], lines
    assert any(down < t < up for t, _ in logs), (down, up, [t for t, _ in logs])
    if flow_ends == "during":
        assert down < logs[-1][0] < up, (down, up, logs[-1])
    # one job, run once (one engine start), submitted once
    messages = [m for _, m in run_logs(run)]
    assert sum(m.startswith("Beginning flow run") for m in messages) == 1, messages
    submits = [m for m in messages if m.startswith("Shipyard job ") and " (idempotency key " in m]
    assert len(submits) == 1 and submits[0].startswith(f"Shipyard job {handle} submitted ("), (
        submits
    )
    name = run.read().name
    apps = [
        a.app_handle for a in deploy_runner.list("local_cwd") if a.app_id.startswith(f"{name}-")
    ]
    assert apps == [handle]
    assert deploy_runner.status(handle).state == AppState.SUCCEEDED
    assert run.read().infrastructure_pid == handle
