"""The Shipyard worker in a real Prefect deployment (scripts/start_prefect.sh: ``prefect server
start`` and ``prefect worker start -p POOL -t shipyard``), driven as users drive it: a deployment
made from a flow file (``flow.from_source(...).deploy(...)``) on the Shipyard pool, a run started
through the API, the ``prefect`` command to cancel it; what is checked is what users see: the
run's final state and logs, the worker's log, the job in the backend."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from core.specs import AppState, parse_app_handle
from prefect_tasks.worker import ROLE
from tests.deploy.prefect.prefect_api import (
    FLOWS,
    HOME,
    FlowRun,
    deploy,
    kill_worker,
    prefect_cli,
    restart_worker,
    start_run,
    worker_log,
)
from tests.helpers import pid_alive, wait_until
from tests.services import (
    REMOTE_DIR,
    docker_problem,
    require,
    slurm_problem,
    slurm_remote_problem,
)

pytestmark = [pytest.mark.prefect, pytest.mark.timeout(600)]

IMAGE = "shipyard-test/prefect:{version}"


def greeting() -> str:
    return f"greeting-{uuid.uuid4().hex[:10]}"


def job_state(runner: Any, handle: str) -> AppState:
    status = runner.status(handle)
    assert status is not None, f"the backend does not know {handle}"
    return status.state


def wait_job_final(runner: Any, handle: str) -> AppState:
    return wait_until(
        lambda: (s := runner.status(handle)) is not None and s.is_terminal() and s.state,
        120,
        f"{handle} to end",
    )


def run_hello(prefect_api: str, job_variables: dict[str, Any]) -> tuple[FlowRun, str]:
    """Deploys and runs the hello flow; returns the run, once Completed, and its greeting."""
    words = greeting()
    run = start_run(deploy("hello", job_variables), {"greeting": words})
    state = run.wait()
    assert state == "COMPLETED", f"{state}: {run.logs()}"
    return run, words


def test_local_deployment_completes(prefect_api: str, deploy_runner: Any) -> None:
    run, words = run_hello(prefect_api, {"scheduler": "local_cwd"})
    handle = run.handle()
    assert parse_app_handle(handle).scheduler_backend == "local_cwd"
    assert wait_job_final(deploy_runner, handle) == AppState.SUCCEEDED
    run.wait_log(f"{words} from the Shipyard job")
    # the job's output reached the worker's log, and the exit code the run's log
    wait_until(lambda: words in worker_log(), 60, "the job's output in the worker's log")
    run.wait_log(f"Shipyard job {handle} ended SUCCEEDED (exit code 0)")


def test_a_deployment_runs_an_array_through_the_worker(prefect_api: str) -> None:
    run = start_run(deploy("array_sweep", {"scheduler": "local_cwd"}), {"n": 5})
    assert run.wait() == "COMPLETED", run.logs()
    run.wait_log("squares [0, 1, 4, 9, 16]")
    # (the counts are in the log of run_array_job's subflow run, forwarded by the worker)
    name = run.read().name

    def counts_forwarded() -> bool:
        lines = worker_log().splitlines()
        return any(name in ln and "elements: 5 SUCCEEDED (of 5)" in ln for ln in lines)

    wait_until(counts_forwarded, 60, "the counts in the worker's log")


def test_docker_deployment_completes(prefect_api: str, deploy_runner: Any) -> None:
    require("docker", docker_problem())
    from importlib.metadata import version

    mount = f"type=bind,src={FLOWS},dst={FLOWS},readonly"
    run, words = run_hello(
        prefect_api,
        {
            "scheduler": "local_docker",
            "image": IMAGE.format(version=version("prefect")),
            "mounts": [mount],
        },
    )
    handle = run.handle()
    assert parse_app_handle(handle).scheduler_backend == "local_docker"
    assert wait_job_final(deploy_runner, handle) == AppState.SUCCEEDED
    # it ran in the container (replica hostname), not on the worker's host
    line = run.wait_log(f"{words} from the Shipyard job")
    assert "host=flow-run-0" in line, line


def test_slurm_deployment_completes(prefect_api: str, deploy_runner: Any) -> None:
    require("slurm", slurm_problem())
    run, words = run_hello(prefect_api, {"scheduler": "slurm", "cfg": {"partition": "debug"}})
    handle = run.handle()
    assert parse_app_handle(handle).scheduler_backend == "slurm"
    assert wait_job_final(deploy_runner, handle) == AppState.SUCCEEDED
    run.wait_log(f"{words} from the Shipyard job")


def test_remote_slurm_deployment_runs_the_clusters_python(prefect_api: str) -> None:
    """A worker that is not a login node: the flow run goes to the cluster behind the SSH login
    node (a Shipyard Backend block holding a Slurm Cluster block, its key a secret of the
    block) and runs there as the cluster user, with the cluster's own Python
    (scripts/cluster_python.sh), not the worker's interpreter."""
    require("slurm_remote", slurm_remote_problem())
    from prefect_tasks import ShipyardBackend, SlurmCluster

    python = os.environ.get("SHIPYARD_CLUSTER_PYTHON", "/opt/shipyard-cluster-python")
    require("services", None if os.path.exists(f"{python}/bin/python") else f"no {python}")
    remote = Path(REMOTE_DIR)
    cluster = SlurmCluster(
        cluster_name=f"prefect-ssh-{uuid.uuid4().hex[:6]}",
        host="127.0.0.1",
        port=2222,
        user="hpcuser",
        private_key=(remote / "userkey").read_text(),
        known_hosts=str(remote / "known_hosts"),
        remote_dir="/home/hpcuser/shipyard",
    )
    name = f"remote-{uuid.uuid4().hex[:8]}"
    ShipyardBackend(scheduler="slurm", cfg={"partition": "debug"}, cluster=cluster).save(name)
    # the flow's code where the cluster user can read it (a shared directory, on a real site)
    shared = Path(tempfile.mkdtemp(prefix="shipyard-flows-"))
    try:
        shared.chmod(0o755)
        shutil.copy(FLOWS / "deploy_flows.py", shared)
        (shared / "deploy_flows.py").chmod(0o644)
        words = greeting()
        variables = {"backend": name, "command": f"{python}/bin/python -m prefect.engine"}
        run = start_run(deploy("hello", variables, directory=shared), {"greeting": words})
        assert run.wait() == "COMPLETED", run.logs()
        assert parse_app_handle(run.handle()).scheduler_backend == "slurm"
        line = run.wait_log(f"{words} from the Shipyard job")
        assert f"python={python}/bin/python " in line and "user=hpcuser" in line, line
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_failing_flow_ends_failed_with_the_exit_code(prefect_api: str, deploy_runner: Any) -> None:
    run = start_run(deploy("failing", {"scheduler": "local_cwd"}), {"reason": "on purpose"})
    assert run.wait() == "FAILED"
    handle = run.handle()
    assert wait_job_final(deploy_runner, handle) == AppState.FAILED
    run.wait_log("failing on purpose")
    run.wait_log(f"Shipyard job {handle} ended FAILED (exit code 1)")


def start_gated(gate: Path, job_variables: dict[str, Any] | None = None) -> tuple[FlowRun, int]:
    """Starts a run of the gated flow; returns it once its flow runs, with the flow's pid."""
    run = start_run(
        deploy("wait_for_gate", job_variables or {"scheduler": "local_cwd"}), {"gate": str(gate)}
    )
    started = Path(str(gate) + ".started")
    wait_until(lambda: started.exists() and started.read_text(), 300, "the flow to start")
    run.wait_state("RUNNING")
    return run, int(started.read_text())


def test_cancelling_the_run_cancels_the_job(
    prefect_api: str, deploy_runner: Any, gate: Path
) -> None:
    run, pid = start_gated(gate)
    handle = run.handle()
    prefect_cli("flow-run", "cancel", str(run.id))
    assert run.wait() == "CANCELLED"
    assert wait_job_final(deploy_runner, handle) == AppState.CANCELLED
    wait_until(lambda: not pid_alive(pid), 60, f"the flow's process {pid} to be gone")


def test_job_killed_outside_prefect_crashes_the_run(
    prefect_api: str, deploy_runner: Any, gate: Path
) -> None:
    run, pid = start_gated(gate)
    handle = run.handle()
    os.kill(pid, signal.SIGKILL)
    assert run.wait() == "CRASHED"
    assert wait_job_final(deploy_runner, handle) == AppState.FAILED
    run.wait_log(f"Shipyard job {handle} ended FAILED (exit code -9)")


def test_job_cancelled_outside_prefect_cancels_the_run(
    prefect_api: str, deploy_runner: Any, gate: Path
) -> None:
    run, _ = start_gated(gate)
    deploy_runner.cancel(run.handle())
    assert run.wait() == "CANCELLED"


def test_restarted_worker_keeps_tracking_the_run(
    prefect_api: str, deploy_runner: Any, gate: Path
) -> None:
    run, pid = start_gated(gate)
    handle = run.handle()
    restart_worker(kill=True)
    assert pid_alive(pid), "the job died with the worker"
    wait_until(
        lambda: f"follows Shipyard job {handle} again" in "\n".join(run.logs()),
        120,
        "the restarted worker to follow the job again",
    )
    # the state still follows the job: cancelled outside Prefect, the run ends Cancelled
    deploy_runner.cancel(handle)
    assert run.wait() == "CANCELLED"
    assert wait_job_final(deploy_runner, handle) == AppState.CANCELLED


def forwarded(log: str, tag: str) -> list[str]:
    """The job output lines of the numbered_lines flow tagged ``tag`` that a worker's log holds
    (``... - run-name | flow-run/0 TAG line 7``), in order."""
    pattern = re.compile(rf"\| {re.escape(ROLE)}/0 ({re.escape(tag)} (?:line|end) \d+)$")
    return [m.group(1) for line in log.splitlines() if (m := pattern.search(line.rstrip()))]


def test_restarted_worker_forwards_each_output_line_once(prefect_api: str, gate: Path) -> None:
    tag = f"out-{uuid.uuid4().hex[:8]}"
    run = start_run(
        deploy("numbered_lines", {"scheduler": "local_cwd"}), {"tag": tag, "gate": str(gate)}
    )
    handle = run.handle()
    try:
        wait_until(lambda: len(forwarded(worker_log(), tag)) >= 5, 300, "lines in the worker's log")
        before = forwarded(kill_worker(), tag)  # the job goes on printing meanwhile
        restart_worker(kill=False)
        wait_until(
            lambda: f"follows Shipyard job {handle} again" in "\n".join(run.logs()),
            120,
            "the restarted worker to follow the job again",
        )
        wait_until(lambda: len(forwarded(worker_log(), tag)) >= 5, 120, "lines from the new worker")
    finally:
        gate.touch()  # the flow prints its last line and ends
    assert run.wait() == "COMPLETED"
    after = wait_until(
        lambda: (
            (lines := forwarded(worker_log(), tag))
            and lines[-1].startswith(f"{tag} end ")
            and lines
        ),
        60,
        "the job's last line in the worker's log",
    )
    n = int(after[-1].rsplit(" ", 1)[1])
    # what the user sees, the old worker's log then the new one's: every line once, in order
    assert before + after == [f"{tag} line {i}" for i in range(n)] + [f"{tag} end {n}"], (
        before[-3:],
        after[:3],
    )
    assert len(before) >= 5 and len(after) >= 6


def test_block_configured_task_flow(
    prefect_api: str, deploy_runner: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from prefect_tasks import ShipyardBackend

    log_dir = HOME / "work" / f"logs-{uuid.uuid4().hex[:8]}"
    log_dir.mkdir()
    name = f"local-{uuid.uuid4().hex[:8]}"
    ShipyardBackend(scheduler="local_cwd", cfg={"log_dir": str(log_dir)}).save(name)
    words = greeting()
    run = start_run(
        deploy("block_job", {"scheduler": "local_cwd"}), {"backend": name, "message": words}
    )
    assert run.wait() == "COMPLETED", run.logs()
    run.wait_log(words)
    # the job ran with the block's run options: its log is in the block's log_dir
    assert any(words in p.read_text(errors="replace") for p in log_dir.rglob("*") if p.is_file())
