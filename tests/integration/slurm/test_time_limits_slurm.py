"""Time limits and the checkpoint signal on the real Slurm cluster: ``time_limit`` is
``--time`` (whole minutes), ``checkpoint_signal`` is ``--signal=B:SIG@grace``, passed on by the
batch shell to the replica through ``srun`` (over slurmrestd 22.05, whose v0.0.38 API refuses
``B:``, ``SIG@grace``: Slurm signals the job's steps itself); the job ends with reason
``timeout``. On both releases (``-26``: Slurm 26.05)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.specs import AppDef, AppState, Role
from tests.integration.slurm.slurm_clusters import Cluster, make_cluster, remote_clusters


@pytest.fixture(params=["local", "ssh", "local-26", "rest-26"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def test_a_job_over_its_limit_gets_the_signal_then_ends_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On each release and API at once (ssh: the commands a local client runs)."""
    cfg = {"time_limit": "1m", "checkpoint_signal": "USR1", "checkpoint_grace": 40}
    with remote_clusters(["ssh", "rest", "rest-26"], tmp_path, monkeypatch) as clusters:
        jobs = []
        for c in clusters:
            record = c.scratch / "signals"
            script = f"trap 'echo USR1 >> {record}' USR1; while :; do sleep 1; done"
            app = AppDef("limited", [Role("w", entrypoint="sh", args=["-c", script])])
            jobs.append((c, c.submit(app, cfg), record))
        for c, app_id, record in jobs:
            # (Slurm checks limits on its own period: the job ends a little after its minute)
            desc = c.wait_done(app_id, timeout=240)
            assert desc.state == AppState.FAILED and desc.reason == "timeout", (c.name, desc)
            assert desc.roles_statuses[0].replicas[0].reason == "timeout", c.name
            # the replica got it, once, before the end
            assert record.read_text().split() == ["USR1"], c.name


def test_a_job_in_time_is_left_alone(cluster: Cluster) -> None:
    app = AppDef("quick", [Role("w", entrypoint="sh", args=["-c", "exit 0"])])
    app_id = cluster.submit(app, {"time_limit": "5m", "checkpoint_signal": "USR1"})
    assert cluster.wait_done(app_id).state == AppState.SUCCEEDED


@pytest.mark.parametrize("cluster", ["local", "ssh", "rest-26"], indirect=True)
def test_a_requeued_job_resumes_from_its_checkpoint_directory(cluster: Cluster) -> None:
    # (max_retries requeues the job itself: same job id, SLURM_RESTART_COUNT counts attempts)
    script = (
        'd="$SHIPYARD_CHECKPOINT_DIR"; echo "$SHIPYARD_ATTEMPT" >> "$d/attempts";'
        ' [ -e "$d/saved" ] || { touch "$d/saved"; exit 3; }'
    )
    app = AppDef("resume", [Role("w", entrypoint="sh", args=["-c", script], max_retries=1)])
    job_dir, path = cluster.job_dir("resume")
    app_id = cluster.submit(app, {"job_dir": job_dir})
    desc = cluster.wait_done(app_id, timeout=180)
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 1, desc
    checkpoint = path / f"shipyard-checkpoint-{cluster.job_id(app_id)}"
    assert (checkpoint / "attempts").read_text().split() == ["0", "1"]
