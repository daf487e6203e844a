"""The async twins in async flows: success with logs, concurrency, failure, cancellation; and the
sync tasks called from an async flow."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.runner import AppFailedError
from core.specs import AppState
from prefect_tasks import (
    cancel_job_async,
    run_job_async,
    stream_job_logs_async,
    submit_job,
    submit_job_async,
    wait_for_job,
    wait_for_job_async,
)
from tests.integration.prefect.helpers import (
    apps_named,
    assert_no_running_job,
    flow_run_logs,
    sh_app,
    sleeper_app,
    started_pids,
)


def test_run_job_async_succeeds_with_logs_in_the_api(name: str) -> None:
    app = sh_app(name, {"a": (1, "echo alpha"), "b": (2, 'echo "beta $0"')})
    app.roles[1].args.append("${replica_id}")

    state = asyncio.run(run_job_async(app, return_state=True))

    assert state.is_completed(), state
    assert state.result().state == AppState.SUCCEEDED
    logs = flow_run_logs(state.state_details.flow_run_id)
    for line in ("a/0 alpha", "b/0 beta 0", "b/1 beta 1"):
        assert logs.count(line) == 1, logs


def test_async_tasks_run_concurrently_and_cancel(name: str, tmp_path: Path) -> None:
    """Two jobs followed at once; a third cancelled with cancel_job_async; a failing one raises."""

    @flow
    async def many() -> dict[str, Any]:
        quick = [sh_app(f"{name}q{i}", {"main": (1, f"sleep 1; echo quick {i}")}) for i in (0, 1)]
        handles = await asyncio.gather(*(submit_job_async(a) for a in quick))
        slow = await submit_job_async(sleeper_app(name, tmp_path))
        bad = await submit_job_async(sh_app(f"{name}bad", {"main": (1, "echo nope; exit 4")}))
        lines, *statuses = await asyncio.gather(
            stream_job_logs_async(handles[0]),
            *(wait_for_job_async(h) for h in handles),
        )
        await asyncio.to_thread(started_pids, tmp_path)
        cancelled = await cancel_job_async(slow)
        failure = await wait_for_job_async(bad, return_state=True)
        return {"lines": lines, "statuses": statuses, "cancelled": cancelled, "failure": failure}

    out = asyncio.run(many())

    assert out["lines"] == ["main/0 quick 0"]
    assert [s.state for s in out["statuses"]] == [AppState.SUCCEEDED] * 2
    assert out["cancelled"].state == AppState.CANCELLED
    assert_no_running_job(name, started_pids(tmp_path))
    with pytest.raises(AppFailedError, match="main/0=4"):
        out["failure"].result()


@pytest.mark.parametrize("where", ["task timeout", "flow timeout", "run_job_async timeout"])
def test_async_timeouts_cancel_the_job(name: str, tmp_path: Path, where: str) -> None:
    @flow(timeout_seconds=4 if where == "flow timeout" else None)
    async def times_out() -> Any:
        if where == "run_job_async timeout":
            subflow = run_job_async.with_options(timeout_seconds=4)
            return await subflow(sleeper_app(name, tmp_path))
        handle = await submit_job_async(sleeper_app(name, tmp_path))
        if where == "task timeout":
            return await wait_for_job_async.with_options(timeout_seconds=4)(handle)
        return await wait_for_job_async(handle)

    state = asyncio.run(times_out(return_state=True))

    assert state.is_failed(), state
    assert_no_running_job(name, started_pids(tmp_path))


def test_sync_tasks_work_in_an_async_flow(name: str) -> None:
    app = sh_app(name, {"main": (1, "echo from sync tasks")})

    @flow
    async def mixed() -> Any:
        handle = submit_job(app)
        return wait_for_job(handle)

    status = asyncio.run(mixed())

    assert status.state == AppState.SUCCEEDED
    assert len(apps_named(name)) == 1
