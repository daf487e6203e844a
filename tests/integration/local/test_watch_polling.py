"""core.watch.polling and core.transient: one batched status poller per process, one rule for
transient backend errors. Real local apps; backend failures are faked (a real backend cannot
be made to fail on demand)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.specs import AppDef, AppState, Role
from core.transient import BackendUnavailableError, call_with_retries, is_transient, retry_budget
from core.watch import JobWatch
from core.watch.polling import StatusPoller, StatusWatch

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def sh(name: str, script: str) -> AppDef:
    return AppDef(name, [Role(name, entrypoint="sh", args=["-c", script])])


@pytest.fixture
def runner(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.chdir(tmp_path)
    with get_runner("polling") as r:
        yield r


class Counting:
    """Counts ``status_many`` calls and the handles in each; can fail the next ``fail`` calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, error: Exception | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail = 0
        self.error = error or ConnectionError("engine restarting")
        real = Runner.status_many

        def status_many(runner: Runner, handles: Any) -> Any:
            handles = list(handles)
            self.batches.append(handles)
            if self.fail:
                self.fail -= 1
                raise self.error
            return real(runner, handles)

        monkeypatch.setattr(Runner, "status_many", status_many)


def final(watch: StatusWatch, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        watch.wait(max(deadline - time.monotonic(), 0))
        fresh, status = watch.take()
        if fresh and (status is None or status.is_terminal()):
            return status
        assert time.monotonic() < deadline, f"no final status of {watch.handle} in {timeout}s"


def test_many_waiters_share_each_round(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    handles = [runner.run(sh(f"p{i}", "sleep 1"), "local_cwd") for i in range(5)]
    counting = Counting(monkeypatch)
    poller = StatusPoller()
    watches = [poller.watch(h, runner, 0.3) for h in handles]
    results = [final(w) for w in watches]
    for w in watches:
        w.close()
    assert [r.state for r in results] == [AppState.SUCCEEDED] * 5
    # one call per round, each for all five (not one call per waiter per round, however many
    # rounds the apps took on a loaded machine)
    assert len(counting.batches) == poller.rounds
    batches = counting.batches
    full = next(i for i, b in enumerate(batches) if sorted(b) == sorted(handles))
    assert full < 5, batches  # (the first rounds may come while the watches are being added)
    assert all(sorted(b) == sorted(handles) for b in batches[full:]), batches


def test_two_waiters_of_one_app_both_get_each_status(runner: Runner) -> None:
    handle = runner.run(sh("twice", "sleep 0.5"), "local_cwd")
    poller = StatusPoller()
    with poller.watch(handle, runner, 0.1) as a, poller.watch(handle, runner, 5.0) as b:
        assert final(a).state == AppState.SUCCEEDED
        assert final(b).state == AppState.SUCCEEDED  # polled at the faster waiter's pace


def test_transient_failures_are_retried_then_reported(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = runner.run(sh("hiccup", "true"), "local_cwd")
    counting = Counting(monkeypatch)
    counting.fail = 2  # 0.5 s + 1 s of backoff: within the budget
    with StatusPoller().watch(handle, runner, 0.1, budget=30) as watch:
        assert final(watch).state == AppState.SUCCEEDED
    assert len(counting.batches) >= 3

    counting.fail = 100  # an engine that stays down
    with StatusPoller().watch(handle, runner, 0.1, budget=1) as watch:
        with pytest.raises(BackendUnavailableError, match="engine restarting") as err:
            final(watch)
    assert "kept failing" in str(err.value)
    assert isinstance(err.value.__cause__, ConnectionError)


def test_other_errors_reach_the_waiter_at_once(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = runner.run(sh("bad", "true"), "local_cwd")
    counting = Counting(monkeypatch, ValueError("scheduler: unknown"))
    counting.fail = 100
    monkeypatch.setattr(Runner, "status", lambda self, h: (_ for _ in ()).throw(ValueError("no")))
    with StatusPoller().watch(handle, runner, 0.1, budget=60) as watch:
        with pytest.raises(ValueError):
            final(watch)
    assert len(counting.batches) == 1


def test_async_waiters_need_no_threads(runner: Runner) -> None:
    handles = [runner.run(sh(f"a{i}", "sleep 0.5"), "local_cwd") for i in range(20)]

    async def wait_all() -> tuple[list[Any], int]:
        before = threading.active_count()
        watches = [JobWatch(runner, h, poll_interval=0.2).run_async() for h in handles]
        ends = await asyncio.gather(*watches)
        return [end.status.state for end in ends], threading.active_count() - before

    states, extra_threads = asyncio.run(wait_all())
    assert states == [AppState.SUCCEEDED] * 20
    assert extra_threads <= 2  # the poll thread (and at most the runner's own), not one per waiter


def test_listeners_hear_each_new_round(runner: Runner) -> None:
    handle = runner.run(sh("listen", "sleep 0.3"), "local_cwd")
    heard = threading.Event()
    with StatusPoller().watch(handle, runner, 0.1) as watch:
        watch.add_listener(heard.set)
        assert heard.wait(10)
        assert watch.take()[0]


def test_is_transient() -> None:
    assert is_transient(ConnectionRefusedError())
    assert is_transient(TimeoutError())
    assert is_transient(subprocess.TimeoutExpired(["squeue"], 5))
    assert is_transient(BackendUnavailableError("slurm: controller did not answer"))

    class ServerError(Exception):
        response = type("R", (), {"status_code": 503})()

    class ClientError(Exception):
        response = type("R", (), {"status_code": 404})()

    assert is_transient(ServerError())
    assert not is_transient(ClientError())
    assert not is_transient(ValueError("partition: no such partition"))
    assert not is_transient(FileNotFoundError())


def test_call_with_retries() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("dropped")
        return "answer"

    assert call_with_retries(flaky, "squeue", budget=30, first_delay=0.01) == "answer"
    assert len(calls) == 3
    with pytest.raises(BackendUnavailableError, match="squeue: .*dropped"):
        call_with_retries(
            lambda: (_ for _ in ()).throw(ConnectionResetError("dropped")), "squeue", budget=0.1
        )
    with pytest.raises(KeyError):
        call_with_retries(lambda: {}["x"], "squeue", budget=30)


def test_retry_budget_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", "7")
    assert retry_budget() == 7
    with get_runner() as runner, StatusPoller().watch("local_cwd://s/a", runner, 1.0) as watch:
        assert watch.budget == 7
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", "soon")
    with pytest.raises(ValueError, match="SHIPYARD_RETRY_BUDGET: expected seconds"):
        retry_budget()


# -- change notices: a waiter alone with a local app it launched hears of each replica's end --


def test_a_lone_waiter_sees_the_end_when_it_comes_not_at_its_next_poll(runner: Runner) -> None:
    handle = runner.run(sh("notice", "sleep 1"), "local_cwd")
    # first poll at once, the next one only after a minute: past the timeout, unless the
    # scheduler tells the watch of the replica's end
    watch = JobWatch(runner, handle, poll_interval=60, first_delay=60, shared=False, timeout=30)
    assert watch.run().status.state == AppState.SUCCEEDED


def test_a_failed_replica_ends_its_gang_at_once_for_a_lone_waiter(runner: Runner) -> None:
    app = AppDef("gang", [Role("bad", entrypoint="sh", args=["-c", "sleep 1; exit 3"]),
                          Role("good", entrypoint="sleep", args=["600"])])  # fmt: skip
    handle = runner.run(app, "local_cwd")
    watch = JobWatch(runner, handle, poll_interval=60, first_delay=60, shared=False, timeout=30)
    status = watch.run().status
    assert status.state == AppState.FAILED
    assert [r.replicas[0].state for r in status.roles] == [AppState.FAILED, AppState.CANCELLED]


def test_notices_come_per_replica_end_and_only_for_this_processes_apps(
    runner: Runner, tmp_path: Any
) -> None:
    app = AppDef("two", [Role("two", entrypoint="sleep", args=["600"], num_replicas=2)])
    handle = runner.run(app, "local_cwd")
    heard = threading.Semaphore(0)
    stop = runner.notify_changes(handle, heard.release)
    assert stop is not None
    try:
        runner.cancel(handle)
        assert heard.acquire(timeout=30) and heard.acquire(timeout=30)  # one per replica
    finally:
        stop()
    stop()  # (idempotent)

    # an app launched by another process: its ends are not seen here (the waiter polls)
    out = subprocess.run(
        [SHIPYARD, "run", "--scheduler", "local_cwd", "--", "sleep", "600"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    other = out.stdout.strip().splitlines()[0]
    try:
        assert runner.notify_changes(other, heard.release) is None
    finally:
        runner.cancel(other)
