"""ShipyardJobTrigger in an event loop of its own, against the real local scheduler."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider.triggers import ShipyardJobTrigger
from core.specs import AppDef, AppState, Role
from tests.helpers import wait_until

pytestmark = pytest.mark.airflow


def sh(name: str, script: str) -> AppDef:
    return AppDef(name, [Role(name, entrypoint="sh", args=["-c", script])])


async def first_event(trigger: ShipyardJobTrigger) -> dict[str, Any]:
    event = await anext(trigger.run())
    return dict(event.payload)


def test_serialize_round_trip() -> None:
    trigger = ShipyardJobTrigger(
        "local_cwd://s/app-1", poll_interval=2, target_states=["running"], stream_logs=True
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider.triggers.ShipyardJobTrigger"
    again = ShipyardJobTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["target_states"] == ["RUNNING"]
    assert kwargs["failure_states"] == ["FAILED", "CANCELLED"]


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="target_states"):
        ShipyardJobTrigger("local_cwd://s/a", target_states=["DONE"])
    with pytest.raises(ValueError, match="poll_interval"):
        ShipyardJobTrigger("local_cwd://s/a", poll_interval=0)
    with pytest.raises(ValueError):
        ShipyardJobTrigger("not a handle")


def test_success_and_failure_events(runner: Any) -> None:
    ok = runner.run(sh("ok", "sleep 0.5"), "local_cwd")
    bad = runner.run(sh("bad", "sleep 0.5; exit 2"), "local_cwd")

    async def both() -> list[dict[str, Any]]:
        return await asyncio.gather(
            first_event(ShipyardJobTrigger(ok, poll_interval=0.2)),
            first_event(ShipyardJobTrigger(bad, poll_interval=0.2)),
        )

    ok_event, bad_event = asyncio.run(both())
    assert (ok_event["status"], ok_event["state"]) == ("success", "SUCCEEDED")
    assert (bad_event["status"], bad_event["state"]) == ("failure", "FAILED")
    assert bad_event["app_handle"] == bad


def test_in_a_triggerer_it_fires_no_sooner_than_settle_seconds(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ended before the task deferred: the trigger in a triggerer (which gives it
    its task instance) holds the event, against apache/airflow#72716 (a race this test cannot
    set off); inline (dag.test()) it fires at once."""
    handle = runner.run(sh("quick", "true"), "local_cwd")
    wait_until(lambda: runner.status(handle).is_terminal(), what=f"{handle} to end")
    monkeypatch.setattr(ShipyardJobTrigger, "settle_seconds", 2.0)

    def timed(trigger: ShipyardJobTrigger) -> tuple[dict[str, Any], float]:
        t0 = time.monotonic()
        event = asyncio.run(first_event(trigger))
        return event, time.monotonic() - t0

    inline, at_once = timed(ShipyardJobTrigger(handle, poll_interval=0.2))
    held_trigger = ShipyardJobTrigger(handle, poll_interval=0.2)
    held_trigger.task_instance = SimpleNamespace(task_id="t", dag_id="", run_id="")  # type: ignore[assignment]
    held, after = timed(held_trigger)
    assert inline["status"] == held["status"] == "success"
    assert after >= 2.0 > at_once


def test_unknown_app_is_an_error_event() -> None:
    event = asyncio.run(first_event(ShipyardJobTrigger("local_cwd://shipyard/no-such-app-42")))
    assert event["status"] == "error"
    assert "unknown" in event["message"]


def test_triggers_share_status_polls(runner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    handles = [runner.run(sh(f"p{i}", "sleep 1.5"), "local_cwd") for i in range(3)]
    batches: list[int] = []
    real = type(runner).status_many

    def counting(self: Any, app_handles: Any) -> Any:
        app_handles = list(app_handles)
        batches.append(len(app_handles))
        return real(self, app_handles)

    monkeypatch.setattr(type(runner), "status_many", counting)

    async def all_three() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(first_event(ShipyardJobTrigger(h, poll_interval=0.25)) for h in handles)
        )

    events = asyncio.run(all_three())
    assert [e["state"] for e in events] == ["SUCCEEDED"] * 3
    # the three triggers were answered together: one backend call per tick naming all three, not
    # one per trigger (only a round made while the triggers were still starting may name fewer;
    # how many ticks there were depends on the host's load, so it is not bounded)
    assert max(batches) == 3
    assert sum(b < 3 for b in batches) <= 2, batches


def test_log_lines_are_streamed_while_waiting(
    runner: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    handle = runner.run(sh("talk", "echo one; sleep 0.3; echo two"), "local_cwd")
    trigger = ShipyardJobTrigger(handle, poll_interval=0.2, stream_logs=True)
    capfd.readouterr()
    event = asyncio.run(first_event(trigger))
    out = capfd.readouterr().out
    assert event["log_lines"] == 2
    assert 0 <= out.index("talk/0 one") < out.index("talk/0 two")


def test_on_kill_cancels_the_job(runner: Any) -> None:
    handle = runner.run(sh("victim", "sleep 120"), "local_cwd")
    wait_until(lambda: runner.status(handle).state == AppState.RUNNING, what="RUNNING")
    asyncio.run(ShipyardJobTrigger(handle).on_kill())
    wait_until(lambda: runner.status(handle).state == AppState.CANCELLED, what="CANCELLED")


@pytest.mark.parametrize(
    ("failures", "budget", "expected"), [(2, "60", "success"), (5, "1", "error")]
)
def test_status_errors_are_retried_then_reported(
    runner: Any, monkeypatch: pytest.MonkeyPatch, failures: int, budget: str, expected: str
) -> None:
    """Transient backend errors (which the real backends cannot produce on demand) are retried
    with backoff (0.5, 1, 2 s ...) within the retry budget; past it the trigger fires an error."""
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", budget)
    handle = runner.run(sh("hiccup", "true"), "local_cwd")
    real = type(runner).status_many
    left = [failures]

    def flaky(self: Any, app_handles: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise ConnectionError("backend hiccup")
        return real(self, app_handles)

    monkeypatch.setattr(type(runner), "status_many", flaky)
    event = asyncio.run(first_event(ShipyardJobTrigger(handle, poll_interval=0.05)))
    assert event["status"] == expected
    if expected == "error":
        assert "backend hiccup" in event["message"]
        assert "kept failing" in event["message"]


def test_other_status_errors_are_reported_at_once(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error that is not transient (here a made-up one) is not retried."""
    handle = runner.run(sh("broken", "true"), "local_cwd")
    calls = []

    def broken(self: Any, app_handles: Any) -> Any:
        calls.append(1)
        raise ValueError("no such cluster")

    monkeypatch.setattr(type(runner), "status_many", broken)
    monkeypatch.setattr(type(runner), "status", broken)
    event = asyncio.run(first_event(ShipyardJobTrigger(handle, poll_interval=0.05)))
    assert event["status"] == "error"
    assert "no such cluster" in event["message"]
    assert len(calls) == 1


def test_log_cursor_round_trips_and_is_checked() -> None:
    trigger = ShipyardJobTrigger("local_cwd://s/a", stream_logs=True, log_cursor={"t/0": 3})
    _, kwargs = trigger.serialize()
    assert kwargs["log_cursor"] == {"t/0": 3}
    with pytest.raises(ValueError, match="log cursor"):
        ShipyardJobTrigger("local_cwd://s/a", log_cursor={"t/0": -1})


def test_streaming_resumes_after_the_cursor(runner: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """A trigger given a cursor (a restarted one, or one after lines the task logged) logs only
    the lines after it, and its event says where the task log now ends."""
    script = 'for i in 1 2 3 4 5; do echo "line $i of ${replica_id}"; done'
    handle = runner.run(
        AppDef("cur", [Role("r", entrypoint="sh", args=["-c", script], num_replicas=2)]),
        "local_cwd",
    )
    trigger = ShipyardJobTrigger(
        handle, poll_interval=0.2, stream_logs=True, log_cursor={"r/0": 3, "r/1": 1}
    )
    capfd.readouterr()
    event = asyncio.run(first_event(trigger))
    out = capfd.readouterr().out
    logged = [
        line[line.index("r/") :].split(" [")[0].strip()
        for line in out.splitlines()
        if "ShipyardJobTrigger" in line and " r/" in line
    ]
    assert [x for x in logged if x.startswith("r/0")] == ["r/0 line 4 of 0", "r/0 line 5 of 0"]
    assert [x for x in logged if x.startswith("r/1")] == [
        f"r/1 line {i} of 1" for i in (2, 3, 4, 5)
    ]
    assert event["log_cursor"] == {"r/0": 5, "r/1": 5}
    assert event["log_lines"] == 10
