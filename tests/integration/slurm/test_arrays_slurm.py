"""Arrays on the real Slurm cluster, through each transport (local commands, SSH, slurmrestd).

An app of one replica runs as one native array (``sbatch --array=...%cap``: Slurm keeps the
cap; each element is the task ``<job id>_<index>``); an app of several replicas (a het job,
which cannot be an array) runs as one job per element, started by the array's driver as slots
free."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.arrays import native_app_id
from core.runner import Runner, get_runner
from core.specs import AppDef, AppState, Role, parse_app_handle
from tests.integration import arrays
from tests.integration.slurm.slurm_clusters import CLUSTERS, Cluster, make_cluster, wait


@pytest.fixture(params=CLUSTERS)
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
    # (50 elements: one native array, so one submit however many)
    status = arrays.check_cap_and_once(slurm_runner, "slurm", cluster.cfg(), role, records, 50)
    # one native array: every element is a task of the same Slurm job
    assert status.elements is not None
    app_ids = [(e.handle or "").rsplit("/", 1)[1] for e in status.elements]
    jobs = {a.rpartition(":")[2].split("_")[0] for a in app_ids}
    assert len(jobs) == 1 and all(a.endswith(f"_{i}") for i, a in enumerate(app_ids)), app_ids


@pytest.mark.parametrize("cluster", ["local"], indirect=True)
def test_slurm_itself_records_the_elements_as_one_array(
    slurm_runner: Runner, cluster: Cluster
) -> None:
    app = AppDef("native", [role("exit $((SHIPYARD_ARRAY_INDEX == 2))")])
    handle = slurm_runner.run_array(app, "slurm", cluster.cfg(), size=4, max_parallel=2)
    status = arrays.final(slurm_runner, handle)
    assert status.counts() == {"SUCCEEDED": 3, "FAILED": 1}
    assert status.elements is not None
    job = (status.elements[0].handle or "").rsplit("/", 1)[1].split("_")[0]

    def accounted() -> list[tuple[str, ...]]:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State,ExitCode"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        rows = sorted(tuple(line.split("|")) for line in out.split())
        # (accounting hears of each task, and of the array job being task 3, a little later)
        return rows if [r[0] for r in rows] == [f"{job}_{i}" for i in range(4)] else []

    rows = wait(accounted, 60, "accounting to record the 4 tasks")
    assert rows == [
        (f"{job}_0", "COMPLETED", "0:0"),
        (f"{job}_1", "COMPLETED", "0:0"),
        (f"{job}_2", "FAILED", "1:0"),
        (f"{job}_3", "COMPLETED", "0:0"),
    ]


@pytest.mark.parametrize("cluster", ["local"], indirect=True)
def test_an_app_of_two_replicas_runs_one_job_per_element_under_the_cap(
    slurm_runner: Runner, cluster: Cluster
) -> None:
    records = str(cluster.scratch)
    app = AppDef(
        "pairs",
        [
            Role(
                "w",
                entrypoint="sh",
                args=["-c", arrays.recording(records, "sleep 1")],
                num_replicas=2,
            )
        ],
    )
    handle = slurm_runner.run_array(app, "slurm", cluster.cfg(), size=4, max_parallel=1)
    status = arrays.final(slurm_runner, handle)
    assert status.counts() == {"SUCCEEDED": 4}
    assert status.elements is not None
    app_ids = [(e.handle or "").rsplit("/", 1)[1] for e in status.elements]
    assert len(set(app_ids)) == 4 and not any("_" in a for a in app_ids), app_ids
    # both replicas of an element run at once; two elements never do
    assert arrays.runs(records) == {i: 2 for i in range(4)}
    assert arrays.most_at_once(records) == 2


def test_cancel_mid_array(slurm_runner: Runner, cluster: Cluster) -> None:
    arrays.check_cancel(slurm_runner, "slurm", cluster.cfg(), role, str(cluster.scratch))


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


@pytest.mark.parametrize("cluster", ["local", "rest"], indirect=True)
def test_jobs_that_wait_are_held_by_slurm_itself(slurm_runner: Runner, cluster: Cluster) -> None:
    records = cluster.scratch / "order"
    go = cluster.scratch / "go"  # (a runs until the test has seen what waits for it)
    wait_go = f"t=0; while [ ! -e {go} ] && [ $t -lt 1200 ]; do sleep 0.1; t=$((t+1)); done"
    a = slurm_runner.run(
        AppDef("a", [role(f"{wait_go}; echo a >> {records}")]), "slurm", cluster.cfg()
    )
    b = slurm_runner.run(
        AppDef("b", [role(f"echo b >> {records}")]), "slurm", cluster.cfg(), after=[a]
    )
    c = slurm_runner.run_array(
        AppDef("c", [role(f"echo c$SHIPYARD_ARRAY_INDEX >> {records}")]), "slurm",
        cluster.cfg(), size=2, after=[b], after_condition="any",
    )  # fmt: skip
    # each is queued in Slurm at once (not by a driver once its dependency ended)
    queued = slurm_runner.status(c)
    assert queued is not None and queued.elements is not None
    assert all(e.handle for e in queued.elements), queued.elements

    def reason_dependency() -> bool:
        s = slurm_runner.status(b)
        return s is not None and s.msg == "PENDING (Dependency)"

    wait(reason_dependency, 60, "Slurm to hold b for its dependency")
    a_job = a.rsplit("/", 1)[1].rpartition(":")[2]
    p = parse_app_handle(b)
    b_job = (native_app_id(p.scheduler_backend, p.session_name, p.app_id) or "").rpartition(":")[2]
    if not cluster.remote:
        out = subprocess.run(
            ["squeue", "-h", "-j", b_job, "-O", "Dependency"], capture_output=True, text=True
        ).stdout  # fmt: skip
        assert out.strip().startswith(f"afterok:{a_job}"), out
    go.touch()
    assert arrays.final(slurm_runner, c).state == AppState.SUCCEEDED
    lines = records.read_text().split()
    assert lines[:2] == ["a", "b"] and sorted(lines[2:]) == ["c0", "c1"], lines


@pytest.mark.parametrize("cluster", ["local"], indirect=True)
def test_an_array_cancelled_as_soon_as_submitted_ends_cancelled(
    slurm_runner: Runner, cluster: Cluster
) -> None:
    # (the cancel may reach the driver before it took the native submission its submitter made)
    app = AppDef("quick", [role("sleep 300")])
    handle = slurm_runner.run_array(app, "slurm", cluster.cfg(), size=5, max_parallel=2)
    slurm_runner.cancel(handle)
    status = arrays.final(slurm_runner, handle, timeout=60)
    assert status.counts() == {"CANCELLED": 5}, status
    assert status.elements is not None and all(e.handle for e in status.elements)
    job = (status.elements[0].handle or "").rsplit("/", 1)[1].split("_")[0]
    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", job, "-t", "PD,R"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "", out.stdout
