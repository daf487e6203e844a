"""Requeue on the real Slurm cluster: a job in the high-priority partition ``urgent`` preempts
what runs on its node (``PreemptMode=REQUEUE``; the steps get SIGTERM and KillWait seconds).
With ``max_requeues`` Slurm requeues the job (same id, ``$SHIPYARD_ATTEMPT`` counting) until the
script turns requeue off on the last allowed attempt; without it the job ends ``preempted``.
``requeue_on_timeout`` requeues the job itself shortly before its time limit.

The replica is a training-like loop: one line per step done, its counter saved to
``$SHIPYARD_CHECKPOINT_DIR`` on the checkpoint signal (it goes on) and on SIGTERM (it stops, as
the steps of a requeued or preempted job get SIGTERM and KillWait seconds), resumed from there."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.specs import AppDef, AppState, Resource, Role, make_app_handle
from tests.integration.local.test_cli import SHIPYARD
from tests.integration.slurm.slurm_clusters import (
    CLUSTERS,
    SLOW_CLUSTERS,
    Cluster,
    make_cluster,
    remote_clusters,
    wait,
)


@pytest.fixture(params=CLUSTERS)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def _training(steps: int) -> AppDef:
    """One replica taking a whole node (so that an urgent job there preempts it)."""
    script = f"""
d="$SHIPYARD_CHECKPOINT_DIR"; n=$(cat "$d/counter" 2>/dev/null || echo 0)
echo "$SHIPYARD_ATTEMPT $n $SLURMD_NODENAME" >>"$d/attempts"
stop=0; save=0; trap 'stop=1' TERM; trap 'save=1' USR1
while [ "$n" -lt {steps} ] && [ "$stop" = 0 ]; do
  sleep 0.2; echo "$n" >>"$d/steps"; n=$((n+1))
  [ "$save" = 0 ] || {{ echo "$n" >"$d/counter"; save=0; }}
done
echo "$n" >"$d/counter"
[ "$n" -ge {steps} ] || exec sleep 120
"""
    role = Role("train", entrypoint="bash", args=["-c", script], resource=Resource(2, 0, 1024))
    return AppDef("training", [role])


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _status_json(app_id: str) -> dict[str, Any]:
    """``shipyard status --json`` of the app, as a user runs it."""
    handle = make_app_handle("slurm", "test", app_id)
    p = subprocess.run([SHIPYARD, "status", "--json", handle], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def _preempt_after(cluster: Cluster, app_id: str, ckpt: Path, steps: int, attempt: int) -> None:
    """Once attempt ``attempt`` has done ``steps`` more steps, preempts it."""
    done = len(_lines(ckpt / "steps"))
    wait(
        lambda: (
            len(_lines(ckpt / "attempts")) > attempt and len(_lines(ckpt / "steps")) >= done + steps
        ),
        120,
        f"attempt {attempt} to do {steps} steps",
    )
    desc = cluster.sched.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING and desc.num_restarts == attempt
    cluster.preempt(desc.roles_statuses[0].replicas[0].hostname)


@pytest.mark.parametrize("cluster", SLOW_CLUSTERS, indirect=True)
def test_a_job_preempted_twice_resumes_and_does_every_step_once(cluster: Cluster) -> None:
    job_dir, path = cluster.job_dir("training")
    app_id = cluster.submit(_training(60), {"job_dir": job_dir, "max_requeues": 2})
    ckpt = path / f"shipyard-checkpoint-{cluster.job_id(app_id)}"
    _preempt_after(cluster, app_id, ckpt, 5, attempt=0)
    requeued = cluster.wait_state(app_id, {AppState.PENDING})  # never FAILED in between
    assert requeued.num_restarts == 1 and requeued.reason is None
    _preempt_after(cluster, app_id, ckpt, 5, attempt=1)
    desc = cluster.wait_done(app_id, timeout=180)
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 2, desc
    assert _lines(ckpt / "steps") == [str(i) for i in range(60)]  # each step once
    attempts = [line.split() for line in _lines(ckpt / "attempts")]
    assert [a[0] for a in attempts] == ["0", "1", "2"]
    assert [int(a[1]) for a in attempts] == sorted({int(a[1]) for a in attempts})  # resumed
    assert not (path / f"shipyard-retries-{cluster.job_id(app_id)}").exists()  # no retry spent
    nodes = [a[2] for a in attempts]
    assert [(a.number, a.state, a.reason, a.nodes) for a in desc.attempts] == [
        (0, "PREEMPTED", "preempted", nodes[0]),
        (1, "PREEMPTED", "preempted", nodes[1]),
    ]
    status = _status_json(app_id)
    assert status["state"] == "SUCCEEDED" and status["num_restarts"] == 2
    assert [(a["number"], a["reason"]) for a in status["attempts"]] == [
        (0, "preempted"),
        (1, "preempted"),
    ]


@pytest.mark.parametrize("cluster", ["local", "rest", "rest-26"], indirect=True)
def test_a_preempted_job_without_requeues_ends_preempted(cluster: Cluster) -> None:
    job_dir, path = cluster.job_dir("training")
    app_id = cluster.submit(_training(600), {"job_dir": job_dir})
    ckpt = path / f"shipyard-checkpoint-{cluster.job_id(app_id)}"
    _preempt_after(cluster, app_id, ckpt, 3, attempt=0)
    desc = cluster.wait_done(app_id)
    assert (desc.state, desc.reason, desc.num_restarts) == (AppState.FAILED, "preempted", 0)
    assert "PREEMPTED" in desc.msg
    status = _status_json(app_id)
    assert (status["state"], status["reason"], status["attempts"]) == ("FAILED", "preempted", [])
    assert int(_lines(ckpt / "counter")[0]) == len(_lines(ckpt / "steps"))  # saved on SIGTERM


def test_requeue_on_timeout_requeues_before_the_limit_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On both releases at once (ssh: the commands a local client runs)."""
    with remote_clusters(["ssh", "rest-26"], tmp_path, monkeypatch) as clusters:
        jobs = []
        for c in clusters:
            job_dir, path = c.job_dir("training")
            cfg = {
                "job_dir": job_dir,
                "time_limit": "1m",
                "checkpoint_signal": "USR1",
                "checkpoint_grace": 40,
                "max_requeues": 1,
                "requeue_on_timeout": True,
            }
            # 300 steps (~63 s): more than the first attempt can do before its requeue (30 s
            # after a warning that Slurm sends 0-20 s in), less than what the second can do
            # before its limit
            jobs.append((c, c.submit(_training(300), cfg), path))
        for c, app_id, path in jobs:
            _resumed_after_its_requeue(c, app_id, path)


def _resumed_after_its_requeue(cluster: Cluster, app_id: str, path: Path) -> None:
    ckpt = path / f"shipyard-checkpoint-{cluster.job_id(app_id)}"
    desc = cluster.wait_done(app_id, timeout=300)
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 1, (cluster.name, desc)
    assert _lines(ckpt / "steps") == [str(i) for i in range(300)], cluster.name
    assert [a.split()[0] for a in _lines(ckpt / "attempts")] == ["0", "1"], cluster.name
    assert [(a.number, a.state) for a in desc.attempts] == [(0, "REQUEUED")], cluster.name
    err = (path / f"slurm-{cluster.job_id(app_id)}.out").read_text()
    assert "shipyard: time limit near: requeueing job" in err, cluster.name


def test_requeue_on_timeout_over_slurmrestd_is_refused_before_submitting() -> None:
    from core.schedulers.slurm import rest_v0038
    from core.schedulers.slurm.scheduler import SlurmScheduler

    cfg = {"time_limit": "1h", "max_requeues": 1, "requeue_on_timeout": True}
    req = SlurmScheduler("s").submit_dryrun(_training(1), cfg).request
    with pytest.raises(ValueError, match="cfg.requeue_on_timeout: slurmrestd's v0.0.38 API"):
        rest_v0038.submission(req, "/w", hold=False, env={})
