"""An Airflow task killed, a Prefect run timed out or cancelled, at each phase of a Slurm job:
while the submission is in flight (the job is queued but its id has not come back yet), while
the job is pending, and while it runs. Whatever the phase, no job is left queued or running.

The phases are made deterministic with a thin ``sbatch`` wrapper put first on ``PATH``: it runs
the real ``sbatch`` (a real job is queued on the real cluster), optionally with a start time an
hour away (the job stays PENDING; a hold would not do, since a keyed submission releases its own
job), and can hold back its answer until the test releases it. Also here, because
it shares the Prefect server: concurrent Prefect waits share their Slurm polls.

(The Airflow and Prefect packages' own tests cover these on the local scheduler, while running.)
"""

from __future__ import annotations

from tests.helpers import wait_until
from tests.integration.airflow.airflow_env import configure

configure()  # an Airflow home of the test session's own, before airflow is imported

import os  # noqa: E402
import shutil  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from core.runner import get_runner  # noqa: E402
from core.schedulers.slurm_scheduler import SlurmScheduler  # noqa: E402
from core.specs import AppDef, AppState, Role, is_terminal  # noqa: E402

PHASES = ["submitting", "pending", "running"]


class Sbatch:
    """Controls the ``sbatch`` wrapper of one test."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        real = shutil.which("sbatch")
        assert real, "sbatch is not installed"
        shim = root / "shim"
        shim.mkdir()
        self.submitted = root / "submitted"  # the real sbatch's answer, once the job is queued
        self.release = root / "release"  # the wrapper answers once this exists
        (shim / "sbatch").write_text(
            f"""#!/bin/sh
# test wrapper: the real sbatch (with $SHIM_SBATCH_ARGS), answering when the test says so
out=$({real} $SHIM_SBATCH_ARGS "$@") || exit $?
echo "$out" > "{self.submitted}.tmp" && mv "{self.submitted}.tmp" "{self.submitted}"
while [ ! -e "{self.release}" ]; do sleep 0.05; done
echo "$out"
"""
        )
        (shim / "sbatch").chmod(0o755)
        monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
        self._monkeypatch = monkeypatch

    def configure(self, phase: str) -> None:
        self._monkeypatch.setenv(
            "SHIM_SBATCH_ARGS", "--begin=now+3600" if phase == "pending" else ""
        )
        if phase != "submitting":
            self.release.touch()

    def job_id(self) -> str:
        path = wait_until(lambda: self.submitted.exists() and self.submitted, what="sbatch")
        return path.read_text().strip().split(";")[0]


@pytest.fixture
def sbatch(
    slurm_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sbatch]:
    monkeypatch.chdir(tmp_path)  # job logs land here
    s = Sbatch(tmp_path, monkeypatch)
    yield s
    s.release.touch()
    if s.submitted.exists():  # whatever happened: nothing of this test stays queued
        os.system(f"scancel {s.submitted.read_text().strip().split(';')[0]} >/dev/null 2>&1")


def sleeper(name: str) -> AppDef:
    return AppDef(name, [Role("w", entrypoint="/bin/sleep", args=["300"])])


def reach_phase(job_id: str, phase: str) -> None:
    sched = SlurmScheduler("phases")
    want = {"pending": AppState.PENDING, "running": AppState.RUNNING}.get(phase)
    if want is not None:
        wait_until(lambda: (d := sched.describe(job_id)) is not None and d.state == want,
                 what=f"job {job_id} {want.name}")  # fmt: skip


def assert_cancelled(job_id: str) -> None:
    sched = SlurmScheduler("phases")
    d = wait_until(lambda: (d := sched.describe(job_id)) is not None and is_terminal(d.state) and d,
                 what=f"job {job_id} to end")  # fmt: skip
    assert d.state == AppState.CANCELLED, f"job {job_id} ended {d.state.name}, not CANCELLED"


# --------------------------------------------------------------------------------------------
# Airflow: the task is killed (on_kill: marked failed, execution_timeout, SIGTERM to the worker)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", PHASES)
def test_airflow_task_killed_leaves_no_job(sbatch: Sbatch, phase: str) -> None:
    pytest.importorskip("airflow")
    from airflow_provider.operators import ShipyardOperator
    from tests.integration.airflow.helpers import TaskInstanceStub, context

    sbatch.configure(phase)
    op = ShipyardOperator(
        task_id=f"killed-{phase}", app=sleeper(f"af-{phase}"), scheduler="slurm", poll_interval=0.2
    )
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(op.execute(context(TaskInstanceStub())))
        except BaseException as e:  # noqa: BLE001 - looked at below
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    job_id = sbatch.job_id()
    reach_phase(job_id, phase)
    op.on_kill()  # what Airflow calls when it kills the task
    sbatch.release.touch()
    t.join(120)
    assert not t.is_alive(), "the killed task did not end"
    assert_cancelled(job_id)
    assert outcome and isinstance(outcome[0], BaseException), outcome


# --------------------------------------------------------------------------------------------
# Prefect: a task timeout while submitting; a cancelled flow run while pending or running
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[str]:
    pytest.importorskip("prefect")
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings({PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        with prefect_test_harness(server_startup_timeout=180):
            yield str(PREFECT_API_URL.value())


def _cancel_flow_run(flow_run_id: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(
            flow_run_id, Cancelling(message="cancelled by the test"), force=True
        )


@pytest.mark.parametrize("phase", PHASES)
def test_prefect_run_interrupted_leaves_no_job(
    prefect_api: str, sbatch: Sbatch, phase: str
) -> None:
    from prefect import flow
    from prefect.context import FlowRunContext

    from prefect_tasks import submit_job, wait_for_job

    sbatch.configure(phase)
    ids: dict[str, Any] = {}

    @flow
    def interrupted() -> Any:
        ids["flow_run"] = FlowRunContext.get().flow_run.id  # type: ignore[union-attr]
        app = sleeper(f"pf-{phase}")
        if phase == "submitting":  # the task times out while sbatch has not answered
            return submit_job.with_options(timeout_seconds=5)(app, scheduler="slurm")
        handle = submit_job(app, scheduler="slurm")
        return wait_for_job(handle, poll_interval=0.5, cancel_check_interval=0.5)

    if phase == "submitting":
        # in the main thread, as a flow script runs. A Prefect timeout cannot interrupt the
        # task while it is blocked in sbatch (observed: it ends when sbatch answers): sbatch
        # answers at 10s, after the task's 5s timeout
        safety = threading.Timer(10, sbatch.release.touch)
        safety.start()
        try:
            state = interrupted(return_state=True)
        finally:
            safety.cancel()
            sbatch.release.touch()
        assert not state.is_completed(), state
        assert_cancelled(sbatch.job_id())
        return
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("state", interrupted(return_state=True)))
    t.start()
    job_id = sbatch.job_id()
    reach_phase(job_id, phase)
    wait_until(lambda: "flow_run" in ids, what="the flow run")
    _cancel_flow_run(ids["flow_run"])
    t.join(120)
    assert not t.is_alive(), "the interrupted flow did not end"
    assert not out["state"].is_completed(), out["state"]
    assert_cancelled(job_id)


def test_concurrent_prefect_waits_share_their_slurm_polls(
    prefect_api: str, sbatch: Sbatch, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """10 ``wait_for_job`` tasks waiting at once on 10 Slurm jobs: one squeue per poll round
    can answer for all of them; they must not cost one squeue per job per poll."""
    from prefect import flow

    from core.schedulers.slurm.transport import LocalShell
    from prefect_tasks import wait_for_job

    sbatch.configure("running")
    n = 10
    go = tmp_path / "go"
    script = f'while [ ! -e "{go}" ]; do sleep 0.2; done'
    with get_runner("swait") as runner:
        handles = [
            runner.run(
                AppDef(f"swait{i}", [Role("w", entrypoint="/bin/sh", args=["-c", script])]), "slurm"
            )  # fmt: skip
            for i in range(n)
        ]
    calls: list[str] = []
    real = LocalShell.run

    def counting(self: LocalShell, cmd: list[str], **kwargs: Any) -> Any:
        calls.append(cmd[0])
        return real(self, cmd, **kwargs)

    monkeypatch.setattr(LocalShell, "run", counting)
    try:

        @flow
        def wait_all(hs: list[str]) -> list[str]:
            futures = [wait_for_job.submit(h, poll_interval=1.0, stream_logs=False) for h in hs]
            return [f.result().state.name for f in futures]

        window = 10.0
        releaser = threading.Timer(window, go.touch)
        t0 = time.monotonic()
        releaser.start()
        states = wait_all(handles)
        elapsed = time.monotonic() - t0
        assert states == ["SUCCEEDED"] * n
        polls = calls.count("squeue") + calls.count("sacct")
        print(
            f"\nprefect waits: {n} jobs waited on at once for {elapsed:.1f}s: {polls} squeue+sacct"
        )
        # one poll round a second, shared: ~elapsed calls; unshared: ~n times as many
        assert polls <= 3 * elapsed + 10, (
            f"{n} concurrent waits made {polls} Slurm CLI calls in {elapsed:.0f}s"
            " (one per job per poll)"
        )
    finally:
        go.touch()
        with get_runner("swait") as runner:
            for h in handles:
                runner.cancel(h)
