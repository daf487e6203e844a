"""Every way a Prefect run can go away cancels the job it waits on, and leaves no process behind:
a task timeout, a flow timeout, a flow run cancelled in the API, SIGTERM to the flow process —
for tasks called directly and for tasks started with ``.submit()``."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.runner import get_runner
from core.specs import AppState
from prefect_tasks import cancel_flow_run_jobs, run_job, submit_job, wait_for_job
from tests.helpers import ROOT, wait_until
from tests.integration.prefect.helpers import (
    DEADLINE,
    apps_named,
    assert_no_running_job,
    flow_run,
    job_env,
    sleeper_app,
    started_pids,
)


def _wait(handle: str, submitted: bool, **options: Any) -> Any:
    """Waits on ``handle`` with ``wait_for_job``, called directly or through ``.submit()``."""
    task = wait_for_job.with_options(**options) if options else wait_for_job
    if submitted:
        return task.submit(handle, cancel_check_interval=0.5).result()
    return task(handle, cancel_check_interval=0.5)


def _run_in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        out["state"] = fn()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("submitted", [False, True], ids=["direct", "submitted"])
def test_task_timeout_cancels_the_job(name: str, tmp_path: Path, submitted: bool) -> None:
    @flow
    def times_out() -> Any:
        handle = submit_job(sleeper_app(name, tmp_path))
        return _wait(handle, submitted, timeout_seconds=4)

    state = times_out(return_state=True)

    assert state.is_failed(), state
    assert_no_running_job(name, started_pids(tmp_path))


@pytest.mark.parametrize("submitted", [False, True], ids=["direct", "submitted"])
def test_flow_timeout_cancels_the_job(name: str, tmp_path: Path, submitted: bool) -> None:
    """With ``.submit()`` Prefect does not interrupt the task on a flow timeout (it waits for it
    when the task runner shuts down): the task notices the shutdown and cancels the job."""

    @flow(timeout_seconds=4)
    def times_out() -> Any:
        handle = submit_job(sleeper_app(name, tmp_path))
        return _wait(handle, submitted)

    thread, out = _run_in_thread(lambda: times_out(return_state=True))
    thread.join(DEADLINE)

    assert not thread.is_alive(), "the flow did not end after its timeout"
    assert out["state"].is_failed() and out["state"].name == "TimedOut", out["state"]
    assert_no_running_job(name, started_pids(tmp_path))


def _cancel_flow_run(flow_run_id: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(
            flow_run_id, Cancelling(message="cancelled by the test"), force=True
        )


@pytest.mark.parametrize("how", ["direct", "submitted", "run_job subflow"])
def test_cancelled_flow_run_cancels_the_job(name: str, tmp_path: Path, how: str) -> None:
    ids: dict[str, Any] = {}

    @flow
    def cancelled() -> Any:
        from prefect.context import FlowRunContext

        ids["flow_run"] = FlowRunContext.get().flow_run.id  # type: ignore[union-attr]
        app = sleeper_app(name, tmp_path)
        if how == "run_job subflow":
            return run_job(app, cancel_check_interval=0.5)
        return _wait(submit_job(app), how == "submitted")

    thread, out = _run_in_thread(lambda: cancelled(return_state=True))
    pids = started_pids(tmp_path)
    _cancel_flow_run(ids["flow_run"])
    thread.join(DEADLINE)

    assert not thread.is_alive(), "the flow did not end after it was cancelled"
    assert not out["state"].is_completed(), out["state"]
    assert_no_running_job(name, pids)
    assert flow_run(ids["flow_run"]).state.type.value in ("CANCELLING", "CANCELLED")


_SIGTERM_FLOW = textwrap.dedent(
    """
    import faulthandler
    import signal
    import sys
    import time
    from pathlib import Path

    from prefect import flow

    from prefect_tasks import submit_job, wait_for_job
    from tests.integration.prefect.helpers import sleeper_app

    name, pid_dir, mode = sys.argv[1:]
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump on a hang


    @flow
    def terminated():
        handle = submit_job(sleeper_app(name, Path(pid_dir)))
        if mode == "submitted":
            return wait_for_job.submit(handle).result()
        if mode == "before waiting":
            time.sleep(300)  # SIGTERM comes here: no task is waiting on the job yet
        return wait_for_job(handle)


    terminated()
    """
)


@pytest.mark.parametrize("mode", ["direct", "submitted", "before waiting"])
def test_sigterm_to_the_flow_process_cancels_the_job(
    name: str, tmp_path: Path, mode: str, prefect_server: str
) -> None:
    script = tmp_path / "terminated_flow.py"
    script.write_text(_SIGTERM_FLOW)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    log_path = tmp_path / "flow.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, str(script), name, str(pid_dir), mode],
        cwd=ROOT,
        env=job_env(prefect_server),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or len(list(pid_dir.glob("*.pid"))) == 3,
            2 * DEADLINE,
            "the flow process to start the job",
        )
        assert proc.poll() is None, (tmp_path / "flow.log").read_text()
        pids = started_pids(pid_dir)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            pytest.fail(f"the flow process did not exit on SIGTERM:\n{log_path.read_text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    output = log_path.read_text()
    assert code != 0, output
    assert "cancelled local_cwd://" in output, output
    assert_no_running_job(name, pids)


def test_wait_timeout_parameter_cancels_the_job(name: str, tmp_path: Path) -> None:
    state = run_job(sleeper_app(name, tmp_path), timeout=3, return_state=True)

    assert state.is_failed(), state
    with pytest.raises(TimeoutError, match="cancelled it"):
        state.result()
    assert_no_running_job(name, started_pids(tmp_path))


def test_flow_hook_cancels_jobs_submitted_but_not_waited_on(name: str, tmp_path: Path) -> None:
    @flow(on_failure=[cancel_flow_run_jobs])
    def fails_after_submitting() -> None:
        submit_job(sleeper_app(name, tmp_path))
        started_pids(tmp_path)
        raise RuntimeError("something else failed")

    state = fails_after_submitting(return_state=True)

    assert state.is_failed(), state
    assert_no_running_job(name, started_pids(tmp_path))


def test_job_left_running_when_the_flow_succeeds_without_waiting(name: str, tmp_path: Path) -> None:
    """Submitting without waiting is allowed: the job outlives the flow (nothing cancels it)."""

    @flow(on_failure=[cancel_flow_run_jobs])
    def fire_and_forget() -> str:
        return submit_job(sleeper_app(name, tmp_path))

    handle = fire_and_forget()
    started_pids(tmp_path)
    with get_runner() as runner:
        status = runner.status(handle)
        assert status is not None and status.state == AppState.RUNNING
        runner.cancel(handle)
    assert apps_named(name) == [handle]
