"""Waiting on Shipyard jobs from Prefect tasks, thin over :mod:`core.runner`.

* :class:`CancelWatch` notices that the run is going away while a task waits on a job: Prefect's
  thread-pool task runner shutting down (a flow timeout, a flow that failed or returned, SIGTERM to
  the flow process), the flow's own timeout passing, or the flow run (or a parent) being cancelled
  through the API.
* :class:`LogForwarder` sends a job's log lines to a logger, one record per line, as they arrive.
* :class:`StatusHub` polls the status of every job waited on in the process in one loop (one
  ``status_many`` call per round).
* :func:`wait_sync` / :func:`wait_async` follow the job to a final state and cancel it when they
  are interrupted (task or flow timeout, cancellation, SIGTERM, Ctrl-C); :func:`follow_sync` /
  :func:`follow_async` wait for a log forwarder the same way.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from core.runner import LogLine, Runner, get_runner
from core.specs import AppHandle, AppStatus
from prefect_tasks.jobs import JobCancelledError, cancel_quietly, is_interrupt, untrack

log = logging.getLogger(__name__)

#: longest uninterrupted sleep while waiting: bounds how late an injected exception (Prefect's
#: timeout in a worker thread) or a set cancel event is noticed
_NAP = 0.2
#: consecutive failed status polls tolerated (a backend hiccup) before the wait fails
STATUS_ERRORS_TOLERATED = 3
#: how long a finished job's log forwarder gets to deliver its last lines
LOG_DRAIN_TIMEOUT = 30.0


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

    Three signals, captured from the Prefect context of the task when it is created:

    * the cancel event Prefect's ``ThreadPoolTaskRunner`` gives every submitted task and sets in
      ``cancel_all()``: when the flow's task runner shuts down (flow timeout, flow failed or
      returned while the task ran) and when the flow process got SIGTERM. Checked every nap.
    * the flow's own ``timeout_seconds``, counted from the start of the flow run attempt
      (see :func:`_flow_deadline`).
    * the state of the flow run and of its parent flow runs in the API, every ``check_interval``
      seconds: a flow run that was cancelled (``Cancelling``/``Cancelled``) or already ended.

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

    def local_reason(self) -> str | None:
        """Why to stop, from in-process signals only (cheap: call it often)."""
        if self.event is not None and self.event.is_set():
            return "the flow's task runner shut down (flow timed out, ended or got SIGTERM)"
        if self.flow_deadline is not None and time.monotonic() >= self.flow_deadline[0]:
            return f"the flow run exceeded its timeout of {self.flow_deadline[1]}s"
        return None

    def api_due(self) -> bool:
        """True when the flow run's state should be read from the API again."""
        return (
            self.flow_run_id is not None
            and self.check_interval is not None
            and time.monotonic() >= self._next_check
        )

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

    def api_reason(self) -> str | None:
        """Why to stop, from the state of the flow run and its parents in the API."""
        assert self.check_interval is not None
        self._next_check = time.monotonic() + self.check_interval
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

    def reason(self) -> str | None:
        """Why to stop now, or None to keep waiting."""
        return self.local_reason() or (self.api_reason() if self.api_due() else None)

    def nap(self, seconds: float) -> None:
        """Sleeps up to ``seconds`` in short slices, waking early when the cancel event is set."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0 or self.local_reason():
                return
            if self.event is not None:
                self.event.wait(min(_NAP, left))
            else:
                time.sleep(min(_NAP, left))


# --------------------------------------------------------------------------------------------
# logs
# --------------------------------------------------------------------------------------------


class LogForwarder(threading.Thread):
    """Follows a job's logs in a daemon thread, calling ``emit("role/k line")`` once per line.

    Waits for the job's replicas to be known (a pending job may have none yet), then follows
    every replica (or those of ``role`` / ``replica``) until the job is final. Keeps the last
    ``keep`` lines in :attr:`lines`. An error reading the logs is kept in :attr:`error`.
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
    ) -> None:
        super().__init__(daemon=True, name=f"shipyard-logs {handle}")
        self.runner = runner
        self.handle = handle
        self.emit = emit
        self.role = role
        self.replica = replica
        self.regex = regex
        self.should_tail = should_tail
        self.lines: collections.deque[str] = collections.deque(maxlen=keep or None)
        self.keep = keep
        self.count = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def _wait_for_replicas(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                if self.runner.replicas(self.handle):
                    return
                status = self.runner.status(self.handle)
                if status is None or status.is_terminal():
                    return
            except Exception as e:  # a transient backend error must not lose the whole log
                failures += 1
                if failures >= 5:
                    raise
                log.debug("describing %s failed (%s); retrying", self.handle, e)
            self.stopping.wait(_NAP)

    def _lines(self) -> Any:
        if self.role is not None and self.replica is not None:
            return (
                LogLine(self.role, self.replica, line)
                for line in self.runner.log_lines(
                    self.handle,
                    self.role,
                    self.replica,
                    regex=self.regex,
                    should_tail=self.should_tail,
                )
            )
        return self.runner.stream_logs(self.handle, should_tail=self.should_tail, regex=self.regex)

    def run(self) -> None:
        try:
            if self.should_tail:
                self._wait_for_replicas()
            for item in self._lines():
                if self.stopping.is_set():
                    return
                if self.role is not None and item.role != self.role:
                    continue
                if self.replica is not None and item.replica != self.replica:
                    continue
                text = str(item)
                self.emit(text)
                self.count += 1
                if self.keep:
                    self.lines.append(text)
        except Exception as e:
            self.error = e
            log.warning("reading the logs of %s failed: %s", self.handle, e)

    def stop(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds for the last lines, then stops following."""
        if self.is_alive():
            self.join(timeout)
        self.stopping.set()


# --------------------------------------------------------------------------------------------
# waiting
# --------------------------------------------------------------------------------------------


class StatusHub:
    """One status poll loop per process for every job a task waits on.

    Each round reads the status of all watched handles with one ``Runner.status_many`` call (one
    backend call per scheduler and session where the backend allows it: one ``squeue`` for every
    Slurm job), so N tasks waiting at once cost one poll per round, not N. Rounds start fast
    after a new handle is watched and back off to the smallest ``poll_interval`` of the waiters.
    The loop runs in a daemon thread that ends when nothing is watched.
    """

    def __init__(self, runner_factory: Callable[[], Runner] | None = None) -> None:
        self._runner_factory = runner_factory
        self._cond = threading.Condition()
        self._watchers: dict[AppHandle, list[float]] = {}
        self._results: dict[AppHandle, tuple[int, Any]] = {}
        self._round = 0
        self._delay = 0.05
        self._thread: threading.Thread | None = None

    def watch(self, handle: AppHandle, poll_interval: float) -> _Subscription:
        """Starts watching ``handle``; use the result as a context manager."""
        with self._cond:
            self._watchers.setdefault(handle, []).append(poll_interval)
            self._delay = 0.05
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="shipyard-status-hub"
                )
                self._thread.start()
            self._cond.notify_all()
        return _Subscription(self, handle, poll_interval)

    def _unwatch(self, handle: AppHandle, poll_interval: float) -> None:
        with self._cond:
            intervals = self._watchers.get(handle, [])
            if poll_interval in intervals:
                intervals.remove(poll_interval)
            if not intervals:
                self._watchers.pop(handle, None)
                self._results.pop(handle, None)

    def next(self, handle: AppHandle, seen: int, timeout: float) -> tuple[int, Any]:
        """``(round, outcome)`` of the first round after ``seen``, waiting up to ``timeout``
        seconds; ``(seen, None)`` if there was none. ``outcome`` is an ``AppStatus``, None (the
        app is unknown) or the exception the poll raised."""
        with self._cond:
            result = self._results.get(handle)
            if result is None or result[0] <= seen:
                self._cond.wait(timeout)
                result = self._results.get(handle)
            if result is None or result[0] <= seen:
                return seen, None
            return result

    @staticmethod
    def _poll(runner: Runner, handles: list[AppHandle]) -> dict[AppHandle, Any]:
        """Statuses of ``handles`` in one call; if that fails, one by one, so that one bad
        handle (or backend) only fails its own waiters."""
        try:
            return dict(runner.status_many(handles))
        except Exception as e:
            if len(handles) == 1:
                return {handles[0]: e}
        outcome: dict[AppHandle, Any] = {}
        for handle in handles:
            try:
                outcome[handle] = runner.status(handle)
            except Exception as e:
                outcome[handle] = e
        return outcome

    def _loop(self) -> None:
        runner = self._runner_factory() if self._runner_factory else None
        try:
            while True:
                with self._cond:
                    if not self._watchers:
                        self._cond.wait(5.0)
                        if not self._watchers:
                            self._thread = None
                            return
                    handles = list(self._watchers)
                if runner is None:
                    runner = get_runner()
                outcome = self._poll(runner, handles)
                with self._cond:
                    self._round += 1
                    for handle in handles:
                        if handle in self._watchers:
                            self._results[handle] = (self._round, outcome.get(handle))
                    self._cond.notify_all()
                    delay = self._delay
                    fastest = min((min(v) for v in self._watchers.values()), default=delay)
                    self._delay = min(delay * 2, fastest)
                    self._cond.wait(delay)
        except BaseException:  # never leave waiters hanging on a dead loop
            log.exception("the status poll loop failed")
            with self._cond:
                self._thread = None
            raise
        finally:
            if runner is not None:
                runner.close()


class _Subscription:
    """A waiter's view of :class:`StatusHub` for one handle, tolerating polling errors."""

    def __init__(self, hub: StatusHub, handle: AppHandle, poll_interval: float) -> None:
        self.hub = hub
        self.handle = handle
        self.poll_interval = poll_interval
        self.seen = 0
        self.errors = 0

    def __enter__(self) -> _Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.hub._unwatch(self.handle, self.poll_interval)

    def next(
        self, timeout: float, logger: logging.Logger | logging.LoggerAdapter[Any]
    ) -> tuple[bool, AppStatus | None]:
        """``(read, status)`` of the next round within ``timeout`` seconds. ``read`` is False
        when no round came or its poll failed (up to :data:`STATUS_ERRORS_TOLERATED` failures in
        a row are logged, one more is raised)."""
        seen, outcome = self.hub.next(self.handle, self.seen, timeout)
        if seen == self.seen:
            return False, None  # no new round within the timeout
        self.seen = seen
        if isinstance(outcome, BaseException):
            self.errors += 1
            if self.errors > STATUS_ERRORS_TOLERATED:
                raise outcome
            logger.warning(
                "reading the status of %s failed (%d of %d tolerated): %s",
                self.handle,
                self.errors,
                STATUS_ERRORS_TOLERATED,
                outcome,
            )
            return False, None
        self.errors = 0
        return True, outcome


#: the process-wide hub every waiting task shares
HUB = StatusHub()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _timed_out(
    runner: Runner,
    handle: AppHandle,
    timeout: float | None,
    cancel_on_timeout: bool,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> TimeoutError:
    msg = f"app {handle} still running after {timeout}s"
    if cancel_on_timeout:
        cancel_quietly(runner, handle, logger, f"wait timeout of {timeout}s")
        msg += "; cancelled it"
    return TimeoutError(msg)


def _stop_reason(
    watch: CancelWatch, deadline: float | None, timeout: float | None
) -> tuple[str | None, bool]:
    """``(reason, timed_out)``: why a wait must stop now (local signals and the deadline)."""
    reason = watch.local_reason()
    if reason:
        return reason, False
    if deadline is not None and time.monotonic() >= deadline:
        return f"timeout of {timeout}s", True
    return None, False


def wait_sync(
    runner: Runner,
    handle: AppHandle,
    *,
    timeout: float | None,
    poll_interval: float,
    watch: CancelWatch,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    cancel_on_timeout: bool = True,
) -> AppStatus | None:
    """Follows ``handle`` (through :data:`HUB`) until it is final; returns its status (None if
    the app is unknown).

    Interrupted (see :func:`is_interrupt`) or told to stop by ``watch``, it cancels the job and
    raises. A few consecutive errors reading the status are tolerated (logged); more propagate
    and leave the job alone, so that a retry can pick it up again.

    Raises:
        TimeoutError: after ``timeout`` seconds (the job is cancelled if ``cancel_on_timeout``).
        JobCancelledError: when ``watch`` says the run is going away (the job is cancelled).
    """
    deadline = _deadline(timeout)
    try:
        with HUB.watch(handle, poll_interval) as sub:
            while True:
                read, status = sub.next(_NAP, logger)
                if read and (status is None or status.is_terminal()):
                    untrack(handle)
                    return status
                reason, timed_out = _stop_reason(watch, deadline, timeout)
                if timed_out:
                    raise _timed_out(runner, handle, timeout, cancel_on_timeout, logger)
                if reason is None and watch.api_due():
                    reason = watch.api_reason()
                if reason:
                    cancel_quietly(runner, handle, logger, reason)
                    raise JobCancelledError(handle, reason)
    except BaseException as e:
        if is_interrupt(e):
            cancel_quietly(runner, handle, logger, f"interrupted: {e!r}")
        raise


async def wait_async(
    runner: Runner,
    handle: AppHandle,
    *,
    timeout: float | None,
    poll_interval: float,
    watch: CancelWatch,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    cancel_on_timeout: bool = True,
) -> AppStatus | None:
    """:func:`wait_sync` for async code: blocking calls run in threads.

    Cancellation of the awaiting task (a Prefect timeout, a cancelled flow) cancels the job.
    """
    deadline = _deadline(timeout)
    try:
        with HUB.watch(handle, poll_interval) as sub:
            while True:
                read, status = await asyncio.to_thread(sub.next, _NAP, logger)
                if read and (status is None or status.is_terminal()):
                    untrack(handle)
                    return status
                reason, timed_out = _stop_reason(watch, deadline, timeout)
                if timed_out:
                    raise _timed_out(runner, handle, timeout, cancel_on_timeout, logger)
                if reason is None and watch.api_due():
                    reason = await asyncio.to_thread(watch.api_reason)
                if reason:
                    cancel_quietly(runner, handle, logger, reason)
                    raise JobCancelledError(handle, reason)
    except BaseException as e:
        if is_interrupt(e):
            # blocking on purpose: the cancel must be sent before the task is torn down
            cancel_quietly(runner, handle, logger, f"interrupted: {e!r}")
        raise


def follow_sync(forwarder: LogForwarder, watch: CancelWatch, timeout: float | None) -> str | None:
    """Waits for ``forwarder`` to finish in short naps; returns why it stopped early, if it did."""
    deadline = _deadline(timeout)
    while forwarder.is_alive():
        reason = watch.reason()
        if reason:
            return reason
        if deadline is not None and time.monotonic() >= deadline:
            return f"timeout of {timeout}s"
        forwarder.join(_NAP)
    return None


async def follow_async(
    forwarder: LogForwarder, watch: CancelWatch, timeout: float | None
) -> str | None:
    """:func:`follow_sync` for async code."""
    deadline = _deadline(timeout)
    while forwarder.is_alive():
        reason = watch.local_reason()
        if reason is None and watch.api_due():
            reason = await asyncio.to_thread(watch.api_reason)
        if reason:
            return reason
        if deadline is not None and time.monotonic() >= deadline:
            return f"timeout of {timeout}s"
        await asyncio.sleep(_NAP)
    return None
