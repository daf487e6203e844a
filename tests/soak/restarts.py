"""The services the soak restarts, one at a time, as a service manager does (SIGTERM, SIGKILL
after a grace), each brought back by its start script (idempotent: it starts what is not
running and returns once the service answers)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT, live_processes, pid_alive, wait_until

SCRIPTS = ROOT / "scripts"
AIRFLOW_RUN = Path(os.environ.get("SHIPYARD_AIRFLOW_HOME", "/var/lib/shipyard-airflow")) / "run"
PREFECT_RUN = Path(os.environ.get("SHIPYARD_PREFECT_HOME", "/var/lib/shipyard-prefect")) / "run"
SLURMCTLD_PID = Path("/run/slurmctld.pid")
#: seconds a stopped service has before its SIGKILL (a service manager's grace)
GRACE = 20.0


@dataclass
class Restart:
    """One restart done: which service, when (seconds into the soak), how long it was down."""

    service: str
    at: float
    downtime: float = 0.0
    error: str | None = None
    #: replicas of the soak's jobs running when it stopped (their command lines carry its tag)
    replicas: int = 0


def read_pid(path: Path) -> int:
    return int(path.read_text().strip())


def children(pid: int) -> list[int]:
    """The pids of the child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def stop(pid: int, what: str) -> None:
    """SIGTERM; SIGKILL if still alive after :data:`GRACE` seconds."""
    os.kill(pid, signal.SIGTERM)
    try:
        wait_until(lambda: not pid_alive(pid), GRACE, f"{what} (pid {pid}) to stop")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 30, f"{what} (pid {pid}) to die")


def run_script(name: str) -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPTS / name)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed: {proc.stderr[-2000:]}")


def airflow_triggerer() -> None:
    stop(read_pid(AIRFLOW_RUN / "triggerer.pid"), "the Airflow triggerer")
    run_script("start_airflow.sh")


def airflow_scheduler() -> None:
    """The scheduler waits for its LocalExecutor's running tasks on SIGTERM, so it usually
    takes the SIGKILL; its log server holds the port the next one needs, so it goes too."""
    pid = read_pid(AIRFLOW_RUN / "scheduler.pid")
    logs = [k for k in children(pid) if "serve-logs" in cmdline(k) or "serve_logs" in cmdline(k)]
    stop(pid, "the Airflow scheduler")
    for k in logs:
        if pid_alive(k):
            stop(k, "the scheduler's log server")
    run_script("start_airflow.sh")


def prefect_server() -> None:
    stop(read_pid(PREFECT_RUN / "server.pid"), "the Prefect server")
    run_script("start_prefect.sh")


def prefect_worker() -> None:
    stop(read_pid(PREFECT_RUN / "worker.pid"), "the Prefect worker")
    run_script("start_prefect.sh")


def slurmctld() -> None:
    stop(read_pid(SLURMCTLD_PID), "slurmctld")
    run_script("start_slurm.sh")


#: the rotation, in order
ROTATION: list[tuple[str, Callable[[], None]]] = [
    ("airflow-triggerer", airflow_triggerer),
    ("prefect-server", prefect_server),
    ("slurmctld", slurmctld),
    ("airflow-scheduler", airflow_scheduler),
    ("prefect-worker", prefect_worker),
]


def restart(index: int, started: float, tag: str) -> Restart:
    """Restarts the ``index``-th service of the rotation; never raises (errors are recorded)."""
    name, fn = ROTATION[index % len(ROTATION)]
    replicas = sum(bool(re.match(r"\S*sh -c : ", cmd)) for _, cmd in live_processes(tag))
    record = Restart(name, time.monotonic() - started, replicas=replicas)
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # recorded as a failure of the soak
        record.error = f"{type(e).__name__}: {e}"
    record.downtime = time.monotonic() - t0
    return record


def restore_all() -> list[str]:
    """Runs every start script (idempotent); returns the failures."""
    failures = []
    for script in ("start_slurm.sh", "start_airflow.sh", "start_prefect.sh"):
        try:
            run_script(script)
        except Exception as e:
            failures.append(str(e))
    return failures
