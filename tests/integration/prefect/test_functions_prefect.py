"""Python functions as jobs from Prefect (``shipyard_task``): a flow calls a task whose body
runs as a Shipyard job, gets its value back, sees the function's own exception, and the job's
lines in the task run's log."""

from __future__ import annotations

from typing import Any

import pytest
from prefect import flow

from core.functions import RemoteTraceback
from prefect_tasks import shipyard_task
from tests.integration import functions
from tests.integration.prefect.helpers import flow_run_logs

# (by value: the job's interpreter imports the module's own things, not the tests)
combine = shipyard_task(functions.combine)
refuse = shipyard_task(scheduler="local_cwd", retries=0)(functions.refuse)


def _shout(word: str) -> str:
    print(f"shouting {word}", flush=True)
    return word.upper()


shout = shipyard_task(scheduler="local_cwd", name="shout-it")(_shout)


def test_a_flow_gets_the_values_and_the_jobs_lines() -> None:
    @flow
    def twice() -> list[Any]:
        return [shout("hello"), combine(2, b=3, scale=2)]

    state = twice(return_state=True)
    assert state.is_completed(), state
    upper, combined = state.result()
    assert upper == "HELLO" and combined["sum"] == 10
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert any("shouting hello" in m for m in logs), logs


def test_the_functions_exception_fails_the_task_run() -> None:
    @flow
    def refusing() -> None:
        refuse("loudly")

    state = refusing(return_state=True)
    assert state.is_failed(), state
    with pytest.raises(functions.Refused) as info:
        state.result()
    assert info.value.code == 7
    assert isinstance(info.value.__cause__, RemoteTraceback)
