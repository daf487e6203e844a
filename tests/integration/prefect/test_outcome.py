"""Issue 19 through Prefect: results come back from run_job and get_job_result, usage reaches
the log and a table artifact, and max_silence cancels a job whose replica hangs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prefect import flow

from core.errors import JobSilentError
from core.specs import AppDef, AppState, Role
from prefect_tasks import (
    JobResult,
    get_job_result,
    run_job,
    submit_job,
    submit_job_async,
    wait_for_job,
    wait_for_job_async,
)
from tests.integration.prefect.helpers import (
    apps_named,
    flow_run_artifacts,
    flow_run_logs,
    sh_app,
)

WRITE = (
    "import json, os; r = int(os.environ['SHIPYARD_REPLICA_ID']);"
    " open(os.environ['SHIPYARD_RESULT_FILE'], 'w').write("
    "json.dumps({'rank': r}) if r == 0 else '{broken')"
)


def test_run_job_returns_the_results_and_reports_usage(name: str) -> None:
    app = AppDef(name, [Role("train", entrypoint="python3", args=["-c", WRITE], num_replicas=2)])
    state = run_job(app, cfg={"result_replicas": "all"}, return_state=True)
    assert state.is_completed(), state
    result = state.result()
    assert isinstance(result, JobResult)
    assert result.result == {"train": {0: {"rank": 0}}}
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert any(m.startswith("result: train/1: result file is not valid JSON") for m in logs), logs
    assert any(m.startswith("usage: train/0: wall ") for m in logs), logs
    (table,) = [a for a in flow_run_artifacts(state.state_details.flow_run_id) if a.type == "table"]
    assert f"Shipyard job {result.handle}" in (table.description or "")
    assert "train/0" in str(table.data) and "wall_time" in str(table.data)


def test_the_async_wait_makes_its_usage_artifact_too(name: str) -> None:
    """Its body runs in a thread of an async task run, where Prefect's artifact call would
    hand back a coroutine nobody awaits."""

    @flow
    async def waits() -> Any:
        handle = await submit_job_async(sh_app(name, {"w": (1, "echo hi")}))
        return await wait_for_job_async(handle)

    state = asyncio.run(waits(return_state=True))  # type: ignore[call-overload]
    assert state.is_completed(), state
    tables = [a for a in flow_run_artifacts(state.state_details.flow_run_id) if a.type == "table"]
    assert len(tables) == 1 and "w/0" in str(tables[0].data), tables


def test_get_job_result_in_a_flow(name: str) -> None:
    @flow
    def results() -> Any:
        handle = submit_job(sh_app(name, {"w": (1, "echo '[1, 2]' > \"$SHIPYARD_RESULT_FILE\"")}))
        wait_for_job(handle)
        return get_job_result(handle)

    assert results() == {"w": {0: [1, 2]}}


HANGS = (
    'if [ "$SHIPYARD_REPLICA_ID" = 0 ]; then echo "init done"; exec sleep 300; fi;'
    " while true; do echo beat; sleep 0.2; done"
)


def test_max_silence_cancels_a_job_whose_replica_hangs(name: str) -> None:
    @flow
    def hangs() -> Any:
        handle = submit_job(sh_app(name, {"w": (2, HANGS)}))
        return wait_for_job(handle, max_silence=2, poll_interval=0.2)

    with pytest.raises(JobSilentError) as info:
        hangs()
    assert info.value.silent == ["w/0"]
    assert "no log line for 2s from w/0 (max_silence)" in str(info.value)
    assert "w/0: 'init done'" in str(info.value)
    (handle,) = apps_named(name)
    from core.runner import get_runner

    with get_runner() as runner:
        assert runner.wait(handle, wait_interval=0.1).state == AppState.CANCELLED


def test_an_apps_own_max_silence_applies_to_run_job(name: str) -> None:
    app = sh_app(name, {"w": (2, HANGS)})
    app.metadata["max_silence"] = "2"
    with pytest.raises(JobSilentError) as info:
        run_job(app, poll_interval=0.2)
    assert info.value.silent == ["w/0"]
    assert "no log line for 2s from w/0 (max_silence)" in str(info.value)
    app.metadata["max_silence"] = "soon"
    with pytest.raises(ValueError, match="metadata.max_silence: expected a positive duration"):
        run_job(app)
    assert len(apps_named(name)) == 1  # (the bad one started nothing)


def test_max_silence_must_be_a_positive_duration() -> None:
    with pytest.raises(ValueError, match="max_silence: expected a positive duration"):
        wait_for_job.fn("local_cwd://s/x", max_silence=0)
