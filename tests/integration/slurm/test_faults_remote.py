"""The cluster's front doors restarted mid-wait (issue 30): slurmrestd, and the SSH login
node's sshd with every connection to it. The wait treats the outage as transient and the next
call reconnects; the job runs once and is not submitted again.

The rig's slurmrestd (22.05) runs in a loop that starts it again a second after it died, as
its service would; sshd is started again by scripts/start_slurm_remote.sh (idempotent), as
the tests found it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.specs import AppDef, AppState, Role
from tests.helpers import ROOT, wait_until
from tests.integration.slurm.slurm_clusters import ADMIN_ENV, REMOTE_USER, Cluster, make_cluster

REST_LOOP_PID = Path("/run/shipyard-slurmrestd.pid")
SSHD_PID = Path("/run/shipyard-sshd.pid")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(d))
    return out


def _restart_slurmrestd() -> None:
    (old,) = _children(int(REST_LOOP_PID.read_text()))
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: [p for p in _children(int(REST_LOOP_PID.read_text())) if p != old],
               30, "slurmrestd to be started again")  # fmt: skip


def _restart_sshd() -> None:
    """sshd and every session it serves gone (the login node rebooted), then started again."""
    master = int(SSHD_PID.read_text())
    sessions = _children(master)
    os.kill(master, signal.SIGTERM)
    for pid in sessions:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    wait_until(lambda: not Path(f"/proc/{master}").exists(), 30, "sshd to stop")
    subprocess.run(["bash", str(ROOT / "scripts" / "start_slurm_remote.sh")], env=ADMIN_ENV, check=True,
                   capture_output=True)  # fmt: skip


@pytest.fixture(params=["rest", "ssh"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def test_front_door_restarted_mid_wait(cluster: Cluster) -> None:
    go = cluster.scratch / "go"
    name = f"door{uuid.uuid4().hex[:6]}"  # (the role's name: Slurm names the job after it)
    script = f"echo up; while [ ! -e {go} ]; do sleep 0.1; done; echo bye"
    app = AppDef(name, [Role(name, entrypoint="/bin/sh", args=["-c", script])])
    with get_runner(f"pytest-door-{uuid.uuid4().hex[:6]}") as runner:
        handle = runner.run(app, "slurm", cluster.cfg())
        cluster.jobs.append(handle.rsplit("/", 1)[1])
        wait_until(lambda: _state(runner, handle) == AppState.RUNNING, 90, "the job to run")
        waited: dict[str, Any] = {}

        def follow() -> None:
            try:
                waited["status"] = runner.wait(handle, wait_interval=0.2, timeout=300)
            except BaseException as e:  # (the test reports it)
                waited["error"] = e

        follower = threading.Thread(target=follow)
        follower.start()
        (_restart_slurmrestd if cluster.transport == "rest" else _restart_sshd)()
        go.touch()
        follower.join(timeout=300)
        assert "error" not in waited, waited
        assert waited["status"] is not None and waited["status"].state == AppState.SUCCEEDED
        lines = list(runner.log_lines(handle, name, 0))
        assert [ln.strip() for ln in lines] == ["up", "bye"], lines
    # one job of that name on the cluster: nothing was submitted again
    jobs = subprocess.run(["squeue", "-h", "-t", "all", "-u", REMOTE_USER, "-o", "%i %j"],
                          env=ADMIN_ENV, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert sum(name in line for line in jobs.splitlines()) == 1, jobs


def _state(runner: Runner, handle: str) -> AppState | None:
    st = runner.status(handle)
    return None if st is None else st.state
