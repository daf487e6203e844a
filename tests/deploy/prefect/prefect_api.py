"""Helpers for the tests that drive the real Prefect server and Shipyard worker
(scripts/start_prefect.sh): where they live, whether they run, deploying and running flows as
users do, and reading what users see (the run's state and logs, the worker's log)."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, wait_until

#: where scripts/start_prefect.sh keeps the deployment
HOME = Path(os.environ.get("SHIPYARD_PREFECT_HOME", "/var/lib/shipyard-prefect"))
REPO = ROOT
VENV = Path(os.environ.get("SHIPYARD_VENV", REPO / ".venv"))
FLOWS = Path(__file__).resolve().parent / "flows"
#: the Shipyard state directory of the worker (local jobs' records)
STATE_DIR = HOME / "shipyard-state"
WORKER_LOG = HOME / "logs" / "worker.out"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


def api_url() -> str:
    return (HOME / "api_url").read_text().strip()


def pool_name() -> str:
    return (HOME / "pool").read_text().strip()


def worker_pid() -> int | None:
    """The worker's pid, if the process the pid file names is a live Prefect worker."""
    try:
        pid = int((HOME / "run" / "worker.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if b"prefect worker start" in cmdline else None


def prefect_problem() -> str | None:
    """None if the server answers and the worker runs, else why not."""
    import urllib.request

    if not (HOME / "api_url").exists():
        return f"{HOME}/api_url does not exist"
    try:
        with urllib.request.urlopen(api_url() + "/health", timeout=5) as r:
            if r.read().strip() != b"true":
                return "the API is not healthy"
    except OSError as e:
        return f"the API does not answer at {api_url()} ({e})"
    if worker_pid() is None:
        return "the Shipyard worker is not running"
    return None


def prefect_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``prefect ARGS`` against the server; raises with its output when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_API_URL"] = api_url()
    proc = subprocess.run(
        [str(VENV / "bin" / "prefect"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if proc.returncode != 0:
        raise AssertionError(f"prefect {args[:3]} failed: {proc.stdout}\n{proc.stderr}")
    return proc


def kill_worker() -> str:
    """SIGKILLs the worker; returns its log as it was when it died (scripts/start_prefect.sh
    starts the next worker's log afresh)."""
    pid = worker_pid()
    assert pid is not None, "the Shipyard worker is not running"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_pid() is None, 30, f"the worker (pid {pid}) to exit")
    return worker_log()


def restart_worker(kill: bool = True) -> None:
    """SIGKILLs the worker (when ``kill``) and starts it again with scripts/start_prefect.sh."""
    pid = worker_pid()
    if kill and pid is not None:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: worker_pid() is None, 30, f"the worker (pid {pid}) to exit")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "start_prefect.sh")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(f"start_prefect.sh failed: {proc.stderr}")


def deploy(entry: str, job_variables: dict[str, Any] | None = None, directory: Path = FLOWS) -> str:
    """Deploys the flow ``entry`` of deploy_flows.py (tests/deploy/prefect/flows, or a copy in
    ``directory``) to the Shipyard pool (``flow.from_source(...).deploy(...)``); returns its id."""
    from prefect import flow

    source = flow.from_source(source=str(directory), entrypoint=f"deploy_flows.py:{entry}")
    deployment_id = source.deploy(  # type: ignore[union-attr]
        name=f"{entry}-{uuid.uuid4().hex[:8]}",
        work_pool_name=pool_name(),
        job_variables=job_variables or {},
        print_next_steps=False,
    )
    return str(deployment_id)


@dataclass
class FlowRun:
    """One flow run, as the API shows it."""

    id: uuid.UUID

    def read(self) -> Any:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            return client.read_flow_run(self.id)

    def state(self) -> str:
        run = self.read()
        return run.state.type.value if run.state else "NONE"

    def wait(self, timeout: float = 300) -> str:
        """Waits for the run to end; returns its state type (``COMPLETED`` ...)."""
        return str(
            wait_until(
                lambda: (s := self.state()) in FINAL and s, timeout, f"flow run {self.id} to end"
            )
        )

    def wait_state(self, wanted: str, timeout: float = 300) -> None:
        wait_until(lambda: self.state() == wanted, timeout, f"flow run {self.id} to be {wanted}")

    def handle(self) -> str:
        """The app handle of its job (the flow run's infrastructure pid)."""
        return str(wait_until(lambda: self.read().infrastructure_pid, 120, f"the job of {self.id}"))

    def logs(self) -> list[str]:
        """The messages of the run's logs, in order."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        with get_client(sync_client=True) as client:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[self.id])), limit=200
            )
        return [log.message for log in logs]

    def wait_log(self, needle: str, timeout: float = 60) -> str:
        """Waits for a line of the run's logs that contains ``needle``; returns it."""
        return str(
            wait_until(
                lambda: next((m for m in self.logs() if needle in m), None),
                timeout,
                f"{needle!r} in the logs of flow run {self.id}",
            )
        )


def start_run(deployment_id: str, parameters: dict[str, Any] | None = None) -> FlowRun:
    """Starts a run of the deployment through the API (``run_deployment``), without waiting."""
    from prefect.deployments import run_deployment

    run = run_deployment(uuid.UUID(deployment_id), parameters=parameters or {}, timeout=0)
    return FlowRun(run.id)


def worker_log() -> str:
    return WORKER_LOG.read_text(errors="replace")
