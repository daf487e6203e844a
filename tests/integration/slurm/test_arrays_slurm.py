"""Arrays on the real Slurm cluster, through each transport (local commands, SSH, slurmrestd).

Each element is a job of its own, started by the array's driver as slots free (a native
``--array`` job is the next step)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.runner import Runner, get_runner
from core.specs import Role
from tests.integration import arrays
from tests.integration.slurm.slurm_clusters import TRANSPORTS, Cluster, make_cluster


@pytest.fixture(params=TRANSPORTS)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


@pytest.fixture
def slurm_runner(cluster: Cluster) -> Iterator[Runner]:
    with get_runner(f"pytest-arr-{uuid.uuid4().hex[:8]}") as runner:
        yield runner


def role(script: str) -> Role:
    return Role("w", entrypoint="sh", args=["-c", script])


def test_elements_at_most_four_at_once_each_once(slurm_runner: Runner, cluster: Cluster) -> None:
    records = str(cluster.scratch)
    # (each element a job of its own, submitted one after another: ~1.6 s through slurmrestd)
    arrays.check_cap_and_once(slurm_runner, "slurm", cluster.cfg(), role, records, 8, 1)


def test_cancel_mid_array(slurm_runner: Runner, cluster: Cluster) -> None:
    arrays.check_cancel(slurm_runner, "slurm", cluster.cfg(), role, str(cluster.scratch))


@pytest.mark.parametrize("cluster", ["local"], indirect=True)
def test_retry_failed_reruns_only_the_failed(slurm_runner: Runner, cluster: Cluster) -> None:
    arrays.check_retry_failed(slurm_runner, "slurm", cluster.cfg(), role, str(cluster.scratch))


@pytest.mark.parametrize("cluster", ["local"], indirect=True)
def test_submitter_killed_after_submit_changes_nothing(
    slurm_runner: Runner, cluster: Cluster
) -> None:
    records = str(cluster.scratch)
    arrays.check_submitter_killed(slurm_runner, "slurm", cluster.cfg(), role, records, 6)


@pytest.mark.parametrize("cluster", ["local", "rest"], indirect=True)
def test_a_chain_runs_in_order_and_a_failure_cancels_what_waits(
    slurm_runner: Runner, cluster: Cluster
) -> None:
    arrays.check_chain(slurm_runner, "slurm", cluster.cfg(), role, str(cluster.scratch))
