"""Arrays from Prefect (run_array_job, submit_array, wait_for_array) on the local scheduler,
against the test Prefect server: counts in the run's log, a table artifact, results per element,
a retried flow running only the failed elements again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.runner import AppFailedError, get_runner
from core.specs import AppDef, AppState, Role
from prefect_tasks import (
    ArrayResult,
    run_array_job,
    submit_array,
    submit_array_async,
    wait_for_array,
    wait_for_array_async,
)
from tests.integration.prefect.helpers import flow_run_logs


def app(name: str, script: str) -> AppDef:
    return AppDef(name, [Role("w", entrypoint="sh", args=["-c", script])])


def test_run_array_job_returns_every_elements_result(name: str) -> None:
    script = 'echo "{\\"x\\": ${params.x}}" > "$SHIPYARD_RESULT_FILE"'
    state = run_array_job(
        app(name, script), params=[{"x": i} for i in range(4)], max_parallel=2, return_state=True
    )
    result: ArrayResult = state.result()
    assert result.status.state == AppState.SUCCEEDED
    assert result.results == [{"w": {0: {"x": i}}} for i in range(4)]
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert any(m.startswith("elements: 4 SUCCEEDED (of 4)") for m in logs), logs


def test_a_retried_flow_runs_only_the_failed_elements_again(name: str, tmp_path: Path) -> None:
    script = (
        f"[ -e {tmp_path}/$SHIPYARD_ARRAY_INDEX ] && exit 0; touch {tmp_path}/$SHIPYARD_ARRAY_INDEX;"
        " [ $SHIPYARD_ARRAY_INDEX != 2 ]"
    )

    @flow(retries=1, retry_delay_seconds=0)
    def sweep() -> Any:
        handle = submit_array(app(name, script), size=4, max_parallel=4)
        return handle, wait_for_array(handle, poll_interval=0.2)

    state = sweep(return_state=True)
    handle, status = state.result()
    assert status.state == AppState.SUCCEEDED
    assert [e.attempts for e in status.elements] == [1, 1, 2, 1]
    logs = "\n".join(flow_run_logs(state.state_details.flow_run_id))
    assert f"elements [2] of {handle} run again" in logs
    assert "elements: 1 FAILED, 3 SUCCEEDED (of 4)" in logs


def test_too_many_failures_raise_with_the_failed_elements_lines(name: str) -> None:
    @flow
    def sweep() -> Any:
        handle = submit_array(app(name, 'echo "bad $SHIPYARD_ARRAY_INDEX"; exit 3'), size=2)
        return wait_for_array(handle, allow_failures=1, poll_interval=0.2)

    with pytest.raises(AppFailedError) as err:
        sweep()
    message = str(err.value)
    assert "2 of 2 elements failed: [0] exit 3, [1] exit 3" in message
    assert "bad 1" in message


def test_async_twins(name: str) -> None:
    @flow
    async def sweep() -> Any:
        handle = await submit_array_async(app(name, "true"), size=3)
        return await wait_for_array_async(handle, poll_interval=0.2)

    status = asyncio.run(sweep())
    assert status.state == AppState.SUCCEEDED and status.counts() == {"SUCCEEDED": 3}


def test_bad_input_fails_before_anything_starts(name: str) -> None:
    @flow
    def sweep() -> Any:
        return submit_array(app(name, "true"), size=2, params=[{}, {}])

    with pytest.raises(ValueError, match="size, params: expected one of them, got both"):
        sweep()
    with get_runner() as runner:
        assert not [a for a in runner.list("local_cwd") if a.app_id.startswith(name)]
