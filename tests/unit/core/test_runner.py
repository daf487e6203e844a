"""The Runner's own logic, on the in-memory backend (real backends: test_local_runner.py etc.)."""

from __future__ import annotations

import threading

import pytest

from core import runner as runner_mod
from core.runner import AppFailedError, Runner, get_runner
from core.specs import AppDef, AppState, MalformedAppHandleException, Role
from core.watch import LogLine
from tests.unit.core.memory_scheduler import MemoryScheduler, create_scheduler


@pytest.fixture
def runner() -> Runner:
    return Runner("sess", {"memory": create_scheduler}, {"opt": 1})


def _app(replicas: int = 2) -> AppDef:
    return AppDef(
        "demo", [Role("w", entrypoint="echo", num_replicas=replicas), Role("ps", entrypoint="echo")]
    )


def _sched(runner: Runner) -> MemoryScheduler:
    s = runner._scheduler("memory")
    assert isinstance(s, MemoryScheduler)
    return s


def test_every_public_name_exists() -> None:
    for name in runner_mod.__all__:
        assert hasattr(runner_mod, name), name


def test_run_returns_a_handle_usable_for_everything(runner: Runner) -> None:
    handle = runner.run(_app(), "memory", {"greeting": "yo"})
    assert handle.startswith("memory://sess/demo-")
    assert _sched(runner).kwargs == {"opt": 1}
    status = runner.status(handle)
    assert status is not None and status.state == AppState.RUNNING
    assert [(r, k) for r, k in runner.replicas(handle)] == [("w", 0), ("w", 1), ("ps", 0)]
    assert list(runner.log_lines(handle, "w", 1)) == ["yo from w/1\n", "second line\n"]
    assert list(runner.log_lines(handle, "w", 1, regex="second")) == ["second line\n"]
    described = runner.describe(handle)
    assert described is not None and [r.name for r in described.roles] == ["w", "ps"]
    assert [a.app_handle for a in runner.list("memory")][-1] == handle
    runner.cancel(handle)
    final = runner.wait(handle, wait_interval=0.01, timeout=5)
    assert final is not None and final.state == AppState.CANCELLED


def test_unknown_things_give_clear_errors(runner: Runner) -> None:
    with pytest.raises(
        ValueError, match="scheduler: unknown scheduler 'nope'; expected one of memory"
    ):
        runner.run(_app(), "nope")
    with pytest.raises(MalformedAppHandleException):
        runner.status("not-a-handle")
    assert runner.status("memory://sess/missing") is None
    assert runner.wait("memory://sess/missing") is None
    handle = runner.run(_app(), "memory")
    with pytest.raises(ValueError, match="has no role 'x'"):
        runner.log_lines(handle, "x")
    with pytest.raises(ValueError, match="has no replica 5"):
        runner.log_lines(handle, "w", 5)
    with pytest.raises(ValueError, match="no app memory://sess/missing"):
        runner.log_lines("memory://sess/missing", "w")


def test_wait_times_out_without_touching_the_app(runner: Runner) -> None:
    handle = runner.run(_app(), "memory")
    with pytest.raises(TimeoutError, match="still RUNNING after 0.05s"):
        runner.wait(handle, wait_interval=0.01, timeout=0.05)
    assert runner.status(handle).state == AppState.RUNNING  # type: ignore[union-attr]


def test_wait_returns_when_another_thread_finishes_the_app(runner: Runner) -> None:
    handle = runner.run(_app(), "memory")
    app_id = handle.rsplit("/", 1)[1]
    t = threading.Timer(0.05, _sched(runner).finish, args=(app_id, AppState.SUCCEEDED))
    t.start()
    status = runner.wait(handle, wait_interval=0.01, timeout=10)
    assert status is not None and status.state == AppState.SUCCEEDED
    assert runner.check_succeeded(handle, status) is status


def test_idempotency_key_reattaches_instead_of_submitting_twice(runner: Runner) -> None:
    first = runner.run(_app(), "memory", idempotency_key="dag:run:task:0")
    n = len(MemoryScheduler.apps)
    again = runner.run(_app(), "memory", idempotency_key="dag:run:task:0")
    assert again == first and len(MemoryScheduler.apps) == n
    other = runner.run(_app(), "memory", idempotency_key="dag:run:task:1")
    assert other != first
    assert MemoryScheduler.apps[first.rsplit("/", 1)[1]]["key"] == "dag:run:task:0"
    assert runner.find("memory", "never-used") is None


def test_status_many_uses_one_backend_call_per_scheduler(runner: Runner) -> None:
    handles = [runner.run(_app(1), "memory") for _ in range(5)]
    sched = _sched(runner)
    sched.describe_calls = 0
    statuses = runner.status_many(handles + ["memory://sess/missing"])
    assert sched.describe_calls == 1
    assert (
        all(statuses[h] is not None for h in handles) and statuses["memory://sess/missing"] is None
    )


def test_stream_logs_interleaves_every_replica_in_order(runner: Runner) -> None:
    handle = runner.run(_app(), "memory", {"greeting": "hey"})
    lines = list(runner.stream_logs(handle, should_tail=False))
    assert len(lines) == 6
    for role, k in [("w", 0), ("w", 1), ("ps", 0)]:
        mine = [entry.line for entry in lines if (entry.role, entry.replica) == (role, k)]
        assert mine == [f"hey from {role}/{k}\n", "second line\n"]
    assert str(LogLine("w", 1, "x\n")) == "w/1 x" and LogLine("w", 1, "x").prefix == "w/1"


def test_check_succeeded_raises_with_state_exit_codes_and_last_lines(runner: Runner) -> None:
    handle = runner.run(_app(1), "memory")
    _sched(runner).finish(handle.rsplit("/", 1)[1], AppState.FAILED)
    status = runner.wait(handle)
    with pytest.raises(AppFailedError) as e:
        runner.check_succeeded(handle, status)
    err = e.value
    assert err.state == AppState.FAILED and err.exit_codes == {"w": [1], "ps": [1]}
    assert f"app {handle} ended FAILED (exit codes: w/0=1, ps/0=1)" in str(err)
    assert "--- last 2 log lines of w/0 ---" in str(err) and "second line" in str(err)


def test_dryrun_and_schedule(runner: Runner) -> None:
    info = runner.dryrun(_app(), "memory", {"greeting": "x"})
    assert str(info) == "memory request for demo"
    handle = runner.schedule(info)
    assert runner.status(handle) is not None
    assert "greeting" in str(runner.scheduler_run_opts("memory"))
    assert list(runner.run_opts()) == ["memory"]


def test_close_closes_every_scheduler_once() -> None:
    r = Runner("s", {"memory": create_scheduler})
    sched = _sched(r)
    r.close()
    r.close()
    assert sched.closed == 1


def test_get_runner_session_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIPYARD_SESSION", "from-env")
    assert get_runner().session_name == "from-env"
    assert get_runner("explicit").session_name == "explicit"
    monkeypatch.delenv("SHIPYARD_SESSION")
    assert get_runner().session_name == "shipyard"


def test_attach_or_submit_runs_once_per_attempt(runner: Runner) -> None:
    first = runner.attach_or_submit(_app(1), "memory", key="k")
    assert not first.attached and first.key == "k" and first.state == "SUBMITTED"
    # the same attempt again (a crash after submitting): its own job, whatever its state
    _sched(runner).finish(first.handle.rsplit("/", 1)[1], AppState.FAILED)
    again = runner.attach_or_submit(_app(1), "memory", key="k")
    assert again.attached and again.handle == first.handle and again.state == "FAILED"
    # the next attempt: the earlier one failed, so it runs again, under its own key
    second = runner.attach_or_submit(_app(1), "memory", key="k", attempt=2)
    assert not second.attached and second.key == "k:2" and second.handle != first.handle
    # a later attempt finds the newest earlier job: still running, so it is followed
    third = runner.attach_or_submit(_app(1), "memory", key="k", attempt=4)
    assert third.attached and third.handle == second.handle and third.state == "RUNNING"
    assert runner.find_latest("memory", "k", 4) == (second.handle, 2)
    # ... and one that succeeded is not run again
    _sched(runner).finish(second.handle.rsplit("/", 1)[1], AppState.SUCCEEDED)
    assert runner.attach_or_submit(_app(1), "memory", key="k", attempt=5).handle == second.handle
    _sched(runner).finish(second.handle.rsplit("/", 1)[1], AppState.CANCELLED)
    fifth = runner.attach_or_submit(_app(1), "memory", key="k", attempt=5)
    assert not fifth.attached and fifth.key == "k:5"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"key": ""}, "key"),
        ({"key": "k", "attempt": 0}, "attempt"),
        ({"key": "k", "attempt": True}, "attempt"),
    ],
)
def test_attach_or_submit_bad_input(runner: Runner, kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        runner.attach_or_submit(_app(1), "memory", **kwargs)  # type: ignore[arg-type]
