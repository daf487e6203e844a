"""JobWatch: following one job to its end, the one loop that does it.

A :class:`JobWatch` takes a :class:`~core.watch.polling.StatusWatch` of its app from the
process's shared poller, follows the app's logs from a cursor (a
:class:`~core.watch.cursors.CursorStore`), watches for silent replicas, honours a deadline and a
caller's reason to stop, cancels the job on the way out where told to, and reads the final
usage and result. Everything that waits on a job uses it: ``Runner.wait`` and
``Runner.stream_logs``, the CLI, the Airflow operator, trigger and sensor, the Prefect tasks and
worker.

Its logic is written once, as a generator of effects (:meth:`JobWatch._steps`): wait for the
inbox, call something that may block, load or save the cursor. Two faces carry the effects out:
:meth:`JobWatch.run` in the calling thread, :meth:`JobWatch.run_async` on the running event loop
(blocking calls in a worker thread, no thread per waiter). The inbox is where the poller's
wake-ups and the log readers' lines meet: a thread-safe queue (sync) or the loop's own queue
(async, handed over with ``call_soon_threadsafe``).

Errors, one rule for every face: a transient failure to read the status is retried by the
poller and raised as :class:`~core.errors.BackendUnavailableError` once it outlasted the watch's
budget (:func:`core.transient.retry_budget`); any other error to read it is raised at once. An
interruption (Ctrl-C, a task's or flow's timeout, a cancelled task: see :func:`is_interrupt`)
cancels the job when ``cancel_on_exit``; an ordinary error leaves it running, so a retry can pick
it up again.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.errors import JobCancelledError, JobSilentError
from core.reports import fill_usage, with_usage
from core.specs import AppHandle, AppStatus
from core.watch.cursors import CursorStore, MemoryCursorStore
from core.watch.follow import DRAIN_TIMEOUT, END, LogCursor, LogFollower, LogLine, lines_after
from core.watch.polling import FIRST_DELAY, Logger, OwnWatch, StatusWatch, status_poller
from core.watch.silence import SilenceWatch
from core.watch.source import JobSource

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

__all__ = ["JobWatch", "WatchEnd", "is_interrupt"]

#: what the poller puts in the inbox when the app has a new status
_WAKE: Any = object()


async def take_items(inbox: asyncio.Queue[Any], seconds: float) -> list[Any]:
    """The items in ``inbox``, once one came within ``seconds`` (else none).

    A cancellation always ends the wait, even one that comes as an item does (Python 3.11's
    ``asyncio.wait_for`` returns the item then, and the cancelled watch would go on); the item
    stays in the queue.
    """
    import asyncio  # (lazily: the sync face and the CLI's start-up need none of it)

    try:
        async with asyncio.timeout(max(seconds, 0.0)):
            items = [await inbox.get()]
    except TimeoutError:
        return []
    while not inbox.empty():
        items.append(inbox.get_nowait())
    return items


def is_interrupt(exc: BaseException) -> bool:
    """True for what ends a waiter from outside: Ctrl-C, exit, timeouts and cancellation raised
    into it (asyncio's, Prefect's, Airflow's), a termination signal turned into an exception.
    False for ordinary errors (``Exception``), which leave the job running."""
    return not isinstance(exc, Exception) and not isinstance(exc, GeneratorExit)


@dataclass
class WatchEnd:
    """How a watch ended: the app's last ``status`` (final, or one its ``until`` accepted; None:
    the scheduler does not know the app), the ``cursor`` of the lines delivered, and, when
    asked for, the ``result`` (None where the scheduler collects none)."""

    handle: AppHandle
    status: AppStatus | None
    cursor: LogCursor = field(default_factory=LogCursor)
    result: Any = None
    #: why the watch stopped before the app ended (``should_stop`` said so; the job was left
    #: running, without ``cancel_on_exit``); None: it did not
    stopped: str | None = None


class _Stopped(Exception):
    """``should_stop`` gave a reason and the job is to be left running."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- effects: what the steps ask their face to do ------------------------------------------------


@dataclass
class _Wait:
    """Wait up to ``seconds`` for the inbox; the face sends back the items that came."""

    seconds: float


class _Call:
    """Call ``fn(*args)`` (the async face: in a thread); the face sends back its return value
    or throws its exception into the steps."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args


@dataclass
class _Store:
    """``load``, ``save`` (``cursor``) or ``clear`` the cursor store."""

    op: str
    cursor: LogCursor | None = None


_Effect = _Wait | _Call | _Store
_Steps = Generator[_Effect, Any, WatchEnd]


class JobWatch:
    """Follows app ``handle`` until it ends (or ``until`` accepts a status).

    Args:
        source: the runner to read the app through
        handle: the app
        poll_interval: seconds between status polls (after the first ones, at ``first_delay``
            doubling)
        shared: poll through the process's status poller, batched with every other app (False:
            this watch polls through ``source`` itself, in its own loop: for a waiter alone with
            its app, e.g. ``Runner.wait``, whose scheduler may know the app from memory)
        until: ends the watch at a status it accepts (default: a final one)
        timeout: seconds to wait at most; then :class:`TimeoutError` (after cancelling the job
            if ``cancel_on_timeout``)
        cancel_on_exit: cancel the job when the watch is interrupted (see :func:`is_interrupt`)
        should_stop: asked every ``stop_check_interval`` seconds; a reason (not None) ends the
            watch: with ``cancel_on_exit`` it cancels the job and raises
            :class:`~core.errors.JobCancelledError`, else it returns (:attr:`WatchEnd.stopped`)
        logs: follow the logs, handing each line once to ``on_line`` (in the caller's thread,
            or on its event loop), resuming after ``cursor``'s
        cursor: where the log cursor is kept (default: in memory)
        role, replica, regex, streams: which lines to follow
        tail: follow until the app ends (False: only the lines there now)
        max_silence: seconds a running replica may go without a line; past that the job is
            cancelled and :class:`~core.errors.JobSilentError` raised (needs ``logs``)
        on_status: called with each new status (e.g. a progress display)
        logger: where failed polls being retried are told
        budget: seconds of transient failures before :class:`BackendUnavailableError`
        drain_timeout: seconds the log readers get to deliver the last lines of an app that
            ended; what they did not deliver is then read from the complete logs
        final_usage: give the usage figures of an ended app some time to come in, after
            completing them from ``known_usage`` (``{"role/k": usage}`` that another process
            measured, e.g. a triggerer: see :func:`core.reports.fill_usage`)
        read_result: read the ended app's result (:attr:`WatchEnd.result`)
    """

    def __init__(
        self,
        source: JobSource,
        handle: AppHandle,
        *,
        poll_interval: float = 1.0,
        first_delay: float = FIRST_DELAY,
        shared: bool = True,
        until: Callable[[AppStatus], bool] | None = None,
        timeout: float | None = None,
        cancel_on_timeout: bool = False,
        cancel_on_exit: bool = False,
        should_stop: Callable[[], str | None] | None = None,
        stop_check_interval: float = 0.2,
        logs: bool = False,
        on_line: Callable[[LogLine], None] | None = None,
        cursor: CursorStore | None = None,
        role: str | None = None,
        replica: int | None = None,
        regex: str | None = None,
        streams: Any = None,
        tail: bool = True,
        max_silence: float | None = None,
        on_status: Callable[[AppStatus], None] | None = None,
        logger: Logger = log,
        budget: float | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        final_usage: bool = False,
        known_usage: Mapping[str, Mapping[str, Any]] | None = None,
        read_result: bool = False,
    ) -> None:
        self.source, self.handle = source, handle
        self.poll_interval, self.first_delay, self.shared = poll_interval, first_delay, shared
        self.until = until or AppStatus.is_terminal
        self.timeout, self.cancel_on_timeout = timeout, cancel_on_timeout
        self.cancel_on_exit = cancel_on_exit
        self.should_stop, self.stop_check_interval = should_stop, stop_check_interval
        self.logs, self.on_line = logs, on_line
        self.store = cursor or MemoryCursorStore()
        self.role, self.replica, self.regex, self.streams = role, replica, regex, streams
        self.tail = tail
        self.silence = SilenceWatch(max_silence) if max_silence and logs else None
        self.on_status, self.logger, self.budget = on_status, logger, budget
        self.drain_timeout = drain_timeout
        self.final_usage, self.known_usage = final_usage, known_usage
        self.read_result = read_result
        #: the lines delivered so far (with those before the start)
        self.cursor = LogCursor()
        #: the last status read
        self.status: AppStatus | None = None
        #: why some lines could not be read, if they could not (they were not delivered)
        self.log_error: Exception | None = None
        self._follower: LogFollower | None = None
        self._logs_ended = False
        self._store_broken = False

    # -- the faces ------------------------------------------------------------------------------

    def run(self) -> WatchEnd:
        """Follows the app in the calling thread until it ends; see the class docs."""
        inbox: queue.Queue[Any] = queue.Queue()
        steps = self._steps(inbox.put)
        try:
            effect = next(steps)
            while True:
                try:
                    done = self._do(effect, inbox)
                except Exception as e:
                    effect = steps.throw(e)
                else:
                    effect = steps.send(done)
        except StopIteration as stop:
            end: WatchEnd = stop.value
            return end
        except BaseException as e:
            steps.close()
            if self.cancel_on_exit and is_interrupt(e):
                self._cancel_quietly(f"interrupted: {e!r}")
            raise

    async def run_async(self) -> WatchEnd:
        """:meth:`run` for async code: on the running event loop, blocking calls in a thread."""
        import asyncio

        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Any] = asyncio.Queue()

        def hand_over(item: Any) -> None:  # (from the poller's and the log readers' threads)
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # the loop closed: nobody is listening any more
                if self._follower is not None:
                    self._follower.stop()

        steps = self._steps(hand_over)
        try:
            effect = next(steps)
            while True:
                try:
                    done = await self._ado(effect, inbox)
                except Exception as e:
                    effect = steps.throw(e)
                else:
                    effect = steps.send(done)
        except StopIteration as stop:
            end: WatchEnd = stop.value
            return end
        except BaseException as e:
            steps.close()
            if self.cancel_on_exit and is_interrupt(e):
                await asyncio.to_thread(self._cancel_quietly, f"interrupted: {e!r}")
            raise

    def _do(self, effect: _Effect, inbox: queue.Queue[Any]) -> Any:
        if isinstance(effect, _Wait):
            try:
                items = [inbox.get(timeout=max(effect.seconds, 0.0))]
            except queue.Empty:
                return []
            while True:
                try:
                    items.append(inbox.get_nowait())
                except queue.Empty:
                    return items
        if isinstance(effect, _Call):
            return effect.fn(*effect.args)
        if effect.op == "load":
            return self.store.load()
        if effect.op == "save":
            assert effect.cursor is not None
            return self.store.save(effect.cursor)
        return self.store.clear()

    async def _ado(self, effect: _Effect, inbox: Any) -> Any:
        import asyncio

        if isinstance(effect, _Wait):
            return await take_items(inbox, effect.seconds)
        if isinstance(effect, _Call):
            return await asyncio.to_thread(effect.fn, *effect.args)
        if effect.op == "load":
            return await self.store.aload()
        if effect.op == "save":
            assert effect.cursor is not None
            return await self.store.asave(effect.cursor)
        return await self.store.aclear()

    # -- the steps: the logic, once ----------------------------------------------------------------

    def _steps(self, hand_over: Callable[[Any], None]) -> _Steps:
        """Follows the app to its end, yielding the effects the face carries out."""
        if self.logs:
            self.cursor = yield _Store("load")
            if self.cursor.total:
                self.logger.info(
                    "resuming the logs of %s after %d lines", self.handle, self.cursor.total
                )
        watch = self._status_watch()
        watch.add_listener(lambda: hand_over(_WAKE))
        try:
            try:
                status = yield from self._follow(watch, hand_over)
            except _Stopped as stop:
                return WatchEnd(self.handle, self.status, self.cursor.copy(), stopped=stop.reason)
            if status is not None and self.logs:
                yield from self._drain(status)
            return (yield from self._end(status))
        finally:
            watch.close()
            if self._follower is not None:
                self._follower.stop()

    def _status_watch(self) -> StatusWatch | OwnWatch:
        """The app's statuses: from the process's poller (batched with every other app), or,
        not ``shared``, polled by this watch itself in its own loop (no thread hand-off)."""
        if not self.shared:
            return OwnWatch(
                self.handle,
                self.source,
                self.poll_interval,
                logger=self.logger,
                first_delay=self.first_delay,
                budget=self.budget,
            )
        return status_poller().watch(
            self.handle,
            self.source,
            self.poll_interval,
            logger=self.logger,
            first_delay=self.first_delay,
            budget=self.budget,
        )

    def _follow(
        self, watch: StatusWatch | OwnWatch, hand_over: Callable[[Any], None]
    ) -> Generator[_Effect, Any, AppStatus | None]:
        """Waits until the app ends (or ``until`` accepts its status); returns the status."""
        started = time.monotonic()
        deadline = math.inf if self.timeout is None else started + self.timeout
        next_stop_check = started
        while True:
            due = watch.due_in()
            if due is not None and due <= 0:
                yield _Call(watch.poll)  # type: ignore[union-attr]
            fresh, status = watch.take()  # (raises past the budget, or a non-transient error)
            if fresh:
                self.status = status
                if status is None:
                    return None
                if self.on_status is not None:
                    self.on_status(status)
                if self.logs:
                    self._follow_logs(status, hand_over)
                yield from self._check_silence(status)
                if self.until(status) or (not self.tail and self._logs_ended):
                    return status
            elif not self.tail and self._logs_ended:
                return self.status
            now = time.monotonic()
            if now >= deadline:
                yield from self._timed_out()
            if self.should_stop is not None and now >= next_stop_check:
                next_stop_check = now + self.stop_check_interval
                reason = yield _Call(self.should_stop)
                if reason and not self.cancel_on_exit:
                    raise _Stopped(reason)
                if reason:
                    yield _Call(self._cancel_quietly, reason)
                    raise JobCancelledError(self.handle, reason)
            wait = min(self.poll_interval, deadline - now)
            due = watch.due_in()
            if due is not None:
                wait = min(wait, max(due, 0.0))
            if self.should_stop is not None:
                wait = min(wait, max(next_stop_check - now, 0.0))
            items = yield _Wait(wait)
            yield from self._deliver(items)

    def _timed_out(self) -> Generator[_Effect, Any, None]:
        state = self.status.state.name if self.status is not None else "UNKNOWN"
        message = f"app {self.handle} still {state} after {self.timeout}s"
        if self.cancel_on_timeout:
            yield _Call(self._cancel_quietly, f"timeout of {self.timeout}s")
            message += "; cancelled it"
        raise TimeoutError(message)

    def _check_silence(self, status: AppStatus) -> Generator[_Effect, Any, None]:
        hang = self.silence.hang(self.handle, status) if self.silence is not None else None
        if hang is None:
            return
        self.logger.warning("%s", hang)
        yield _Call(self._cancel_quietly, "max_silence")
        raise JobSilentError(str(hang), hang.handle, hang.silent)

    # -- logs ----------------------------------------------------------------------------------

    def _wanted(self, status: AppStatus) -> list[tuple[str, int]]:
        return [
            (rs.role, r.id)
            for rs in status.roles
            for r in rs.replicas
            if (self.role is None or rs.role == self.role)
            and (self.replica is None or r.id == self.replica)
        ]

    def _follow_logs(self, status: AppStatus, hand_over: Callable[[Any], None]) -> None:
        """Starts reading the replicas' logs once the app runs (a queued app has no output,
        and following one costs a status call per replica and poll)."""
        if self._follower is None:
            if status.state.name != "RUNNING" and not status.is_terminal() and self.tail:
                return
            self._follower = LogFollower(
                self.source,
                self.handle,
                hand_over,
                self.cursor.copy(),
                regex=self.regex,
                should_tail=self.tail,
                streams=self.streams,
            )
        self._follower.add(self._wanted(status))
        if not self.tail:
            self._follower.close()

    def _deliver(self, items: list[Any]) -> Generator[_Effect, Any, None]:
        """Hands the lines among ``items`` on (each once), then saves the cursor."""
        delivered = False
        for item in items:
            if item is _WAKE:
                continue
            if item is END:
                self._logs_ended = True
                continue
            index, line = item
            if not self.cursor.accept(index, line):
                continue
            delivered = True
            if self.silence is not None:
                self.silence.saw(line)
            if self.on_line is not None:
                self.on_line(line)
        if delivered:
            yield from self._save()

    def _save(self) -> Generator[_Effect, Any, None]:
        if self._store_broken:
            return
        try:
            yield _Store("save", self.cursor.copy())
        except Exception as e:  # the lines are delivered; only a restart would repeat them
            self._store_broken = True
            self.logger.warning("cannot save the log cursor of %s: %s", self.handle, e)

    def _drain(self, status: AppStatus) -> Generator[_Effect, Any, None]:
        """After the app ended: the readers' last lines (for up to ``drain_timeout``), then
        what they did not deliver, from the complete logs."""
        if self._follower is None:
            missed = self._wanted(status)
        else:
            self._follower.add(self._wanted(status))
            self._follower.close()
            deadline = time.monotonic() + self.drain_timeout
            while not self._logs_ended and time.monotonic() < deadline:
                yield from self._deliver((yield _Wait(deadline - time.monotonic())))
            if not self._logs_ended:
                self.logger.warning(
                    "logs of %s still streaming after %ss", self.handle, self.drain_timeout
                )
            self._follower.stop()
            incomplete = not self._logs_ended or self._follower.errors
            missed = self._wanted(status) if incomplete else []
        if missed:
            try:
                lines = yield _Call(lines_after, self.source, self.handle, self.cursor, missed)
            except Exception as e:
                self.logger.warning("cannot read the logs of %s: %s", self.handle, e)
                self.log_error, lines = e, []
            yield from self._deliver(lines)
        if status.is_terminal() and not self._store_broken:
            yield _Store("clear")

    # -- the end -------------------------------------------------------------------------------

    def _end(self, status: AppStatus | None) -> Generator[_Effect, Any, WatchEnd]:
        end = WatchEnd(self.handle, status, self.cursor.copy())
        if status is None or not status.is_terminal():
            return end
        if self.final_usage:
            fill_usage(status.roles, self.known_usage or {})
            end.status = yield _Call(with_usage, status, self._status_now)
        if self.read_result and status.elements is None:  # (an array's are its elements')
            try:
                end.result = yield _Call(self.source.result, self.handle)
            except NotImplementedError:  # a scheduler that collects no results
                end.result = None
        return end

    def _status_now(self) -> AppStatus | None:
        status = self.source.status(self.handle)
        if status is not None:
            fill_usage(status.roles, self.known_usage or {})
        return status

    def _cancel_quietly(self, why: str) -> None:
        """Cancels the job without raising (another exception is on its way)."""
        try:
            self.source.cancel(self.handle)
            self.logger.warning("cancelled %s (%s)", self.handle, why)
        except Exception as e:
            self.logger.warning("could not cancel %s (%s): %s", self.handle, why, e)
