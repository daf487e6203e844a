"""run_job on the real Docker engine and the real Slurm cluster: the job succeeds, its result
comes back, its log lines are in the Prefect API, and a task timeout cancels it on the
backend."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.runner import get_runner
from core.specs import AppDef, AppState, Resource, Role
from prefect_tasks import get_job_result, run_job, submit_job, wait_for_job
from tests.helpers import ROOT, wait_until
from tests.integration.prefect.helpers import DEADLINE, flow_run_artifacts, flow_run_logs

IMAGE = "shipyard-test/busybox:latest"


RESULT = """echo '{"coordinated": true}' > "$SHIPYARD_RESULT_FILE\""""


def _app(name: str, image: str = "") -> AppDef:
    return AppDef(
        name,
        [
            Role(
                "coord", image=image, entrypoint="sh", args=["-c", f"echo coord says hi; {RESULT}"]
            ),
            Role(
                "worker",
                image=image,
                entrypoint="sh",
                args=["-c", 'echo "worker $0 line 1"; echo "worker $0 line 2"', "${replica_id}"],
                num_replicas=2,
            ),
        ],
    )


EXPECTED = ["coord/0 coord says hi"] + [
    f"worker/{k} worker {k} line {i}" for k in (0, 1) for i in (1, 2)
]


SLEEPS_UNTIL_TERM = "trap 'exit 143' TERM; echo started; sleep 300 & wait"


def _sleeper(name: str, image: str = "") -> AppDef:
    return AppDef(
        name,
        # (ends at SIGTERM: the engine or slurmd need not wait out their grace to kill it)
        [Role("main", image=image, entrypoint="sh", args=["-c", SLEEPS_UNTIL_TERM])],
    )


def _check_run_job(
    name: str, scheduler: str, app: AppDef, cfg: dict[str, Any] | None = None
) -> None:
    state = run_job(app, scheduler=scheduler, cfg=cfg, poll_interval=0.5, return_state=True)

    assert state.is_completed(), state
    result = state.result()
    assert result.handle.startswith(f"{scheduler}://")
    assert result.state == AppState.SUCCEEDED
    assert result.status.exit_codes() == {"coord": [0], "worker": [0, 0]}
    # what coord/0 wrote to $SHIPYARD_RESULT_FILE (the workers wrote none)
    assert result.result == {"coord": {0: {"coordinated": True}}}
    logs = flow_run_logs(state.state_details.flow_run_id)
    for line in EXPECTED:
        assert logs.count(line) == 1, (line, logs)


def _check_task_timeout_cancels(
    name: str, scheduler: str, app: AppDef, cfg: dict[str, Any] | None = None
) -> None:
    submitted: list[str] = []

    @flow
    def times_out() -> Any:
        submitted.append(submit_job(app, scheduler=scheduler, cfg=cfg))
        return wait_for_job.with_options(timeout_seconds=15)(submitted[0], poll_interval=0.5)

    state = times_out(return_state=True)

    assert state.is_failed(), state
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert "main/0 started" in logs, logs
    (handle,) = submitted
    with get_runner() as runner:
        status = wait_until(
            lambda: (s := runner.status(handle)) is not None and s.is_terminal() and s,
            DEADLINE,
            f"{handle} to end",
        )
    assert status.state == AppState.CANCELLED, status


# --------------------------------------------------------------------------------------------
# docker
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(docker_client: Any) -> str:
    """The busybox test image, built locally if it is missing."""
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(IMAGE)
    except ImageNotFound:
        subprocess.run(["bash", str(ROOT / "scripts" / "build_test_images.sh")], check=True)
    docker_client.images.get(IMAGE)
    return IMAGE


@pytest.mark.docker
def test_run_job_on_docker(name: str, image: str) -> None:
    _check_run_job(name, "local_docker", _app(name, image))


@pytest.mark.docker
def test_task_timeout_cancels_a_docker_job(name: str, image: str, docker_client: Any) -> None:
    _check_task_timeout_cancels(name, "local_docker", _sleeper(name, image))
    running = docker_client.containers.list(filters={"name": name})
    assert running == [], running


# --------------------------------------------------------------------------------------------
# slurm
# --------------------------------------------------------------------------------------------


@pytest.fixture
def slurm_dir(slurm_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Jobs without a job_dir write their logs in the submitting directory: a temporary one."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slurm
def test_run_job_on_slurm(name: str, slurm_dir: Path) -> None:
    _check_run_job(name, "slurm", _app(name), {"job_dir": str(slurm_dir / "job")})


@pytest.mark.slurm
def test_task_timeout_cancels_a_slurm_job(name: str, slurm_dir: Path) -> None:
    _check_task_timeout_cancels(name, "slurm", _sleeper(name), {"job_dir": str(slurm_dir / "job")})
    queued = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True, text=True, check=True
    )
    assert queued.stdout.strip() == "", queued.stdout


# the first attempt runs until preempted (its node taken by an urgent job); a requeued one ends
PREEMPTIBLE = (
    '[ "$SHIPYARD_ATTEMPT" -ge 1 ] && { echo "resumed"; exit 0; };'
    ' echo "attempt $SHIPYARD_ATTEMPT"; while :; do sleep 0.2; done'
)


@pytest.mark.slurm
@pytest.mark.parametrize("requeues", [0, 1])
def test_a_preempted_slurm_job_is_requeued_or_fails_preempted(
    name: str, slurm_dir: Path, requeues: int
) -> None:
    from tests.integration.slurm.slurm_clusters import preempt_node

    app = AppDef(
        name, [Role("w", entrypoint="sh", args=["-c", PREEMPTIBLE], resource=Resource(2, 0, 512))]
    )
    cfg = {"job_dir": str(slurm_dir / "job"), "max_requeues": requeues}

    @flow
    def preemptible() -> Any:
        return wait_for_job(submit_job(app, "slurm", cfg), poll_interval=0.2)

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(preemptible, return_state=True)  # type: ignore[call-overload]

        def node() -> str:
            argv = ["squeue", "-h", "-t", "RUNNING", "-o", "%N %Z"]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            mine = [ln.split()[0] for ln in out.splitlines() if ln.endswith(cfg["job_dir"])]
            return mine[0] if mine else ""

        where = wait_until(node, DEADLINE, "the job to run")
        preempt_node(where)
        state = running.result(timeout=300)
    logs = flow_run_logs(state.state_details.flow_run_id)
    if requeues == 0:
        assert state.is_failed() and "reason preempted" in (state.message or ""), state
        return
    assert state.is_completed(), state
    told = f"attempt 0 ended: PREEMPTED (preempted) on {where}; requeued as attempt 1"
    assert told in logs, logs
    tables = [a for a in flow_run_artifacts(state.state_details.flow_run_id) if a.type == "table"]
    assert any("attempts before the last" in (t.description or "") for t in tables), tables


# --------------------------------------------------------------------------------------------
# a Slurm cluster reached through a SlurmCluster block (SSH login node / slurmrestd)
# --------------------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("transport", ["ssh", "rest", "ssh-26", "rest-26"])
def test_flow_with_a_slurm_cluster_block(
    name: str, transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow reaches the cluster only through the block (no Slurm command on PATH, no
    clusters file); the block is saved on the server and loaded by name in the flow. ``-26``:
    the Slurm 26.05 cluster, whose commands are off the login PATH (``slurm_bin``)."""
    import os
    import uuid

    from prefect_tasks import SlurmCluster
    from tests.integration.slurm.slurm_clusters import slurm_release, use_remote_clusters
    from tests.services import REMOTE_DIR

    use_remote_clusters(monkeypatch, tmp_path)
    release = slurm_release(transport)
    transport = transport.removesuffix("-26")
    monkeypatch.delenv("SHIPYARD_CLUSTERS")
    key = Path(REMOTE_DIR, "userkey").read_text()
    settings: dict[str, Any] = {
        **({"slurm_bin": release.bin} if release.bin != "/usr/bin" else {}),
        "cluster_name": f"blk-{transport}-{uuid.uuid4().hex[:6]}",
        "transport": transport,
        "host": "127.0.0.1",
        "port": 2222,
        "user": "hpcuser",
        "private_key": key,
        "known_hosts": os.path.join(REMOTE_DIR, "known_hosts"),
        "remote_dir": "/home/hpcuser/shipyard",
    }
    if transport == "rest":
        settings["rest_url"] = release.rest_url
        settings["token"] = release.token()
    block_name = settings["cluster_name"]
    SlurmCluster(**settings).save(block_name)
    assert key.strip().splitlines()[1] not in repr(SlurmCluster.load(block_name))

    @flow(name=f"{name}-block")
    def on_cluster() -> tuple[str, str, Any]:
        handle = submit_job(_app(name), cluster=block_name)
        status = wait_for_job(handle, cluster=block_name, poll_interval=0.5)
        return handle, status.state.name, get_job_result(handle, cluster=block_name)

    handle, state, result = on_cluster()
    assert state == "SUCCEEDED"
    assert result == {"coord": {0: {"coordinated": True}}}  # read back over the transport
    assert f"/{settings['cluster_name']}:" in handle  # the handle names the cluster
    with get_runner() as runner:
        lines = sorted(str(line) for line in runner.stream_logs(handle, should_tail=False))
    assert lines == sorted(EXPECTED)
