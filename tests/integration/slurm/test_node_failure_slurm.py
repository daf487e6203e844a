"""A real node failure on the Slurm cluster (issue 27): the node's ``slurmd`` stops answering
(SIGSTOP) while a job runs there; after ``SlurmdTimeout`` (60 s on the test cluster) the
controller marks the node down and the job NODE_FAIL, and requeues it (``max_requeues``). With
``exclude_failed_nodes`` the describe that sees it pending keeps it off that node: once the node
is back and idle, the job still waits for another one."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.specs import AppDef, AppState, Resource, Role
from tests.integration.slurm.slurm_clusters import ADMIN_ENV, Cluster, make_cluster, wait

FAILING = "node2"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    yield from make_cluster("local", tmp_path, monkeypatch)


def _admin(*argv: str) -> str:
    p = subprocess.run(argv, env=ADMIN_ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def _job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job -o``'s KEY=VALUE fields of the job."""
    out = _admin("scontrol", "show", "job", "-o", job_id)
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def _blocker(node: str) -> str:
    """A job of the administrator holding the whole of ``node``."""
    return _admin("sbatch", "--parsable", "-w", node, "-c", "2", "-o", "/dev/null",
                  "--wrap", "sleep 600")  # fmt: skip


def _node_state(node: str) -> str:
    return _admin("sinfo", "-h", "-n", node, "-o", "%T")


def test_a_node_failure_requeues_the_job_off_the_failed_node(cluster: Cluster) -> None:
    job_dir, path = cluster.job_dir("nodefail")
    script = (
        'echo "$SHIPYARD_ATTEMPT $SLURMD_NODENAME" >>"$SHIPYARD_CHECKPOINT_DIR/attempts";'
        ' [ "$SHIPYARD_ATTEMPT" = 0 ] && exec sleep 600; exit 0'
    )
    role = Role("w", entrypoint="bash", args=["-c", script], resource=Resource(2, 0, 512))
    blockers = [_blocker(n) for n in ("node1", "node3")]
    pid = int(Path(f"/run/slurmd-{FAILING}.pid").read_text())
    try:
        wait(lambda: all(_job_fields(b)["JobState"] == "RUNNING" for b in blockers))
        cfg = {"job_dir": job_dir, "max_requeues": 1, "exclude_failed_nodes": True}
        app_id = cluster.submit(AppDef("nodefail", [role]), cfg)
        job = cluster.job_id(app_id)
        running = cluster.wait_state(app_id, {AppState.RUNNING})
        assert running.roles_statuses[0].replicas[0].hostname == FAILING
        # the replica itself runs (its step launched through the node's slurmd): stopped any
        # earlier, slurmd fails the step's launch and the job ends FAILED, not NODE_FAIL
        attempts = path / f"shipyard-checkpoint-{job}" / "attempts"
        wait(lambda: attempts.exists() and attempts.read_text().strip(), 60, "the replica")
        os.kill(pid, signal.SIGSTOP)  # the node stops answering the controller
        try:
            # (each describe is what a watch does: the one that sees the requeue excludes)
            pending = cluster.wait_state(app_id, {AppState.PENDING}, timeout=180)
            assert pending.num_restarts == 1, pending
            wait(
                lambda: (
                    cluster.sched.describe(app_id)
                    and _job_fields(job).get("ExcNodeList") == FAILING
                )
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        wait(lambda: _node_state(FAILING) == "idle", 120, f"{FAILING} back and idle")
        # eligible, looked at by the scheduler with the failed node idle: it still waits
        wait(lambda: _job_fields(job)["Reason"] == "Resources", 120, "the job to wait for a node")
        assert _job_fields(job)["JobState"] == "PENDING"
        _admin("scancel", blockers[0])
        done = cluster.wait_done(app_id, timeout=120)
    finally:
        for b in blockers:
            subprocess.run(["scancel", b], env=ADMIN_ENV, check=False)
    assert done.state == AppState.SUCCEEDED, done
    ckpt = path / f"shipyard-checkpoint-{job}"
    assert ckpt.joinpath("attempts").read_text().split("\n")[:2] == [f"0 {FAILING}", "1 node1"]
    assert [(a.number, a.reason, a.nodes) for a in done.attempts] == [(0, "node_failure", FAILING)]
