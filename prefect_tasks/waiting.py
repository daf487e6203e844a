"""Waiting on Shipyard jobs from Prefect tasks, thin over :mod:`core.runner`.

* :class:`CancelWatch` notices that the run is going away while a task waits on a job: Prefect's
  thread-pool task runner shutting down (a flow timeout, a flow that failed or returned, SIGTERM to
  the flow process), the flow's own timeout passing, or the flow run (or a parent) being cancelled
  through the API.
* :class:`LogForwarder` sends a job's log lines to a logger, one record per line, as they arrive
  (thin over :class:`core.follow.LogFollower`).
* the status of every job waited on in the process is polled by :func:`core.polling.status_poller`
  (one ``status_many`` call per round; transient backend errors retried within the budget of
  :mod:`core.transient`).
* :func:`wait` follows the job to a final state and cancels it when it is interrupted (task or
  flow timeout, cancellation, SIGTERM, Ctrl-C); :func:`follow` waits for a log forwarder the same
  way. Both are sync: an async twin runs them in a thread (:func:`prefect_tasks.jobs.async_twin`).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from core.follow import DRAIN_TIMEOUT, END, LogFollower
from core.polling import status_poller
from core.runner import Runner
from core.silence import SilenceWatch
from core.specs import AppHandle, AppStatus
from prefect_tasks.jobs import (
    JobCancelledError,
    cancel_quietly,
    interrupted,
    is_interrupt,
    untrack,
)

log = logging.getLogger(__name__)

#: longest uninterrupted sleep while waiting: bounds how late an injected exception (Prefect's
#: timeout in a worker thread), a set cancel event or an interrupted async twin is noticed
_NAP = 0.2
#: how long a finished job's log forwarder gets to deliver its last lines
LOG_DRAIN_TIMEOUT = DRAIN_TIMEOUT


# --------------------------------------------------------------------------------------------
# noticing that the run goes away
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# logs
# --------------------------------------------------------------------------------------------


class LogForwarder:
    """Sends a job's log lines to ``emit("role/k line")``, one call per line, as they arrive.

    Thin over :class:`core.follow.LogFollower` (which waits for a queued job's replicas and
    follows every replica, or those of ``role`` / ``replica``, until the job is final), in the
    follower's thread. Keeps the last ``keep`` lines in :attr:`lines`; an error reading the
    logs is kept in :attr:`error`.
    """

    def __init__(
        self,
        runner: Runner,
        handle: AppHandle,
        emit: Callable[[str], None],
        *,
        role: str | None = None,
        replica: int | None = None,
        regex: str | None = None,
        should_tail: bool = True,
        keep: int = 0,
        silence: SilenceWatch | None = None,
    ) -> None:
        self.handle = handle
        self.emit = emit
        self.silence = silence
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._follower = LogFollower(
            handle,
            self._take,
            runner_factory=lambda: runner,
            close_runner=False,
            role=role,
            replica=replica,
            regex=regex,
            should_tail=should_tail,
        )

    def _take(self, item: Any) -> None:
        if item is END or self._follower.stopped:
            return
        text = str(item[1])
        self.emit(text)
        self.lines.append(text)
        if self.silence is not None:
            self.silence.saw(item[1])

    @property
    def error(self) -> BaseException | None:
        """Why reading the logs failed, if it did."""
        return self._follower.error

    def start(self) -> None:
        """Starts following."""
        self._follower.start()

    def is_alive(self) -> bool:
        """Whether it still follows."""
        return self._follower.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Waits up to ``timeout`` seconds for the last line."""
        self._follower.join(timeout)

    def cancel(self) -> None:
        """Stops at once (no more lines are emitted)."""
        self._follower.stop()


# --------------------------------------------------------------------------------------------
# waiting
# --------------------------------------------------------------------------------------------


def wait(
    runner: Runner,
    handle: AppHandle,
    *,
    timeout: float | None,
    poll_interval: float,
    watch: CancelWatch,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    cancel_on_timeout: bool = True,
    silence: SilenceWatch | None = None,
) -> AppStatus | None:
    """Follows ``handle`` (through :func:`core.polling.status_poller`) until it is final;
    returns its status (None if the app is unknown).

    Interrupted (see :func:`~prefect_tasks.jobs.is_interrupt`) or told to stop by ``watch``, it
    cancels the job and raises. Transient errors reading the status are retried (logged) within
    the retry budget of :mod:`core.transient`; past it, or for another error, the wait fails and
    leaves the job alone, so that a retry can pick it up again.

    Raises:
        TimeoutError: after ``timeout`` seconds (the job is cancelled if ``cancel_on_timeout``).
        JobCancelledError: when ``watch`` says the run is going away (the job is cancelled).
        core.silence.JobSilentError: replicas printed nothing for ``silence.max_silence``
            seconds (the job is cancelled; the message names them, with their last lines).
    """
    deadline = time.monotonic() + (math.inf if timeout is None else timeout)
    try:
        with status_poller().watch(handle, poll_interval, logger, runner) as polled:
            while True:
                read, status = polled.next(_NAP)
                if read and (status is None or status.is_terminal()):
                    untrack(handle)
                    return status
                if time.monotonic() >= deadline:
                    if not cancel_on_timeout:
                        raise TimeoutError(f"app {handle} still running after {timeout}s")
                    cancel_quietly(runner, handle, logger, f"wait timeout of {timeout}s")
                    raise TimeoutError(f"app {handle} still running after {timeout}s; cancelled it")
                reason = watch.reason()
                if reason:
                    cancel_quietly(runner, handle, logger, reason)
                    raise JobCancelledError(handle, reason)
                hang = silence.hang(handle, status) if read and silence is not None else None
                if hang is not None:
                    cancel_quietly(runner, handle, logger, "max_silence")
                    raise hang
    except BaseException as e:
        if is_interrupt(e):
            cancel_quietly(runner, handle, logger, f"interrupted: {e!r}")
        raise


def follow(forwarder: LogForwarder, watch: CancelWatch, timeout: float | None) -> str | None:
    """Waits for ``forwarder`` to finish in short naps; returns why it stopped early, if it did."""
    deadline = time.monotonic() + (math.inf if timeout is None else timeout)
    while forwarder.is_alive():
        reason = watch.reason()
        if reason:
            return reason
        if time.monotonic() >= deadline:
            return f"timeout of {timeout}s"
        forwarder.join(_NAP)
    return None
