"""core.runner.Runner end to end on local_cwd (real processes)."""

from __future__ import annotations

import time

import pytest

from core.runner import AppFailedError, Runner, get_runner
from core.specs import AppDef, AppState, Role, parse_app_handle


def sh(script: str, name: str = "r", n: int = 1) -> Role:
    return Role(name, entrypoint="sh", args=["-c", script], num_replicas=n)


def test_run_wait_and_logs(runner: Runner) -> None:
    app = AppDef(
        "hello", [sh('echo "hi from $SHIPYARD_REPLICA_ID"', "a", 2), sh("echo b >&2", "b")]
    )
    handle = runner.run(app, "local_cwd")
    parsed = parse_app_handle(handle)
    assert (parsed.scheduler_backend, parsed.session_name) == ("local_cwd", "shipyard")
    status = runner.wait(handle, wait_interval=0.05, timeout=30)
    assert status is not None and status.state == AppState.SUCCEEDED
    assert status.exit_codes() == {"a": [0, 0], "b": [0]}
    assert list(runner.log_lines(handle, "a", 1)) == ["hi from 1\n"]
    lines = sorted(str(line) for line in runner.stream_logs(handle))
    assert lines == ["a/0 hi from 0", "a/1 hi from 1", "b/0 b"]
    assert runner.check_succeeded(handle, status) is status
    assert any(app.app_handle == handle for app in runner.list("local_cwd"))
    desc = runner.describe(handle)
    assert desc is not None and [r.name for r in desc.roles] == ["a", "b"]


def test_stream_logs_follows_a_running_app(runner: Runner) -> None:
    app = AppDef("follow", [sh("for i in 1 2 3; do echo $i; sleep 0.2; done", "r", 2)])
    handle = runner.run(app, "local_cwd")
    got = [(line.prefix, line.line) for line in runner.stream_logs(handle, should_tail=True)]
    for k in (0, 1):
        assert [text for prefix, text in got if prefix == f"r/{k}"] == ["1\n", "2\n", "3\n"]
    status = runner.status(handle)
    assert status is not None and status.state == AppState.SUCCEEDED


def test_failure_is_reported_with_exit_codes_and_last_lines(runner: Runner) -> None:
    handle = runner.run(AppDef("boom", [sh("echo about to fail; exit 7")]), "local_cwd")
    status = runner.wait(handle, wait_interval=0.05, timeout=30)
    assert status is not None and status.state == AppState.FAILED
    with pytest.raises(AppFailedError) as err:
        runner.check_succeeded(handle, status)
    assert err.value.exit_codes == {"r": [7]}
    assert "about to fail" in str(err.value)


def test_cancel(runner: Runner) -> None:
    handle = runner.run(AppDef("sleepy", [sh("exec sleep 60", "r", 3)]), "local_cwd")
    status = runner.status(handle)
    assert status is not None and status.state == AppState.RUNNING
    runner.cancel(handle)
    status = runner.wait(handle, wait_interval=0.05, timeout=30)
    assert status is not None and status.state == AppState.CANCELLED
    runner.cancel(handle)  # idempotent


def test_idempotency_key_reattaches(runner: Runner) -> None:
    key = f"task-{time.time_ns()}"
    app = AppDef("idem", [sh("exec sleep 60")])
    first = runner.run(app, "local_cwd", idempotency_key=key)
    try:
        # a retried task in another process: a fresh runner finds the same app
        with get_runner() as other:
            assert other.run(app, "local_cwd", idempotency_key=key) == first
            assert other.find("local_cwd", key) == first
        second = runner.run(app, "local_cwd", idempotency_key=key + "-other")
        assert second != first
        runner.cancel(second)
    finally:
        runner.cancel(first)


def test_unknown_handle(runner: Runner) -> None:
    handle = "local_cwd://runner-test/no-such-app-42"
    assert runner.status(handle) is None
    assert runner.wait(handle, timeout=1) is None
    with pytest.raises(ValueError, match="no app"):
        list(runner.log_lines(handle, "r", 0))


@pytest.mark.parametrize(
    "script, state, reason",
    [
        ("exit 0", AppState.SUCCEEDED, "exit_code"),
        ("exit 3", AppState.FAILED, "exit_code"),
        ("kill -KILL $$", AppState.FAILED, "signal"),
        ("exec sleep 60", AppState.CANCELLED, "cancelled"),
    ],
)
def test_every_end_has_a_reason(runner: Runner, script: str, state: AppState, reason: str) -> None:
    handle = runner.run(AppDef("why", [sh(script)]), "local_cwd")
    if state == AppState.CANCELLED:
        runner.cancel(handle)
    status = runner.wait(handle, wait_interval=0.05, timeout=30)
    assert status is not None and status.state == state
    assert status.reason == reason
    assert status.to_json()["roles"][0]["replicas"][0]["reason"] == reason
