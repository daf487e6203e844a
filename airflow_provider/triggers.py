"""ShipyardJobTrigger: waits for a Shipyard app in the triggerer, off the worker.

Every trigger of one triggerer process (one event loop) shares a :class:`_StatusPoller`: the
triggers wake on the same clock ticks and their handles are described together with
:meth:`core.runner.Runner.status_many`, one backend call per scheduler per tick however many
jobs are being waited on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.sdk import BaseHook
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider._common import TERMINAL_STATES, make_runner, state_names
from airflow_provider.hooks.shipyard import connection_settings
from core.clusters import register_cluster
from core.runner import LogLine, Runner
from core.specs import AppHandle, AppStatus, parse_app_handle

log = logging.getLogger(__name__)

__all__ = ["ShipyardJobTrigger"]

# how long the trigger waits for the last log lines after the app ended
_LOG_DRAIN_TIMEOUT = 30.0
# consecutive failed status calls tolerated before the trigger gives up
_MAX_STATUS_ERRORS = 5
# triggers that wake within this window share one status_many call
_BATCH_WINDOW = 0.05


class _StatusPoller:
    """Answers status requests of many triggers with batched ``status_many`` calls."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StatusPoller] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self) -> None:
        self._runner: Runner | None = None
        self._pending: dict[AppHandle, list[asyncio.Future[AppStatus | None]]] = {}
        self._flush: asyncio.Task[None] | None = None
        #: number of backend batches made (for tests and metrics)
        self.batches = 0

    @classmethod
    def for_running_loop(cls) -> _StatusPoller:
        loop = asyncio.get_running_loop()
        poller = cls._by_loop.get(loop)
        if poller is None:
            poller = cls._by_loop[loop] = cls()
        return poller

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = make_runner()
        return self._runner

    async def status(self, handle: AppHandle) -> AppStatus | None:
        """The app's status, described together with every other request of this instant."""
        fut: asyncio.Future[AppStatus | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(handle, []).append(fut)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._flush_soon())
        return await fut

    async def _flush_soon(self) -> None:
        await asyncio.sleep(_BATCH_WINDOW)
        pending, self._pending = self._pending, {}
        if not pending:
            return
        self.batches += 1
        try:
            statuses = await asyncio.to_thread(self.runner.status_many, list(pending))
        except Exception as e:
            for futs in pending.values():
                for fut in futs:
                    if not fut.done():
                        fut.set_exception(e)
            return
        for handle, futs in pending.items():
            for fut in futs:
                if not fut.done():
                    fut.set_result(statuses.get(handle))


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

    The event payload: ``status`` (``success``, ``failure`` or ``error``), ``app_handle``,
    ``state`` (the app state name), ``message`` and ``log_lines`` (how many were logged).
    """

    def __init__(
        self,
        app_handle: str,
        poll_interval: float = 5.0,
        target_states: Sequence[str] | None = None,
        failure_states: Sequence[str] | None = None,
        stream_logs: bool = False,
        shipyard_conn_id: str | None = None,
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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "app_handle": self.app_handle,
                "poll_interval": self.poll_interval,
                "target_states": list(self.target_states),
                "failure_states": list(self.failure_states),
                "stream_logs": self.stream_logs,
                "shipyard_conn_id": self.shipyard_conn_id,
            },
        )

    async def _use_connection(self) -> None:
        if self.shipyard_conn_id:
            conn = await BaseHook.aget_connection(self.shipyard_conn_id)
            _, _, cluster = connection_settings(conn)
            if cluster is not None:
                register_cluster(cluster)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self._use_connection()
        poller = _StatusPoller.for_running_loop()
        follower = _LogFollower(self.app_handle, self.log) if self.stream_logs else None
        try:
            if follower is not None:
                follower.start()
            errors = 0
            while True:
                try:
                    status = await poller.status(self.app_handle)
                    errors = 0
                except Exception as e:
                    errors += 1
                    if errors >= _MAX_STATUS_ERRORS:
                        yield self._event(
                            "error", "UNKNOWN", f"cannot describe {self.app_handle}: {e}"
                        )
                        return
                    self.log.warning(
                        "cannot describe %s (%d/%d): %s",
                        self.app_handle,
                        errors,
                        _MAX_STATUS_ERRORS,
                        e,
                    )
                    await asyncio.sleep(self.poll_interval)
                    continue
                if status is None:
                    yield self._event(
                        "error", "UNKNOWN", f"app {self.app_handle} is unknown to its scheduler"
                    )
                    return
                state = status.state.name
                if state in self.target_states:
                    kind = "success"
                elif state in self.failure_states or state in TERMINAL_STATES:
                    kind = "failure"
                else:
                    await asyncio.sleep(_until_next_tick(self.poll_interval))
                    continue
                if follower is not None and state in TERMINAL_STATES:
                    await follower.drain(_LOG_DRAIN_TIMEOUT)
                    await follower.catch_up()
                yield self._event(kind, state, f"app {self.app_handle} is {state}", follower)
                return
        finally:
            if follower is not None:
                follower.stop()

    def _event(
        self, kind: str, state: str, message: str, follower: _LogFollower | None = None
    ) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": kind,
                "app_handle": self.app_handle,
                "state": state,
                "message": message,
                "log_lines": follower.count if follower else 0,
            }
        )

    async def on_kill(self) -> None:
        """The deferred task was killed (marked failed, cleared, ...): cancel its app."""
        self.log.info("cancelling %s", self.app_handle)
        await self._use_connection()
        await asyncio.to_thread(_cancel, self.app_handle)


def _cancel(handle: AppHandle) -> None:
    with make_runner() as runner:
        runner.cancel(handle)


def _until_next_tick(interval: float) -> float:
    """Seconds until the next multiple of ``interval`` on the monotonic clock.

    Triggers with the same interval wake together, so the poller batches their status calls.
    """
    return interval - (time.monotonic() % interval)


class _LogFollower:
    """Follows an app's logs in a daemon thread and logs each line on the event loop."""

    def __init__(self, handle: AppHandle, logger: Any) -> None:
        self._handle = handle
        self._log = logger
        self._stop = threading.Event()
        self._done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._per_replica: dict[tuple[str, int], int] = {}
        self.count = 0

    def start(self) -> None:
        # A plain daemon thread, not the loop's executor: asyncio.run() joins executor threads at
        # shutdown and a log tail must never hold the loop open.
        threading.Thread(target=self._follow, daemon=True, name=f"logs-{self._handle}").start()

    def _emit(self, line: LogLine) -> None:
        key = (line.role, line.replica)
        self._per_replica[key] = self._per_replica.get(key, 0) + 1
        self.count += 1
        self._log.info("%s", line)

    def _finish(self) -> None:
        self._done.set()

    def _follow(self) -> None:
        runner = make_runner()
        try:
            for line in runner.stream_logs(self._handle, should_tail=True):
                if self._stop.is_set():
                    break
                self._call(self._emit, line)
        except Exception as e:
            self._call(self._log.warning, f"cannot follow logs of {self._handle}: {e}")
        finally:
            runner.close()
            self._call(self._finish)

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    async def drain(self, timeout: float) -> None:
        """Waits (at most ``timeout`` seconds) until every line was logged."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except TimeoutError:
            self._log.warning("logs of %s still streaming after %ss", self._handle, timeout)

    async def catch_up(self) -> None:
        """Logs the lines the follower missed (e.g. a replica whose log appeared late)."""
        self.stop()
        await asyncio.sleep(0)  # run the emits the follower thread already scheduled
        missed = await asyncio.to_thread(self._missed, dict(self._per_replica))
        for line in missed:
            self._emit(line)

    def _missed(self, seen: dict[tuple[str, int], int]) -> list[LogLine]:
        out: list[LogLine] = []
        with make_runner() as runner:
            try:
                for role, k in runner.replicas(self._handle):
                    for i, text in enumerate(runner.log_lines(self._handle, role, k)):
                        if i >= seen.get((role, k), 0):
                            out.append(LogLine(role, k, text))
            except Exception as e:
                self._log.warning("cannot read the logs of %s: %s", self._handle, e)
        return out

    def stop(self) -> None:
        self._stop.set()
