"""ShipyardJobTrigger: waits for a Shipyard app in the triggerer, off the worker.

With ``stream_logs`` the trigger logs the app's lines from its own coroutine, so the triggerer
routes them to the deferred task's log. Where it starts and stops is a
:class:`core.watch.LogCursor` (lines already in the task log, per replica): the operator hands
one over in the trigger's kwargs, the trigger checkpoints it in the task instance's XCom
``shipyard_log_cursor`` as it goes (a restarted triggerer resumes from there instead of logging
the job again) and returns it in its event, so the resumed task adds exactly the lines after it.

The waiting is a :class:`core.watch.JobWatch` (its async face, on the triggerer's event loop):
every trigger of one triggerer process shares the process's status poller, so their handles are
described together, one backend call per scheduler per poll interval however many jobs are being
waited on, and a transient backend failure is retried within the budget (Airflow's
``[shipyard] retry_budget``, else :mod:`core.transient`'s) before the trigger fires an ``error``
event.
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
from airflow_provider.config import retry_budget
from airflow_provider.hooks.shipyard import connection_settings, docker_engine_from_connection
from core.clusters import register_cluster
from core.errors import JobSilentError
from core.reports import usage_by_replica
from core.runner import Runner
from core.specs import AppHandle, parse_app_handle
from core.watch import CursorStore, JobWatch, LogCursor, check_max_silence

if TYPE_CHECKING:
    from core.schedulers.docker_scheduler import DockerEngine

log = logging.getLogger(__name__)

__all__ = ["LOG_CURSOR_XCOM_KEY", "ShipyardJobTrigger"]

#: the XCom (of the deferred task instance) where the trigger checkpoints its log cursor
LOG_CURSOR_XCOM_KEY = "shipyard_log_cursor"


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
            ``silent`` lists the silent replicas (see :mod:`core.watch.silence`)

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
        runner = self._runner()
        watch = JobWatch(
            runner,
            self.app_handle,
            poll_interval=self.poll_interval,
            logger=self.log,
            until=lambda status: self._kind(status.state.name) is not None,
            logs=self.stream_logs,
            on_line=lambda line: self.log.info("%s", line),
            cursor=_XComCursorStore(self, self.log_cursor),
            max_silence=self.max_silence,
            budget=retry_budget(),
        )
        try:
            end = await watch.run_async()
        except JobSilentError as e:  # (the watch cancelled the app)
            event = self._event("failure", "CANCELLED", str(e), watch.cursor)
            event.payload["silent"] = e.silent
            yield event
            return
        except Exception as e:
            message = f"cannot describe {self.app_handle}: {e}"
            yield self._event("error", "UNKNOWN", message, watch.cursor)
            return
        finally:
            await asyncio.to_thread(runner.close)
        if end.status is None:
            message = f"app {self.app_handle} is unknown to its scheduler"
            yield self._event("error", "UNKNOWN", message, end.cursor)
            return
        state = end.status.state.name
        event = self._event(
            self._kind(state) or "failure", state, f"app {self.app_handle} is {state}", end.cursor
        )
        event.payload["usage"] = usage_by_replica(end.status.roles)
        yield event

    def _kind(self, state: str) -> str | None:
        """The event a state fires (``success``/``failure``), None to keep waiting."""
        if state in self.target_states:
            return "success"
        if state in self.failure_states or state in TERMINAL_STATES:
            return "failure"
        return None

    def _event(self, kind: str, state: str, message: str, cursor: LogCursor) -> TriggerEvent:
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


class _XComCursorStore(CursorStore):
    """The trigger's log cursor: the one its kwargs hand over (lines the task logged before
    it deferred), moved on by the checkpoint kept in its task instance's XCom
    ``shipyard_log_cursor``, so a restarted triggerer resumes from there instead of logging the
    job again.

    Only a trigger that runs for a task instance (in a triggerer) has a checkpoint. Saving is
    best effort (the watch logs a failure once and stops saving; the event still carries the
    cursor). The checkpoint is kept once the job ended: the resumed task takes the cursor from
    the event, and Airflow clears the XCom with the task instance."""

    def __init__(self, trigger: ShipyardJobTrigger, start: Mapping[str, int]) -> None:
        self._start = LogCursor(start)
        self._handle = trigger.app_handle
        ti = getattr(trigger, "task_instance", None)
        self._where: dict[str, Any] | None = None
        if ti is not None and all(getattr(ti, a, None) for a in ("dag_id", "task_id", "run_id")):
            self._where = {
                "dag_id": ti.dag_id,
                "task_id": ti.task_id,
                "run_id": ti.run_id,
                "map_index": ti.map_index if ti.map_index is not None else -1,
            }

    async def aload(self) -> LogCursor:
        if self._where is None:
            return self._start.copy()
        try:
            value = await BaseXCom.aget_one(key=LOG_CURSOR_XCOM_KEY, **self._where)
        except Exception as e:
            log.debug("no log cursor checkpoint for %s: %s", self._handle, e)
            return self._start.copy()
        if not isinstance(value, Mapping) or value.get("app_handle") != self._handle:
            return self._start.copy()
        try:
            return self._start.merged(LogCursor(value.get("cursor") or {}))
        except ValueError:
            return self._start.copy()

    async def asave(self, cursor: LogCursor) -> None:
        if self._where is not None:
            value = {"app_handle": self._handle, "cursor": cursor.to_dict()}
            await BaseXCom.aset(LOG_CURSOR_XCOM_KEY, value, **self._where)

    async def aclear(self) -> None:
        return None
