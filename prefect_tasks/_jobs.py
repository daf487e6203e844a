"""The machinery behind the Prefect tasks, thin over :mod:`core.runner`.

* :func:`resolve_app` turns an ``AppDef``, a dict or a YAML path into an ``AppDef``.
* :func:`derive_idempotency_key` gives a key that is the same on every retry of a task run (and on
  every retry of its flow run), and :func:`submit` uses it so that a retry re-attaches to the job
  its earlier attempt started instead of submitting a second one.
* :class:`CancelWatch` notices that the run is going away while a task waits on a job: Prefect's
  thread-pool task runner shutting down (a flow timeout, a flow that failed or returned, SIGTERM to
  the flow process), the flow's own timeout passing, or the flow run (or a parent) being cancelled
  through the API.
* :func:`guard_flow_run` covers the time between submitting and waiting: a SIGTERM guard and
  ``on_crashed`` / ``on_cancellation`` hooks that cancel the flow run's unfinished jobs.
* :class:`LogForwarder` sends a job's log lines to a logger, one record per line, as they arrive.
* :class:`StatusHub` polls the status of every job waited on in the process in one loop (one
  ``status_many`` call per round).
* :func:`wait_sync` / :func:`wait_async` follow the job to a final state and cancel it when they
  are interrupted (task or flow timeout, cancellation, SIGTERM, Ctrl-C).

Everything is addressed by app handle, so any process can pick a job up again.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from core.runner import LogLine, Runner, get_runner
from core.specs import AppDef, AppHandle, AppState, AppStatus, CfgVal

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how many failed jobs of one task run are skipped before giving up looking for a live one
MAX_GENERATIONS = 1000
#: longest uninterrupted sleep while waiting: bounds how late an injected exception (Prefect's
#: timeout in a worker thread) or a set cancel event is noticed
_NAP = 0.2
#: consecutive failed status polls tolerated (a backend hiccup) before the wait fails
STATUS_ERRORS_TOLERATED = 3
#: how long a finished job's log forwarder gets to deliver its last lines
_LOG_DRAIN_TIMEOUT = 30.0


class JobCancelledError(RuntimeError):
    """A task stopped waiting and cancelled its job because the run was going away.

    Attributes:
        handle: the cancelled job's app handle
        reason: why (the flow run was cancelled, the flow timed out ...)
    """

    def __init__(self, handle: str, reason: str) -> None:
        self.handle = handle
        self.reason = reason
        super().__init__(f"cancelled app {handle}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.handle, self.reason))


# --------------------------------------------------------------------------------------------
# apps and keys
# --------------------------------------------------------------------------------------------


def resolve_app(app: Any) -> AppDef:
    """An ``AppDef`` from an ``AppDef``, a dict (as in an app file) or a YAML path or text.

    Raises:
        ValueError: naming the bad field (``core.appfile.AppFileError`` for dicts and files).
    """
    if isinstance(app, AppDef):
        return app
    from core import appfile

    if isinstance(app, Mapping):
        return appfile.app_from_dict(dict(app))
    if isinstance(app, str | os.PathLike):
        return appfile.load_app(app)
    raise ValueError(
        f"app: expected an AppDef, a dict or the path of a YAML app file, got {type(app).__name__}"
    )


def _app_digest(
    app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal] | None, workspace: Any
) -> str:
    from core.appfile import app_to_dict

    try:
        app_data: Any = app_to_dict(app)
    except Exception:  # an app the file format cannot express still gets a stable digest
        app_data = repr(app)
    text = json.dumps(
        {"app": app_data, "scheduler": scheduler, "cfg": dict(cfg or {}), "workspace": workspace},
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(text.encode()).hexdigest()


_KEYS_LOCK = threading.Lock()
#: calls so far per (flow run, flow run attempt, task key, app digest)
_CALL_INDEX: dict[tuple[str, int, str, str], int] = {}
#: keys already given out, by task run id: a retry of the task run gets the same one
_TASK_RUN_KEYS: collections.OrderedDict[Any, str] = collections.OrderedDict()
_MAX_REMEMBERED = 10000


def derive_idempotency_key(
    app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal] | None, workspace: str | None
) -> str | None:
    """The idempotency key of the current Prefect task run, or None outside a task run.

    Made of the flow run id, the task's key, a digest of what is submitted and the index of this
    call among the calls of the same task with the same app in this attempt of the flow run. So it
    is the same on every retry of the task run (remembered by task run id) and of the flow run
    (even in another process, as long as the flow submits in the same order), and different for
    every other call. (Prefect's own ``dynamic_key`` is random per task run in Prefect 3.7.)
    """
    from prefect.context import FlowRunContext, TaskRunContext

    ctx = TaskRunContext.get()
    if ctx is None:
        return None
    tr = ctx.task_run
    with _KEYS_LOCK:
        known = _TASK_RUN_KEYS.get(tr.id)
        if known is not None:
            return known
        digest = _app_digest(app, scheduler, cfg, workspace)
        if tr.flow_run_id is None:
            ident = f"{tr.id}/{digest}"
        else:
            fctx = FlowRunContext.get()
            attempt = 0
            if (
                fctx is not None
                and fctx.flow_run is not None
                and fctx.flow_run.id == tr.flow_run_id
            ):
                attempt = fctx.flow_run.run_count
            ns = (str(tr.flow_run_id), attempt, tr.task_key, digest)
            index = _CALL_INDEX.get(ns, 0)
            _CALL_INDEX[ns] = index + 1
            ident = f"{tr.flow_run_id}/{tr.task_key}/{digest}/{index}"
        key = "prefect-" + hashlib.sha256(ident.encode()).hexdigest()[:32]
        _TASK_RUN_KEYS[tr.id] = key
        while len(_TASK_RUN_KEYS) > _MAX_REMEMBERED:
            _TASK_RUN_KEYS.popitem(last=False)
        return key


def _generation_key(key: str, generation: int) -> str:
    return key if generation == 0 else f"{key}-{generation}"


def submit(
    runner: Runner,
    app: AppDef,
    scheduler: str,
    cfg: Mapping[str, CfgVal] | None,
    workspace: str | None,
    key: str | None,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> AppHandle:
    """Submits ``app`` unless a job with ``key`` is already running or succeeded.

    A job of the key that failed or was cancelled is what a retry is for: it is skipped and the
    app is submitted again under the next generation of the key (``key-1``, ``key-2`` ...), so a
    retry after a crash re-attaches and a retry after a failure runs the job again, but no attempt
    ever submits twice.
    """
    if key is None:
        return _submit_tracked(runner, app, scheduler, cfg, workspace, None, logger)
    for generation in range(MAX_GENERATIONS):
        gkey = _generation_key(key, generation)
        found = runner.find(scheduler, gkey, cfg)
        if found is None:
            return _submit_tracked(runner, app, scheduler, cfg, workspace, gkey, logger)
        status = runner.status(found)
        if status is None or (status.is_terminal() and status.state != AppState.SUCCEEDED):
            state = status.state.name if status else "gone"
            logger.info("earlier attempt's job %s is %s; submitting a new one", found, state)
            continue
        track(found)
        logger.info("re-attaching to %s (%s, idempotency key %s)", found, status.state.name, gkey)
        return found
    raise RuntimeError(f"idempotency key {key}: {MAX_GENERATIONS} failed jobs, giving up")


def _submit_tracked(
    runner: Runner,
    app: AppDef,
    scheduler: str,
    cfg: Mapping[str, CfgVal] | None,
    workspace: str | None,
    key: str | None,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> AppHandle:
    """Submits and tracks the job; interrupted on the way (SIGTERM, a timeout), cancels it."""
    handle: AppHandle | None = None
    try:
        handle = runner.run(app, scheduler, cfg, workspace, idempotency_key=key)
        track(handle)
        logger.info("submitted %s (idempotency key %s)", handle, key)
        return handle
    except BaseException as e:
        if is_interrupt(e):
            # the job may exist without our knowing its handle yet: find it by key
            if handle is None and key is not None:
                handle = runner.find(scheduler, key, cfg)
            _cancel_quietly(runner, handle, logger, f"interrupted while submitting: {e!r}")
        raise


def _cancel_quietly(
    runner: Runner,
    handle: AppHandle | None,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    why: str,
) -> None:
    """Cancels ``handle`` (if any) without raising: used while another exception propagates."""
    if handle is None:
        return
    try:
        runner.cancel(handle)
        logger.warning("cancelled %s (%s)", handle, why)
    except Exception as e:
        logger.error("could not cancel %s (%s): %s", handle, why, e)
    untrack(handle)


# --------------------------------------------------------------------------------------------
# jobs started by this process, by flow run (for flow-level hooks)
# --------------------------------------------------------------------------------------------

_TRACKED: dict[str, set[str]] = {}
# re-entrant: the SIGTERM guard runs in the main thread, maybe while it holds the lock
_TRACKED_LOCK = threading.RLock()


def current_flow_run_id() -> str | None:
    """The id of the flow run the caller runs in (directly or in one of its tasks), or None."""
    from prefect.context import FlowRunContext, TaskRunContext

    tctx = TaskRunContext.get()
    if tctx is not None and tctx.task_run.flow_run_id is not None:
        return str(tctx.task_run.flow_run_id)
    fctx = FlowRunContext.get()
    if fctx is not None and fctx.flow_run is not None:
        return str(fctx.flow_run.id)
    return None


def track(handle: AppHandle) -> None:
    """Remembers that the current flow run started ``handle`` (until it is seen final)."""
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return
    with _TRACKED_LOCK:
        _TRACKED.setdefault(flow_run_id, set()).add(handle)


def untrack(handle: AppHandle) -> None:
    """Forgets ``handle`` (it reached a final state or was cancelled)."""
    with _TRACKED_LOCK:
        for handles in _TRACKED.values():
            handles.discard(handle)


def tracked(flow_run_id: str) -> list[str]:
    """Handles started by ``flow_run_id`` in this process and not yet seen final."""
    with _TRACKED_LOCK:
        return sorted(_TRACKED.get(flow_run_id, ()))


def cancel_tracked(
    runner: Runner, flow_run_id: str, logger: logging.Logger | logging.LoggerAdapter[Any], why: str
) -> list[str]:
    """Cancels every job ``flow_run_id`` started in this process that is not known to be final."""
    with _TRACKED_LOCK:
        handles = sorted(_TRACKED.pop(flow_run_id, ()))
    for handle in handles:
        _cancel_quietly(runner, handle, logger, why)
    return handles


def cancel_flow_run_jobs(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook: cancels the jobs ``flow_run`` submitted in this process and not yet seen end.

    :func:`guard_flow_run` adds it to ``on_crashed`` and ``on_cancellation`` of every flow that
    submits a job; add it to ``on_failure`` to cancel the jobs of a failed flow run too. The
    waiting tasks cancel their own jobs; this covers the jobs not (or not yet) waited on, e.g.
    when SIGTERM arrives between ``submit_job`` and ``wait_for_job``.
    """
    from prefect.logging import get_logger

    with get_runner() as runner:
        cancel_tracked(
            runner,
            str(flow_run.id),
            get_logger("prefect_tasks"),
            f"flow run {flow_run.name} is {state.name}",
        )


class _SigtermGuard:
    """A SIGTERM handler that cancels the unfinished jobs of some flow runs, then passes the
    signal on to the handler it replaced (Prefect's, which raises ``TerminationSignal``).

    Needed because on a plain SIGTERM Prefect 3.7 tears the process down (it re-sends the signal
    with the default action once the flow's task runner has shut down) without running the
    flow's ``on_crashed`` hooks: a job submitted but not yet waited on would be left running.
    """

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.flow_run_ids: set[str] = set()

    def __call__(self, signum: int, frame: Any) -> Any:
        handles = [h for fr in sorted(self.flow_run_ids) for h in tracked(fr)]
        if handles:
            from prefect.logging import get_logger

            logger = get_logger("prefect_tasks")
            with get_runner() as runner:
                for handle in handles:
                    _cancel_quietly(runner, handle, logger, f"got {signal.Signals(signum).name}")
        previous = self.previous
        if callable(previous):
            return previous(signum, frame)
        if previous == signal.SIG_IGN:
            return None
        # the default action: terminate, as if we had not been here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None


def _guard_sigterm(flow_run_id: str) -> None:
    """Puts the current flow run under a :class:`_SigtermGuard` (main thread only).

    Prefect restores its own handler when the flow run ends, which drops the guard with it.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if isinstance(current, _SigtermGuard):
            current.flow_run_ids.add(flow_run_id)
            return
        if current is None or current == signal.SIG_IGN:
            return  # a handler not set from Python, or an ignored signal: leave it alone
        guard = _SigtermGuard(current)
        guard.flow_run_ids.add(flow_run_id)
        signal.signal(signal.SIGTERM, guard)
    except (ValueError, OSError):  # not the main interpreter
        return


def guard_flow_run() -> None:
    """Makes sure the running flow cancels its unfinished jobs when it goes away.

    * SIGTERM: a :class:`_SigtermGuard` (when called from the main thread, as a flow script's
      tasks are, unless started with ``.submit()``; waiting tasks cover the rest).
    * a crash (Ctrl-C) or a cancellation by its runner or worker: :func:`cancel_flow_run_jobs`
      is appended to the flow's ``on_crashed`` and ``on_cancellation`` hooks (once; it does
      nothing for a run without unfinished jobs).
    """
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    flow_run_id = current_flow_run_id()
    if flow_run_id is not None:
        _guard_sigterm(flow_run_id)
    flow = getattr(ctx, "flow", None)
    for attr in ("on_crashed_hooks", "on_cancellation_hooks"):
        hooks = getattr(flow, attr, None)
        if isinstance(hooks, list) and cancel_flow_run_jobs not in hooks:
            hooks.append(cancel_flow_run_jobs)


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
            runner = getattr(fctx, "task_runner", None) if fctx is not None else None
            events = getattr(runner, "_cancel_events", None)
            if isinstance(events, Mapping):
                event = events.get(tctx.task_run.id)
                if isinstance(event, threading.Event):
                    self.event = event
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


def is_interrupt(exc: BaseException) -> bool:
    """True for what ends a run from outside: timeouts and cancellation (Prefect's and asyncio's),
    SIGTERM (Prefect's ``TerminationSignal``), Ctrl-C and exit. False for ordinary errors, which
    leave the job running so that a retry can re-attach to it."""
    return not isinstance(exc, Exception) and not isinstance(exc, GeneratorExit)


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
        _cancel_quietly(runner, handle, logger, f"wait timeout of {timeout}s")
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
                    _cancel_quietly(runner, handle, logger, reason)
                    raise JobCancelledError(handle, reason)
    except BaseException as e:
        if is_interrupt(e):
            _cancel_quietly(runner, handle, logger, f"interrupted: {e!r}")
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
                    _cancel_quietly(runner, handle, logger, reason)
                    raise JobCancelledError(handle, reason)
    except BaseException as e:
        if is_interrupt(e):
            # blocking on purpose: the cancel must be sent before the task is torn down
            _cancel_quietly(runner, handle, logger, f"interrupted: {e!r}")
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


# --------------------------------------------------------------------------------------------
# async helpers
# --------------------------------------------------------------------------------------------


def start_in_thread(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Runs ``fn`` in a new daemon thread with a copy of the current context; returns its future.

    Unlike ``asyncio.to_thread`` the future's callbacks run even when the event loop is gone,
    which lets an interrupted caller clean up after a call that was still in flight.
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    ctx = contextvars.copy_context()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(ctx.run(fn))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=target, daemon=True, name="shipyard-call").start()
    return future
