"""ShipyardJobTrigger: waits for a Shipyard app in the triggerer, off the worker.

With ``stream_logs`` the trigger logs the app's lines from its own coroutine, so the triggerer
routes them to the deferred task's log. Where it starts and stops is a
:class:`core.follow.LogCursor` (lines already in the task log, per replica): the operator hands
one over in the trigger's kwargs, the trigger checkpoints it in the task instance's XCom
``shipyard_log_cursor`` as it goes (a restarted triggerer resumes from there instead of logging
the job again) and returns it in its event, so the resumed task adds exactly the lines after it.

Every trigger of one triggerer process shares :func:`core.polling.status_poller`: their
handles are described together, one backend call per scheduler per poll interval however many
jobs are being waited on, and a transient backend failure is retried within the budget of
:mod:`core.transient` before the trigger fires an ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseXCom
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider._common import TERMINAL_STATES, make_runner, state_names
from airflow_provider.hooks.shipyard import connection_settings, docker_engine_from_connection
from core.clusters import register_cluster
from core.follow import DRAIN_TIMEOUT, END, LogCursor, LogFollower, lines_after
from core.polling import StatusWatch, status_poller
from core.reports import usage_by_replica
from core.runner import LogLine, Runner
from core.silence import JobSilentError, SilenceWatch, check_max_silence
from core.specs import AppHandle, AppStatus, parse_app_handle

if TYPE_CHECKING:
    from core.schedulers.docker.engine import DockerEngine

log = logging.getLogger(__name__)

__all__ = ["LOG_CURSOR_XCOM_KEY", "ShipyardJobTrigger"]

#: the XCom (of the deferred task instance) where the trigger checkpoints its log cursor
LOG_CURSOR_XCOM_KEY = "shipyard_log_cursor"

#: what the status poller puts in a log stream's queue when the app has a new status
_WAKE: Any = object()


class ShipyardJobTrigger(BaseTrigger):
    """Fires once the app reaches one of ``target_states``, a ``failure_states`` or ends.

    Args:
        app_handle: ``{scheduler}://{session}/{app_id}``
        poll_interval: seconds between status checks
        target_states: states that fire a ``success`` event (default: SUCCEEDED)
        failure_states: states that fire a ``failure`` event (default: FAILED, CANCELLED); any
            other terminal state fires ``failure`` too
        stream_logs: log the app's lines (``role/replica line``) as they are produced; the
            triggerer routes them to the deferred task's log
        shipyard_conn_id: the Airflow connection of the app's backend (its Slurm cluster is
            read from the connection in the triggerer; only the id is serialized)
        log_cursor: lines already in the task log (``{"role/k": count}``); only the lines
            after it are logged
        max_silence: with ``stream_logs``, seconds a running replica may go without a line;
            past that the trigger cancels the app and fires a ``failure`` event whose
            ``silent`` lists the silent replicas (see :mod:`core.silence`)

    The event payload: ``status`` (``success``, ``failure`` or ``error``), ``app_handle``,
    ``state`` (the app state name), ``message``, ``log_cursor`` (the lines in the task log once
    the trigger stopped: the task adds the lines after it) and ``log_lines`` (how many lines
    the task log then holds).
    """

    #: the least time a trigger runs in a triggerer before it fires (see :meth:`_settle`)
    settle_seconds = 10.0

    def __init__(
        self,
        app_handle: str,
        poll_interval: float = 5.0,
        target_states: Sequence[str] | None = None,
        failure_states: Sequence[str] | None = None,
        stream_logs: bool = False,
        shipyard_conn_id: str | None = None,
        log_cursor: Mapping[str, int] | None = None,
        max_silence: float | None = None,
    ) -> None:
        super().__init__()
        parse_app_handle(app_handle)  # raises on a malformed handle
        self.app_handle = app_handle
        self.poll_interval = float(poll_interval)
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval: expected a positive number, got {poll_interval!r}")
        self.target_states = state_names(target_states or ["SUCCEEDED"], "target_states")
        self.failure_states = state_names(
            ["FAILED", "CANCELLED"] if failure_states is None else failure_states,
            "failure_states",
        )
        self.stream_logs = bool(stream_logs)
        self.shipyard_conn_id = shipyard_conn_id
        self.log_cursor = LogCursor(log_cursor).to_dict()
        self.max_silence = check_max_silence(max_silence)
        self._engine: DockerEngine | None = None  # the connection's, found in the triggerer

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "app_handle": self.app_handle,
            "poll_interval": self.poll_interval,
            "target_states": list(self.target_states),
            "failure_states": list(self.failure_states),
            "stream_logs": self.stream_logs,
            "shipyard_conn_id": self.shipyard_conn_id,
            "log_cursor": dict(self.log_cursor),
        }
        if self.max_silence is not None:  # (only then: a triggerer of an older version still
            kwargs["max_silence"] = self.max_silence  # inflates the triggers that do not use it)
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def _use_connection(self) -> None:
        if self.shipyard_conn_id:
            conn = await BaseHook.aget_connection(self.shipyard_conn_id)
            _, _, cluster = connection_settings(conn)
            if cluster is not None:
                register_cluster(cluster)
            self._engine = docker_engine_from_connection(conn)

    def _runner(self) -> Runner:
        """A runner that reaches the connection's backend."""
        return make_runner(engine=self._engine)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        async with contextlib.aclosing(self._events()) as events:
            async for event in events:
                await self._settle(started)
                yield event

    async def _settle(self, started: float) -> None:
        """In a triggerer, fires no sooner than :attr:`settle_seconds` after the trigger
        started: Airflow 3.3's scheduler fails a resumed task when it takes in the deferring
        worker's exit only once the resumed try runs (apache/airflow#72716), which a job that
        ends right after the task deferred sets off. ``dag.test()`` runs triggers inline (no
        task instance on the trigger) and has no such race."""
        if self.task_instance is None:
            return
        left = started + self.settle_seconds - time.monotonic()
        if left > 0:
            self.log.info("firing in %.1fs (letting Airflow's scheduler settle)", left)
            await asyncio.sleep(left)

    async def _events(self) -> AsyncGenerator[TriggerEvent, None]:
        await self._use_connection()
        stream = await self._open_stream() if self.stream_logs else None
        # a connection's own Docker engine is polled through a runner of its own
        runner = self._runner() if self._engine is not None else None
        watch = status_poller().watch(self.app_handle, self.poll_interval, self.log, runner)
        if stream is not None:
            watch.add_listener(stream.wake)
        try:
            while True:
                try:
                    fresh, status = await self._next_status(watch, stream)
                except Exception as e:
                    message = f"cannot describe {self.app_handle}: {e}"
                    yield self._event("error", "UNKNOWN", message, stream)
                    return
                if not fresh:
                    continue
                if status is None:
                    message = f"app {self.app_handle} is unknown to its scheduler"
                    yield self._event("error", "UNKNOWN", message, stream)
                    return
                hang = stream.hang(status) if stream is not None else None
                if hang is not None:
                    yield await self._cancel_silent(stream, hang)  # type: ignore[arg-type]
                    return
                kind = self._kind(status.state.name)
                if kind is None:
                    continue
                if stream is not None and status.state.name in TERMINAL_STATES:
                    await stream.finish(DRAIN_TIMEOUT)
                message = f"app {self.app_handle} is {status.state.name}"
                event = self._event(kind, status.state.name, message, stream)
                event.payload["usage"] = usage_by_replica(status.roles)
                yield event
                return
        finally:
            watch.close()
            if runner is not None:
                runner.close()
            if stream is not None:
                stream.stop()
                await stream.checkpoint()

    async def _cancel_silent(self, stream: _LogStream, hang: JobSilentError) -> TriggerEvent:
        """Cancels the app whose replicas are silent; the failure event names them."""
        self.log.error("%s", hang)
        await asyncio.to_thread(_cancel, self._runner, self.app_handle)
        event = self._event("failure", "CANCELLED", str(hang), stream)
        event.payload["silent"] = hang.silent
        return event

    async def _open_stream(self) -> _LogStream:
        checkpoint = _Checkpoint.of(self)
        cursor = LogCursor(self.log_cursor)
        if checkpoint is not None:
            cursor = cursor.merged(await checkpoint.load())
        silence = SilenceWatch(self.max_silence) if self.max_silence else None
        stream = _LogStream(self.app_handle, self.log, cursor, checkpoint, silence, self._runner)
        if cursor.total:
            self.log.info("resuming the logs of %s after %d lines", self.app_handle, cursor.total)
        stream.start()
        return stream

    async def _next_status(
        self, watch: StatusWatch, stream: _LogStream | None
    ) -> tuple[bool, AppStatus | None]:
        """The app's next status from the poller, logging its lines meanwhile."""
        if stream is None:
            return await watch.next_async(self.poll_interval)
        fresh = watch.take()
        if not fresh[0]:
            await stream.pump(self.poll_interval)  # returns early once a status came
            fresh = watch.take()
        return fresh

    def _kind(self, state: str) -> str | None:
        """The event a state fires (``success``/``failure``), None to keep waiting."""
        if state in self.target_states:
            return "success"
        if state in self.failure_states or state in TERMINAL_STATES:
            return "failure"
        return None

    def _event(
        self, kind: str, state: str, message: str, stream: _LogStream | None = None
    ) -> TriggerEvent:
        cursor = stream.cursor if stream is not None else LogCursor(self.log_cursor)
        return TriggerEvent(
            {
                "status": kind,
                "app_handle": self.app_handle,
                "state": state,
                "message": message,
                "log_cursor": cursor.to_dict(),
                "log_lines": cursor.total,
            }
        )

    async def on_kill(self) -> None:
        """The deferred task was killed (marked failed, cleared, ...): cancel its app."""
        self.log.info("cancelling %s", self.app_handle)
        await self._use_connection()
        await asyncio.to_thread(_cancel, self._runner, self.app_handle)


def _cancel(make: Callable[[], Runner], handle: AppHandle) -> None:
    with make() as runner:
        runner.cancel(handle)


class _Checkpoint:
    """The trigger's log cursor, kept in its task instance's XCom ``shipyard_log_cursor``.

    Only a trigger that runs for a task instance (in a triggerer) has one. Saving is best
    effort: a failure is logged once and checkpointing stops (the event still carries the
    cursor; a restarted triggerer would then log again what was logged since the last save).
    """

    def __init__(self, ti: Any, handle: AppHandle) -> None:
        self._where = {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "map_index": ti.map_index if ti.map_index is not None else -1,
        }
        self._handle = handle
        self._saved: LogCursor | None = None
        self._broken = False

    @classmethod
    def of(cls, trigger: ShipyardJobTrigger) -> _Checkpoint | None:
        ti = getattr(trigger, "task_instance", None)
        if ti is None or not all(getattr(ti, a, None) for a in ("dag_id", "task_id", "run_id")):
            return None
        return cls(ti, trigger.app_handle)

    async def load(self) -> LogCursor:
        """The cursor an earlier run of this trigger saved (empty if none)."""
        try:
            value = await BaseXCom.aget_one(key=LOG_CURSOR_XCOM_KEY, **self._where)
        except Exception as e:
            log.debug("no log cursor checkpoint for %s: %s", self._handle, e)
            return LogCursor()
        if not isinstance(value, Mapping) or value.get("app_handle") != self._handle:
            return LogCursor()
        try:
            self._saved = LogCursor(value.get("cursor") or {})
        except ValueError:
            return LogCursor()
        return self._saved

    async def save(self, cursor: LogCursor, logger: Any) -> None:
        """Saves ``cursor`` unless it is what was saved last."""
        if self._broken or cursor == self._saved:
            return
        value = {"app_handle": self._handle, "cursor": cursor.to_dict()}
        try:
            await BaseXCom.aset(LOG_CURSOR_XCOM_KEY, value, **self._where)
        except Exception as e:
            self._broken = True
            logger.warning("cannot checkpoint the log cursor of %s: %s", self._handle, e)
            return
        self._saved = cursor.merged(None)


class _LogStream:
    """Logs an app's lines from the trigger's coroutine (so they reach the task's log).

    A :class:`~core.follow.LogFollower` thread reads the logs and hands the lines to the event
    loop; :meth:`pump` logs them in the trigger's own task (its logging context names the task
    instance) and checkpoints the cursor after each batch.
    """

    def __init__(
        self,
        handle: AppHandle,
        logger: Any,
        cursor: LogCursor,
        checkpoint: _Checkpoint | None,
        silence: SilenceWatch | None = None,
        make: Callable[[], Runner] = make_runner,
    ) -> None:
        self._handle = handle
        self._silence = silence
        self._make = make
        self._log = logger
        self.cursor = cursor
        self._checkpoint = checkpoint
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._follower = LogFollower(handle, self._hand_over, cursor, make)
        self.ended = False

    def _hand_over(self, item: Any) -> None:  # in the follower's thread
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._follower.stop()

    def start(self) -> None:
        self._follower.start()

    def stop(self) -> None:
        self._follower.stop()

    def _emit(self, index: int, line: LogLine) -> None:
        if self.cursor.accept(index, line):
            self._log.info("%s", line)
            if self._silence is not None:
                self._silence.saw(line)

    def hang(self, status: AppStatus) -> JobSilentError | None:
        """The error naming the replicas silent past ``max_silence`` (None without a limit,
        or if none is)."""
        return self._silence.hang(self._handle, status) if self._silence is not None else None

    def wake(self) -> None:
        """Makes :meth:`pump` return (thread-safe: the status poller calls it)."""
        self._hand_over(_WAKE)

    async def pump(self, seconds: float) -> None:
        """Logs the lines that come within ``seconds``; returns early when woken."""
        deadline = self._loop.time() + seconds
        woken = False
        while not woken:
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return
            try:
                item = await asyncio.wait_for(self._queue.get(), remaining)
            except TimeoutError:
                return
            while True:  # the whole batch at hand, then one checkpoint
                if item is _WAKE:
                    woken = True
                elif item is END:
                    self.ended = True
                else:
                    self._emit(*item)
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            await self.checkpoint()

    async def finish(self, timeout: float) -> None:
        """After the app ended: logs the last lines (at most ``timeout`` seconds of following),
        then whatever the follower missed, from the complete logs."""
        deadline = self._loop.time() + timeout
        while not self.ended and self._loop.time() < deadline:
            await self.pump(deadline - self._loop.time())
        if not self.ended:
            self._log.warning("logs of %s still streaming after %ss", self._handle, timeout)
        self.stop()
        try:
            missed = await asyncio.to_thread(self._lines_after, self.cursor.merged(None))
        except Exception as e:
            self._log.warning("cannot read the logs of %s: %s", self._handle, e)
            missed = []
        for index, line in missed:
            self._emit(index, line)
        await self.checkpoint()

    def _lines_after(self, cursor: LogCursor) -> list[tuple[int, LogLine]]:
        with self._make() as runner:
            return lines_after(runner, self._handle, cursor)

    async def checkpoint(self) -> None:
        if self._checkpoint is not None:
            await self._checkpoint.save(self.cursor, self._log)
