"""The scripted backend failures of ``tests/unit/core/watch/test_faces.py`` (a hiccup, an outage past the
retry budget, silent replicas) through the Airflow faces of the watch: the operator (waiting on the
worker) and the trigger (waiting in a triggerer's event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider.operators import ShipyardJobSilentError, ShipyardOperator
from airflow_provider.triggers import ShipyardJobTrigger
from core.errors import BackendUnavailableError
from core.runner import get_runner
from core.specs import AppDef, AppState, Role
from tests.integration.airflow.helpers import TaskInstanceStub, context
from tests.unit.core.memory_scheduler import OUTAGE_BUDGET, SILENCE, Scenario, use_memory_scheduler


@pytest.fixture(autouse=True)
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_memory_scheduler(monkeypatch)
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", OUTAGE_BUDGET)
    yield


APP = AppDef("face", [Role("w", entrypoint="echo", num_replicas=2)])


def operator(**kwargs: Any) -> Any:
    op = ShipyardOperator(task_id="job", app=APP, scheduler="memory", poll_interval=0.1, **kwargs)
    return op.execute(context(TaskInstanceStub()))


def test_operator() -> None:
    with Scenario("hiccup") as s:
        assert operator().startswith("memory://")
        assert s.state == AppState.SUCCEEDED
    with Scenario("outage"), pytest.raises(BackendUnavailableError, match="kept failing"):
        operator()
    with Scenario("silent") as s, pytest.raises(ShipyardJobSilentError, match="from w/0, w/1"):
        operator(max_silence=SILENCE)
    assert s.state == AppState.CANCELLED


def first_event(handle: str, **kwargs: Any) -> dict[str, Any]:
    trigger = ShipyardJobTrigger(handle, poll_interval=0.1, stream_logs=True, **kwargs)

    async def fire() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(fire())


def test_trigger() -> None:
    with get_runner() as runner:
        with Scenario("hiccup") as s:
            event = first_event(runner.run(APP, "memory"))
            assert (
                (event["status"], event["state"])
                == ("success", "SUCCEEDED")
                == ("success", s.state.name)
            )
            assert event["log_lines"] == 4
        with Scenario("outage"):
            event = first_event(runner.run(APP, "memory"))
            assert event["status"] == "error" and "kept failing" in event["message"]
        with Scenario("silent") as s:
            event = first_event(runner.run(APP, "memory"), max_silence=SILENCE)
            assert (event["status"], event["silent"]) == ("failure", ["w/0", "w/1"])
            assert s.state == AppState.CANCELLED
