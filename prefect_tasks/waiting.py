"""Noticing, while a Prefect task waits on a job, that its run is going away: :class:`CancelWatch`
(the ``should_stop`` of the task's :class:`core.watch.JobWatch`).

The run goes away when Prefect's thread-pool task runner shuts down (a flow timeout, a flow that
failed or returned, SIGTERM to the flow process), when the flow's own timeout passes, or when the
flow run (or a parent) is cancelled through the API. The waiting itself, the logs and the
transient-error budget are the watch's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from prefect_tasks.jobs import interrupted

log = logging.getLogger(__name__)


def _flow_deadline(fctx: Any) -> tuple[float, float] | None:
    """``(monotonic deadline, timeout)`` of the flow run attempt in ``fctx``, if it has a timeout.

    Prefect enforces a flow timeout by raising in the flow's thread, which does not reach a task
    started with ``.submit()``, nor the flow itself while it blocks on such a task's result in a
    thread other than the main one. The task enforces it itself from this deadline.
    """
    timeout = getattr(getattr(fctx, "flow", None), "timeout_seconds", None)
    state = getattr(getattr(fctx, "flow_run", None), "state", None)
    started = getattr(state, "timestamp", None)
    if not timeout or state is None or not state.is_running() or started is None:
        return None
    elapsed = (datetime.now(UTC) - started).total_seconds()
    return time.monotonic() + float(timeout) - max(elapsed, 0.0), float(timeout)


def task_cancel_event(task_runner: Any, task_run_id: Any) -> threading.Event | None:
    """The cancel event Prefect's ``ThreadPoolTaskRunner`` made for a ``.submit()``-ed task run
    (set by its ``cancel_all()``), or None.

    The one place that reads a library's private state: Prefect 3.7 hands the event only to its
    own task engine (``TaskRunEngine.is_cancelled``) and offers no public way to it, and without
    it a task started with ``.submit()`` would not notice its flow's task runner shutting down
    (the flow failed or returned while the task ran, or the flow process got SIGTERM) and would
    leave its job running. Any other task runner (or a Prefect without the attribute) gets None.
    """
    events = getattr(task_runner, "_cancel_events", None)
    event = events.get(task_run_id) if isinstance(events, Mapping) else None
    return event if isinstance(event, threading.Event) else None


class CancelWatch:
    """Tells a waiting task that its run is going away, so it must stop and cancel its job.

    Four signals, the first three captured from the Prefect context of the task when it is
    created:

    * the cancel event Prefect's ``ThreadPoolTaskRunner`` gives every submitted task and sets in
      ``cancel_all()``: when the flow's task runner shuts down (flow timeout, flow failed or
      returned while the task ran) and when the flow process got SIGTERM.
    * the flow's own ``timeout_seconds``, counted from the start of the flow run attempt
      (see :func:`_flow_deadline`).
    * the state of the flow run and of its parent flow runs in the API, every ``check_interval``
      seconds: a flow run that was cancelled (``Cancelling``/``Cancelled``) or already ended.
    * the async twin running the wait in a thread being interrupted
      (:func:`prefect_tasks.jobs.interrupted`).

    Tasks that run inline (not ``.submit()``-ed) get these interruptions as exceptions raised in
    their own thread instead; the API check covers a cancelled flow run for them too.
    """

    def __init__(self, check_interval: float | None = 5.0) -> None:
        from prefect.context import FlowRunContext, TaskRunContext

        self.check_interval = check_interval
        self.flow_run_id: Any = None
        self.event: threading.Event | None = None
        self._flow_run_ids: list[Any] | None = None
        tctx = TaskRunContext.get()
        fctx = FlowRunContext.get()
        if tctx is not None:
            self.flow_run_id = tctx.task_run.flow_run_id
            self.event = task_cancel_event(getattr(fctx, "task_runner", None), tctx.task_run.id)
        elif fctx is not None and fctx.flow_run is not None:
            self.flow_run_id = fctx.flow_run.id
        self.flow_deadline = _flow_deadline(fctx) if fctx is not None else None
        self._next_check = time.monotonic() + (check_interval or 0)

    def reason(self) -> str | None:
        """Why to stop now, or None to keep waiting."""
        if self.event is not None and self.event.is_set():
            return "the flow's task runner shut down (flow timed out, ended or got SIGTERM)"
        if self.flow_deadline is not None and time.monotonic() >= self.flow_deadline[0]:
            return f"the flow run exceeded its timeout of {self.flow_deadline[1]}s"
        return interrupted() or self._api_reason()

    def _ancestors(self, client: Any) -> list[Any]:
        """The flow run and the flow runs above it (a subflow stops when its parent is cancelled)."""
        ids = [self.flow_run_id]
        flow_run = client.read_flow_run(self.flow_run_id)
        while flow_run.parent_task_run_id is not None and len(ids) < 20:
            parent_task = client.read_task_run(flow_run.parent_task_run_id)
            if parent_task.flow_run_id is None:
                break
            flow_run = client.read_flow_run(parent_task.flow_run_id)
            ids.append(flow_run.id)
        return ids

    def _api_reason(self) -> str | None:
        """Why to stop, from the state of the flow run and its parents in the API (read at most
        every ``check_interval`` seconds)."""
        now = time.monotonic()
        if self.check_interval is None or self.flow_run_id is None or now < self._next_check:
            return None
        self._next_check = now + self.check_interval
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        try:
            with get_client(sync_client=True) as client:
                if self._flow_run_ids is None:
                    self._flow_run_ids = self._ancestors(client)
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=self._flow_run_ids))
                )
        except Exception as e:  # the API being unreachable is no reason to cancel a job
            log.debug("cannot read flow run %s: %s", self.flow_run_id, e)
            return None
        for run in runs:
            state = run.state
            if state is not None and (state.is_cancelling() or state.is_final()):
                return f"flow run {run.name!r} is {state.name}"
        return None
