"""Issue 19 on the real Slurm cluster: results through the runner over every transport, usage
from accounting (within 20% of what the replica measured), OUT_OF_MEMORY named, and
``sbatch --test-only`` pre-flight checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.reports import format_bytes
from core.runner import Runner
from core.schedulers.api import DescribeAppResponse
from core.schedulers.slurm import outcome
from core.schedulers.slurm.jobinfo import SEP
from core.schedulers.slurm.usage import parse_usage
from core.specs import AppDef, AppState, ReplicaStatus, Resource, Role, RoleStatus, make_app_handle
from tests.integration.docker.usage_probe import MEASURE
from tests.integration.slurm.slurm_clusters import CLUSTERS, Cluster, make_cluster, wait

WRITE = (
    "import json, os; json.dump({'rank': os.environ['SHIPYARD_REPLICA_ID'], 'ok': True},"
    " open(os.environ['SHIPYARD_RESULT_FILE'], 'w'))"
)


@pytest.fixture(params=CLUSTERS)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def _runner(cluster: Cluster) -> Runner:
    return Runner("test", {"slurm": lambda session, **kw: cluster.sched})


def test_result_comes_back_through_the_runner(cluster: Cluster) -> None:
    job_dir, _ = cluster.job_dir("results")
    app = AppDef(
        "res",
        [
            Role("w", entrypoint=cluster.python, args=["-c", WRITE], num_replicas=2),
            Role("quiet", entrypoint="true"),
        ],
    )
    app_id = cluster.submit(app, {"job_dir": job_dir, "result_replicas": "all"})
    assert cluster.wait_done(app_id).state == AppState.SUCCEEDED
    result = _runner(cluster).result(make_app_handle("slurm", "test", app_id))
    assert result.values() == {"w": {0: {"rank": "0", "ok": True}, 1: {"rank": "1", "ok": True}}}
    assert result.get("quiet") is None and result.errors == []


def test_invalid_result_names_the_replica(local_cluster_: Cluster) -> None:
    cluster = local_cluster_
    job_dir, _ = cluster.job_dir("bad")
    bad = "import os; open(os.environ['SHIPYARD_RESULT_FILE'], 'w').write('[1, 2')"
    app_id = cluster.submit(
        AppDef("bad", [Role("b", entrypoint=cluster.python, args=["-c", bad])]),
        {"job_dir": job_dir},
    )
    assert cluster.wait_done(app_id).state == AppState.SUCCEEDED
    errors = _runner(cluster).result(make_app_handle("slurm", "test", app_id)).errors
    assert len(errors) == 1 and errors[0].startswith("b/0: result file is not valid JSON")


@pytest.fixture
def local_cluster_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    yield from make_cluster("local", tmp_path, monkeypatch)


@pytest.fixture(params=["local", "ssh"])
def command_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    """The transports that run Slurm's commands (sacct, sbatch --test-only)."""
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def test_usage_within_20_percent_of_what_the_replica_measured(command_cluster: Cluster) -> None:
    cluster = command_cluster
    job_dir, _ = cluster.job_dir("usage")
    app = AppDef(
        "use",
        [Role("m", entrypoint=cluster.python, args=["-c", MEASURE], resource=Resource(1, 0, 1000))],
    )
    app_id = cluster.submit(app, {"job_dir": job_dir})
    cluster.wait_done(app_id, timeout=600)  # (a loaded host stretches it)

    def usage() -> Any:
        desc = cluster.sched.describe(app_id)
        return desc is not None and desc.roles_statuses[0].replicas[0].usage

    u = wait(usage, 60, "accounting to have the step's usage")
    own = _runner(cluster).result(make_app_handle("slurm", "test", app_id)).get("m")
    assert u.cpu_time == pytest.approx(own["cpu"], rel=0.2)
    assert u.peak_memory == pytest.approx(own["maxrss"], rel=0.2)
    assert u.wall_time == pytest.approx(own["wall"], rel=0.2)
    assert u.requested_memory == 1000 << 20


def test_preflight_reports_a_bad_partition_and_missing_entrypoints_at_once(
    command_cluster: Cluster,
) -> None:
    cluster = command_cluster
    runner = _runner(cluster)
    app = AppDef(
        "pre",
        [
            Role("a", entrypoint="no-such-command-shipyard"),
            Role("b", entrypoint="/no/such/file"),
            Role("c", entrypoint="./no-such-script.sh"),
            Role("d", entrypoint="true", env={"PATH": "/no/such/dir"}),  # the role's own PATH
            Role("e", entrypoint="true"),
        ],
    )
    problems = runner.preflight(app, "slurm", cluster.cfg({"partition": "no-such-partition"}))
    assert [p.field for p in problems] == ["cfg.partition"] * 5 + [
        f"roles[{i}].entrypoint" for i in range(4)
    ]
    assert all(p.is_error for p in problems)
    assert all("no-such-partition" in p.message for p in problems[:5])
    assert [p.message.split(":")[0] for p in problems[:5]] == ["a-0", "b-0", "c-0", "d-0", "e-0"]
    assert "'no-such-command-shipyard' was not found on PATH" in problems[5].message
    assert "'/no/such/file' does not exist" in problems[6].message
    assert "'./no-such-script.sh' does not exist in " in problems[7].message
    assert "'true' was not found on PATH" in problems[8].message
    fine = runner.preflight(
        AppDef("ok", [Role("a", entrypoint="true"), Role("b", entrypoint=cluster.python)]),
        "slurm",
        cluster.cfg(),
    )
    assert [p.severity for p in fine] == ["info", "info"]
    assert all(p.message.startswith("would start at ") for p in fine)
    assert cluster.jobs == []  # nothing was queued


@pytest.fixture
def rest_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    yield from make_cluster("rest", tmp_path, monkeypatch)


def test_preflight_over_slurmrestd_checks_the_partition_and_memory(rest_cluster: Cluster) -> None:
    """slurmrestd has no test-only submission: the partition and the nodes' memory are looked
    up, and a warning says what is left to the submit."""
    cluster = rest_cluster
    runner = _runner(cluster)
    app = AppDef(
        "pre",
        [
            Role("a", entrypoint="true"),
            Role("big", entrypoint="true", resource=Resource(1, 0, 9000)),
        ],
    )
    problems = runner.preflight(app, "slurm", cluster.cfg({"partition": "no-such-partition"}))
    assert [p.field for p in problems if p.is_error] == ["cfg.partition"]
    assert (
        "no partition 'no-such-partition' on the cluster (it has: debug, urgent)"
        in problems[0].message
    )
    problems = runner.preflight(app, "slurm", cluster.cfg())
    assert [(p.field, p.severity) for p in problems] == [
        ("roles[1].resource.memMB", "error"),
        ("cfg.cluster", "warning"),
    ]
    assert problems[0].message == "big: asks for 9000 MB, but the nodes of debug have 4000 MB"
    assert cluster.jobs == []


def test_oom_killed_component_is_named_with_its_peak() -> None:
    """OUT_OF_MEMORY from accounting (task/cgroup enforcement) becomes the replica's message
    (the test cluster enforces with OverMemoryKill instead: the test below)."""
    rows = [
        ["7+0", "w-0", "OUT_OF_MEMORY", "12", "00:03.500", "", "512M", "0:125"],
        ["7+0.batch", "batch", "OUT_OF_MEMORY", "12", "00:00.010", "9000K", "", "0:125"],
        ["7+0.0", "python3", "OUT_OF_MEMORY", "12", "00:03.490", "524000K", "", "0:125"],
    ]
    usage = parse_usage("\n".join(SEP.join(r) for r in rows))["7"]
    resp = DescribeAppResponse(
        app_id="7",
        state=AppState.FAILED,
        msg="OUT_OF_MEMORY",
        roles_statuses=[RoleStatus("w", [ReplicaStatus(0, AppState.FAILED, "w", "node1")])],
    )
    outcome.apply_usage(resp, usage)
    replica = resp.roles_statuses[0].replicas[0]
    assert replica.usage is not None and replica.usage.oom_killed
    assert replica.usage.cpu_time == pytest.approx(3.49)
    assert (
        replica.structured_error_msg
        == "w/0 killed: out of memory (peak 512 MiB of 512 MiB requested)"
    )
    assert resp.msg.startswith("w/0 killed: out of memory")


@pytest.mark.parametrize(
    ("state", "code", "oom"),
    [
        ("CANCELLED", "0:9", True),  # OverMemoryKill (what the test cluster's killed step shows)
        ("FAILED", "0:9", True),
        ("FAILED", "1:0", False),  # past --mem on a cluster that does not enforce it, then failed
        ("CANCELLED", "0:15", False),  # scancel's SIGTERM
        ("COMPLETED", "0:0", False),
    ],
)
def test_only_a_sigkilled_step_past_its_request_is_out_of_memory(
    state: str, code: str, oom: bool
) -> None:
    rows = [
        ["8+0", "w-0", "FAILED", "5", "", "", "300M", "9:0"],
        ["8+0.0", "python3", state, "5", "00:01.000", "600000K", "", code],
    ]
    usage, _ = parse_usage("\n".join(SEP.join(r) for r in rows))["8"]["w-0"]
    assert usage.peak_memory == 600000 << 10 and usage.oom_killed is oom


def test_gpu_memory_peak_from_tres_usage() -> None:
    """Where the cluster gathers GPU usage, TRESUsageInMax has gres/gpumem (this one does not)."""
    tres = "cpu=00:01:00,gres/gpumem=3000M,gres/gpuutil=97,mem=2G,vmem=3G"
    rows = [
        ["9", "t-0", "COMPLETED", "70", "", "", "4000M", "0:0", ""],
        ["9.0", "python3", "COMPLETED", "70", "01:00.000", "2G", "", "0:0", tres],
    ]
    usage, _ = parse_usage("\n".join(SEP.join(r) for r in rows))["9"]["t-0"]
    assert usage.peak_gpu_memory == 3000 << 20 and usage.peak_memory == 2 << 30
    assert usage.format() == "wall 70.0s, cpu 60.0s, peak 2 GiB of 3.9 GiB, GPU peak 2.9 GiB"


HOG = r"""
import time
held = []
for _ in range(200):  # 20 MiB more every 50 ms, touched, until Slurm kills it
    b = bytearray(20 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    held.append(b)
    time.sleep(0.05)
"""


def test_a_replica_past_its_mem_is_named_out_of_memory_with_its_peak(
    command_cluster: Cluster,
) -> None:
    """The test cluster enforces --mem as OverMemoryKill does (scripts/start_slurm.sh): the
    replica is killed, and its message names the OOM kill with its sampled peak."""
    cluster = command_cluster
    job_dir, _ = cluster.job_dir("oom")
    app = AppDef(
        "oom",
        [
            Role("hog", entrypoint=cluster.python, args=["-c", HOG], resource=Resource(1, 0, 300)),
            Role("ok", entrypoint="true"),
        ],
    )
    app_id = cluster.submit(app, {"job_dir": job_dir})
    assert cluster.wait_done(app_id, timeout=300).state == AppState.FAILED

    def replica(desc: DescribeAppResponse, role: str) -> ReplicaStatus:
        return next(rs.replicas[0] for rs in desc.roles_statuses if rs.role == role)

    def named() -> Any:
        desc = cluster.sched.describe(app_id)
        return desc if desc is not None and replica(desc, "hog").usage is not None else None

    desc = wait(named, 60, "accounting to have the killed step")
    hog = replica(desc, "hog")
    assert hog.state == AppState.FAILED and hog.usage.oom_killed
    assert hog.usage.requested_memory == 300 << 20
    assert hog.usage.peak_memory > 300 << 20  # (sampled just before the kill)
    peak = format_bytes(hog.usage.peak_memory)
    assert str(hog.structured_error_msg) == (
        f"hog/0 killed: out of memory (peak {peak} of 300 MiB requested)"
    )
    assert desc.msg.startswith("hog/0 killed: out of memory")
    ok = replica(desc, "ok")
    assert ok.usage is not None and not ok.usage.oom_killed
    # the reason, for code (status --json, XComs, errors)
    from core.runner import get_runner
    from core.specs import make_app_handle

    with get_runner("test") as runner:
        status = runner.status(make_app_handle("slurm", "test", app_id))
    assert status is not None and status.reason == "oom"
    assert {rs.role: rs.replicas[0].reason for rs in status.roles} == {
        "hog": "oom",
        "ok": "exit_code",
    }
