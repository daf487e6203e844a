"""Python functions as jobs on the real Slurm clusters, through each transport: one batch job
per call, one native array per map. Behind the login node or slurmrestd the job runs as the
cluster user with the cluster's own Python (scripts/cluster_python.sh), and checks it first."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.runner import Runner, get_runner
from tests.integration import functions
from tests.integration.slurm.slurm_clusters import CLUSTERS, Cluster, make_cluster
from tests.services import require

CLUSTER_PYTHON = os.environ.get("SHIPYARD_CLUSTER_PYTHON", "/opt/shipyard-cluster-python")


@pytest.fixture(params=CLUSTERS)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


@pytest.fixture
def slurm_runner(cluster: Cluster) -> Iterator[Runner]:
    with get_runner(f"pytest-fn-{uuid.uuid4().hex[:8]}") as runner:
        yield runner


def _cluster_cfg(cluster: Cluster, python: str | None = None) -> dict[str, str]:
    if not cluster.remote:
        return cluster.cfg()  # (this interpreter: the cluster shares this host's files)
    if python is None:
        python = f"{CLUSTER_PYTHON}/bin/python"
        require("services", None if os.path.exists(python) else f"no {python}")
    return cluster.cfg({"python": python})


def test_value_exception_and_map(slurm_runner: Runner, cluster: Cluster) -> None:
    functions.check_value_exception_and_map(slurm_runner, "slurm", _cluster_cfg(cluster))


@pytest.fixture(params=["ssh", "rest-26"])
def remote(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def test_remote_job_checks_its_interpreter(remote: Cluster) -> None:
    """No pre-flight can run the cluster's Python from here: the job refuses to start with
    the reason (Debian's python3 there has no cloudpickle), and the wait says it."""
    cluster = remote
    cfg = _cluster_cfg(cluster, "/usr/bin/python3")
    with get_runner(f"pytest-fn-{uuid.uuid4().hex[:8]}") as runner:
        handle = runner.run_function(functions.square, 3, scheduler="slurm", cfg=cfg)
        functions.check_no_outcome(
            runner, handle, r"python: this job's interpreter \(/usr/bin/python3.*cloudpickle"
        )
