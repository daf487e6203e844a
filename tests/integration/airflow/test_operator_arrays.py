"""ShipyardOperator running arrays and jobs that wait for others, on the real local scheduler."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_provider.operators import ShipyardOperator
from core.specs import AppDef, AppState, Role
from tests.integration.airflow.helpers import StateStoreStub, TaskInstanceStub, context

pytestmark = pytest.mark.airflow


def app(script: str) -> AppDef:
    return AppDef("sweep", [Role("w", entrypoint="sh", args=["-c", script])])


RESULT = 'echo "{\\"lr\\": ${params.lr}}" > "$SHIPYARD_RESULT_FILE"'


def test_an_array_from_templated_params_pushes_states_and_results(
    runner: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job",
        app=app(f"echo lr=${{params.lr}}; {RESULT}; test ${{params.lr}} != 3"),
        array_params=json.dumps([{"lr": 1}, {"lr": 2}, {"lr": 3}]),  # (as a template renders)
        max_parallel=2,
        allow_failures=1,
        poll_interval=0.2,
    )
    handle = op.execute(context(ti, StateStoreStub()))
    assert ti.xcoms["array_states"] == ["SUCCEEDED", "SUCCEEDED", "FAILED"]
    # (the failed element wrote its result before failing: it is kept)
    assert ti.xcoms["result"] == [{"w": {"0": {"lr": n}}} for n in (1, 2, 3)]
    status = runner.status(handle)
    assert status.state == AppState.FAILED and status.counts() == {"SUCCEEDED": 2, "FAILED": 1}
    out = capfd.readouterr().out
    assert "elements: 2 SUCCEEDED, 1 FAILED" not in out  # (sorted by name)
    assert "elements: 1 FAILED, 2 SUCCEEDED (of 3)" in out
    assert "[2] w/0 lr=3" in out  # the failed element's last lines


def test_an_arrays_results_are_its_return_value_and_no_xcom_means_none() -> None:
    ti = TaskInstanceStub()
    params = {"array_params": [{"lr": 1}, {"lr": 2}], "poll_interval": 0.2}
    op = ShipyardOperator(task_id="job", app=app(RESULT), return_result=True, **params)
    assert op.execute(context(ti)) == [{"w": {"0": {"lr": n}}} for n in (1, 2)]
    assert ti.xcoms["array_states"] == ["SUCCEEDED"] * 2 and "result" not in ti.xcoms
    ti = TaskInstanceStub()
    quiet = ShipyardOperator(task_id="job", app=app(RESULT), do_xcom_push=False, **params)
    assert quiet.execute(context(ti)).startswith("local_cwd://")
    assert ti.xcoms == {}


def test_too_many_failures_fail_the_task_and_a_retry_reruns_only_them(
    runner: Any, tmp_path: Path
) -> None:
    marks = tmp_path
    script = (
        f"[ -e {marks}/$SHIPYARD_ARRAY_INDEX ] && exit 0; touch {marks}/$SHIPYARD_ARRAY_INDEX;"
        " [ $SHIPYARD_ARRAY_INDEX -lt 2 ]"
    )
    ti1, store = TaskInstanceStub(), StateStoreStub()
    op = ShipyardOperator(task_id="job", app=app(script), array_size=4, poll_interval=0.2)
    with pytest.raises(AirflowException, match=r"2 of 4 elements did not succeed"):
        op.execute(context(ti1, store))
    handle = store[ShipyardOperator.external_id_key]

    ti2 = ti1.retry()
    again = ShipyardOperator(task_id="job", app=app(script), array_size=4, poll_interval=0.2)
    assert again.execute(context(ti2, store)) == handle
    assert ti2.xcoms["array_states"] == ["SUCCEEDED"] * 4
    status = runner.status(handle)
    assert [e.attempts for e in status.elements] == [1, 1, 2, 2]


def test_a_deferred_array_completes_through_one_trigger(runner: Any) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job", app=app("sleep 0.5"), array_size=3, deferrable=True, poll_interval=0.2
    )
    with pytest.raises(TaskDeferred) as info:
        op.execute(context(ti, StateStoreStub()))
    trigger = info.value.trigger

    async def first_event() -> Any:
        return await anext(trigger.run())

    event = asyncio.run(first_event())
    assert event.payload["state"] == "SUCCEEDED", event.payload
    resumed = ShipyardOperator(task_id="job", app=app("true"), array_size=3, deferrable=True)
    assert resumed.execute_complete(context(ti), event.payload) == trigger.app_handle
    assert ti.xcoms["array_states"] == ["SUCCEEDED"] * 3


def test_a_task_after_another_waits_and_is_cancelled_when_it_failed(runner: Any) -> None:
    first = ShipyardOperator(task_id="a", app=app("exit 1"), wait_for_completion=False)
    upstream = first.execute(context(TaskInstanceStub(task_id="a")))
    op = ShipyardOperator(task_id="b", app=app("true"), after=[upstream], poll_interval=0.2)
    with pytest.raises(AirflowException, match=rf"dependency {upstream} ended FAILED"):
        op.execute(context(TaskInstanceStub(task_id="b"), StateStoreStub()))


def test_the_sensor_waits_on_a_whole_array(runner: Any) -> None:
    from airflow_provider.sensors import ShipyardJobSensor

    handle = runner.run_array(app("sleep 0.3; exit $SHIPYARD_ARRAY_INDEX"), "local_cwd", size=2)
    sensor = ShipyardJobSensor(
        task_id="wait", app_handle=handle, target_states=["FAILED"], failure_states=["CANCELLED"]
    )
    result = sensor.poke(context(TaskInstanceStub()))
    assert not result  # (its elements still run)
    ended = runner.wait(handle, wait_interval=0.1, timeout=60)
    assert ended.counts() == {"SUCCEEDED": 1, "FAILED": 1}
    done = sensor.poke(context(TaskInstanceStub()))
    assert done.is_done and done.xcom_value == "FAILED"  # type: ignore[union-attr]
    strict = ShipyardJobSensor(task_id="wait2", app_handle=handle)
    with pytest.raises(AirflowException, match=r"is FAILED, not one of \['SUCCEEDED'\]"):
        strict.poke(context(TaskInstanceStub()))


def test_bad_array_arguments_fail_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="allow_failures: expected a non-negative integer"):
        ShipyardOperator(task_id="t", app=app("true"), array_size=2, allow_failures=-1)
    op = ShipyardOperator(task_id="t", app=app("true"), array_params="[{]")
    with pytest.raises(ValueError, match="array_params: expected a list of mappings or JSON"):
        op.execute(context(TaskInstanceStub(), StateStoreStub()))
    op = ShipyardOperator(task_id="t", app=app("true"), array_size=0)
    with pytest.raises(ValueError, match="size: expected a positive integer, got 0"):
        op.execute(context(TaskInstanceStub(), StateStoreStub()))
