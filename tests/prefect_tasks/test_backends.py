"""run_job on the real Docker engine and the real Slurm cluster: the job succeeds, its log lines
are in the Prefect API, and a task timeout cancels it on the backend."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.runner import get_runner
from core.specs import AppDef, AppState, Role
from prefect_tasks import run_job, submit_job, wait_for_job
from tests.prefect_tasks.helpers import flow_run_logs, wait_until

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "shipyard-test/busybox:latest"


def _app(name: str, image: str = "") -> AppDef:
    return AppDef(
        name,
        [
            Role("coord", image=image, entrypoint="sh", args=["-c", "echo coord says hi"]),
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


def _sleeper(name: str, image: str = "") -> AppDef:
    return AppDef(
        name,
        [Role("main", image=image, entrypoint="sh", args=["-c", "echo started; sleep 300"])],
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
