"""core.watch.job: JobWatch, both faces, on the in-memory scheduler (no services): lines once and
in order from a cursor, the end of an app, transient and other errors, silence, the deadline,
a caller's reason to stop, interruptions, and the cursor store."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from core.errors import BackendUnavailableError, JobCancelledError, JobSilentError
from core.runner import Runner
from core.specs import AppDef, AppState, Role
from core.watch import JobWatch, LogCursor, LogLine, MemoryCursorStore, WatchEnd, status_poller
from core.watch.job import take_items
from tests.unit.core.memory_scheduler import MemoryScheduler, create_scheduler


@pytest.fixture
def runner() -> Iterator[Runner]:
    MemoryScheduler.failures.clear()
    with Runner("watch", {"memory": create_scheduler}) as r:
        yield r
    MemoryScheduler.failures.clear()


def submit(runner: Runner, replicas: int = 2) -> tuple[str, str]:
    handle = runner.run(
        AppDef("w", [Role("w", entrypoint="echo", num_replicas=replicas)]), "memory"
    )
    return handle, handle.rsplit("/", 1)[1]


def run(watch: JobWatch, face: str) -> WatchEnd:
    return watch.run() if face == "sync" else asyncio.run(watch.run_async())


FACES = pytest.mark.parametrize("face", ["sync", "async"])


def later(seconds: float, fn: Any, *args: Any) -> None:
    timer = threading.Timer(seconds, fn, args)
    timer.daemon = True
    timer.start()


@FACES
def test_every_line_once_in_order_then_the_end(runner: Runner, face: str) -> None:
    handle, app_id = submit(runner)
    got: list[str] = []
    store = MemoryCursorStore(LogCursor({"w/1": 1}))  # w/1's first line was delivered before

    def printing() -> None:
        for i in range(20):
            MemoryScheduler.emit(app_id, "w", i % 2, f"step {i}")
        MemoryScheduler.finish(app_id, AppState.SUCCEEDED)

    later(0.2, printing)
    watch = JobWatch(
        runner,
        handle,
        poll_interval=0.1,
        logs=True,
        on_line=lambda ln: got.append(str(ln)),
        cursor=store,
    )
    end = run(watch, face)
    assert end.status is not None and end.status.state == AppState.SUCCEEDED
    for k in (0, 1):
        mine = [line.split(" ", 1)[1] for line in got if line.startswith(f"w/{k} ")]
        first = [f"hello from w/{k}", "second line"][k:]  # (w/1 resumed after its first line)
        assert mine == first + [f"step {i}" for i in range(k, 20, 2)]
    assert end.cursor.to_dict() == {"w/0": 12, "w/1": 12}
    assert store.load() == LogCursor()  # cleared: every line delivered


@FACES
def test_transient_failures_within_the_budget_are_retried(runner: Runner, face: str) -> None:
    handle, app_id = submit(runner, 1)
    MemoryScheduler.failures[:] = [ConnectionError("engine restarting")] * 2
    later(0.1, MemoryScheduler.finish, app_id, AppState.SUCCEEDED)
    end = run(JobWatch(runner, handle, poll_interval=0.1, budget=30), face)
    assert end.status is not None and end.status.state == AppState.SUCCEEDED
    assert not MemoryScheduler.failures


@FACES
def test_an_outage_past_the_budget_is_one_error(runner: Runner, face: str) -> None:
    handle, _ = submit(runner, 1)
    MemoryScheduler.failures[:] = [ConnectionError("engine restarting")] * 1000
    with pytest.raises(BackendUnavailableError, match="kept failing .*engine restarting"):
        run(JobWatch(runner, handle, poll_interval=0.1, budget=1.0), face)


@FACES
def test_another_error_is_raised_at_once(runner: Runner, face: str) -> None:
    handle, _ = submit(runner, 1)
    MemoryScheduler.failures[:] = [PermissionError("token refused")] * 3
    with pytest.raises(PermissionError, match="token refused"):
        run(JobWatch(runner, handle, poll_interval=0.1, budget=60), face)


@FACES
def test_silent_replicas_cancel_the_job(runner: Runner, face: str) -> None:
    handle, app_id = submit(runner)

    def talk() -> None:  # w/0 keeps printing, w/1 says nothing after its first lines
        for i in range(40):
            MemoryScheduler.emit(app_id, "w", 0, f"tick {i}")
            threading.Event().wait(0.05)

    later(0, talk)
    with pytest.raises(JobSilentError) as err:
        run(JobWatch(runner, handle, poll_interval=0.1, logs=True, max_silence=0.6), face)
    assert err.value.silent == ["w/1"] and "'second line'" in str(err.value)
    assert MemoryScheduler.apps[app_id]["state"] == AppState.CANCELLED


@FACES
@pytest.mark.parametrize("cancel", [True, False])
def test_the_deadline(runner: Runner, face: str, cancel: bool) -> None:
    handle, app_id = submit(runner, 1)
    watch = JobWatch(runner, handle, poll_interval=0.1, timeout=0.3, cancel_on_timeout=cancel)
    with pytest.raises(
        TimeoutError, match="still RUNNING after 0.3s" + ("; cancelled" if cancel else "$")
    ):
        run(watch, face)
    assert MemoryScheduler.apps[app_id]["state"] == (
        AppState.CANCELLED if cancel else AppState.RUNNING
    )


@FACES
@pytest.mark.parametrize("cancel", [True, False])
def test_a_reason_to_stop(runner: Runner, face: str, cancel: bool) -> None:
    handle, app_id = submit(runner, 1)
    asked = []

    def should_stop() -> str | None:
        asked.append(1)
        return "the flow run was cancelled" if len(asked) >= 3 else None

    watch = JobWatch(
        runner,
        handle,
        poll_interval=1.0,
        should_stop=should_stop,
        stop_check_interval=0.05,
        cancel_on_exit=cancel,
    )
    if cancel:
        with pytest.raises(JobCancelledError, match="the flow run was cancelled"):
            run(watch, face)
        assert MemoryScheduler.apps[app_id]["state"] == AppState.CANCELLED
    else:
        assert run(watch, face).stopped == "the flow run was cancelled"
        assert MemoryScheduler.apps[app_id]["state"] == AppState.RUNNING


@FACES
@pytest.mark.parametrize("cancel", [True, False])
def test_an_interruption_cancels_only_when_told(runner: Runner, face: str, cancel: bool) -> None:
    handle, app_id = submit(runner, 1)

    def interrupt() -> str | None:
        raise KeyboardInterrupt

    watch = JobWatch(runner, handle, should_stop=interrupt, cancel_on_exit=cancel)
    with pytest.raises(KeyboardInterrupt):
        run(watch, face)
    assert MemoryScheduler.apps[app_id]["state"] == (
        AppState.CANCELLED if cancel else AppState.RUNNING
    )


def test_a_cancel_that_comes_with_a_status_ends_the_async_watch(runner: Runner) -> None:
    # the poller wakes the watch and, in the same round, the caller's task is cancelled (as a
    # triggerer cleans up a trigger): the watch must end, not take the status and go on
    handle, _ = submit(runner, 1)

    async def main() -> tuple[bool, asyncio.Task[WatchEnd]]:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(JobWatch(runner, handle, poll_interval=0.05).run_async())
        await asyncio.sleep(0)  # (its first step takes its watch of the poller)
        with status_poller().watch(handle, runner, 0.05) as after_it:
            after_it.add_listener(lambda: loop.call_soon_threadsafe(task.cancel))
            await asyncio.wait({task}, timeout=10)
        ended = task.done()
        if not ended:
            task.cancel()  # (again, so that the test ends)
            await asyncio.wait({task})
        return ended, task

    ended, task = asyncio.run(main())
    assert ended, "the watch went on after its task was cancelled"
    assert task.cancelled()


def test_a_listener_that_raises_leaves_every_watch_polled(runner: Runner) -> None:
    # listeners run in the poller's thread, which polls every app of the process: one that
    # raises (a hand-over to an event loop closed meanwhile) must not end the polls of the others
    handle_a, _ = submit(runner, 1)
    handle_b, app_b = submit(runner, 1)
    raised = threading.Event()

    def broken() -> None:
        raised.set()
        raise RuntimeError("Event loop is closed")

    poller = status_poller()
    with poller.watch(handle_a, runner, 0.05) as a, poller.watch(handle_b, runner, 0.05) as b:
        a.add_listener(broken)
        assert raised.wait(10), "no round reached the listener"
        MemoryScheduler.finish(app_b, AppState.SUCCEEDED)
        state = None
        deadline = time.monotonic() + 10
        while state != AppState.SUCCEEDED and time.monotonic() < deadline:
            b.wait(1.0)
            new, status = b.take()
            state = status.state if new and status is not None else state
    assert state == AppState.SUCCEEDED, "the polls stopped after the listener raised"


def test_take_items_keeps_an_item_that_comes_with_a_cancel() -> None:
    async def main() -> None:
        inbox: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.create_task(take_items(inbox, 10))
        await asyncio.sleep(0)
        inbox.put_nowait(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inbox.get_nowait() == 1
        assert await take_items(inbox, 0) == []
        inbox.put_nowait(2)
        inbox.put_nowait(3)
        assert await take_items(inbox, 0) == [2, 3]

    asyncio.run(main())


def test_an_ordinary_error_leaves_the_job_running(runner: Runner) -> None:
    handle, app_id = submit(runner, 1)

    def broken(line: LogLine) -> None:
        raise RuntimeError("the task log is gone")

    with pytest.raises(RuntimeError, match="task log is gone"):
        JobWatch(runner, handle, logs=True, on_line=broken, cancel_on_exit=True).run()
    assert MemoryScheduler.apps[app_id]["state"] == AppState.RUNNING


def test_until_ends_the_watch_at_a_state_of_the_callers(runner: Runner) -> None:
    handle, _ = submit(runner, 1)
    end = JobWatch(runner, handle, until=lambda s: s.state == AppState.RUNNING).run()
    assert end.status is not None and end.status.state == AppState.RUNNING


def test_an_unknown_app_ends_the_watch_without_a_status(runner: Runner) -> None:
    assert JobWatch(runner, "memory://watch/nope-1").run().status is None


def test_without_tail_only_the_lines_there_now(runner: Runner) -> None:
    handle, _ = submit(runner)
    got: list[str] = []
    end = JobWatch(
        runner, handle, logs=True, tail=False, on_line=lambda ln: got.append(str(ln))
    ).run()
    assert sorted(got) == sorted(
        f"w/{k} {t}" for k in (0, 1) for t in (f"hello from w/{k}", "second line")
    )
    assert end.status is not None and end.status.state == AppState.RUNNING


def test_a_store_that_cannot_save_is_told_once(
    runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(MemoryCursorStore):
        def save(self, cursor: LogCursor) -> None:
            raise OSError("read-only file system")

    handle, app_id = submit(runner, 1)
    later(0.2, MemoryScheduler.finish, app_id, AppState.SUCCEEDED)
    got: list[str] = []
    JobWatch(
        runner,
        handle,
        poll_interval=0.1,
        logs=True,
        on_line=lambda ln: got.append(str(ln)),
        cursor=Broken(),
    ).run()
    assert got == ["w/0 hello from w/0", "w/0 second line"]
    assert caplog.text.count("cannot save the log cursor") == 1


def test_runner_wait_is_a_watch(runner: Runner) -> None:
    handle, app_id = submit(runner, 1)
    MemoryScheduler.failures[:] = [TimeoutError("squeue timed out")] * 2
    later(0.1, MemoryScheduler.finish, app_id, AppState.FAILED)
    status = runner.wait(handle, wait_interval=0.05)
    assert status is not None and status.state == AppState.FAILED
    with pytest.raises(TimeoutError, match="still RUNNING"):
        runner.wait(submit(runner, 1)[0], wait_interval=0.05, timeout=0.2)
