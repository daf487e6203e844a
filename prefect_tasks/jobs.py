"""Submitting Shipyard jobs from Prefect, thin over :mod:`core.runner`.

* :func:`resolve_app` turns an ``AppDef``, a dict or a YAML path into an ``AppDef``.
* :func:`derive_idempotency_key` gives a key that is the same on every retry of a task run (and on
  every retry of its flow run), and :func:`submit` uses it with :func:`current_attempt` through
  :meth:`core.runner.Runner.attach_or_submit` (the key scheme the Airflow operator and the
  worker use too), so that a retry re-attaches to the job its earlier attempt started instead
  of submitting a second one.
* :func:`guard_flow_run` covers the time between submitting and waiting: a SIGTERM guard and
  ``on_crashed`` / ``on_cancellation`` hooks that cancel the flow run's unfinished jobs (the jobs
  a flow run started in this process are tracked until they are seen final).
* :func:`async_twin` makes a task's async twin, which runs the same body in a thread and tells
  it of an interruption through :func:`interrupted` (what is an interruption:
  :func:`core.watch.is_interrupt`).

Waiting on a job and following its logs is :class:`core.watch.JobWatch`; noticing that the run
goes away is :class:`prefect_tasks.waiting.CancelWatch`. Everything is addressed by app handle, so any process can pick a
job up again.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar

from core.runner import Runner, attempt_key, get_runner
from core.specs import AppDef, AppHandle, Cfg
from core.watch import is_interrupt

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

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


def _app_digest(app: AppDef, scheduler: str, cfg: Cfg | None, workspace: Any) -> str:
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
    app: AppDef, scheduler: str, cfg: Cfg | None, workspace: str | None
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


def current_attempt() -> int:
    """The attempt of the current task run, counted across the retries of the task run and of
    its flow run (1 outside a task run): ``(flow run attempt - 1) * (task retries + 1) + task
    run attempt``, so every try of a task in every try of its flow has a number of its own, in
    order (see :meth:`core.runner.Runner.attach_or_submit`)."""
    from prefect.context import FlowRunContext, TaskRunContext

    tctx = TaskRunContext.get()
    if tctx is None:
        return 1
    tries = max(int(tctx.task_run.run_count or 1), 1)
    retries = int(getattr(tctx.task, "retries", 0) or 0)
    fctx = FlowRunContext.get()
    flow_tries = 1
    if (
        fctx is not None
        and fctx.flow_run is not None
        and fctx.flow_run.id == tctx.task_run.flow_run_id
    ):
        flow_tries = max(int(fctx.flow_run.run_count or 1), 1)
    return (flow_tries - 1) * (retries + 1) + tries


def submit(
    runner: Runner,
    app: AppDef,
    scheduler: str,
    cfg: Cfg | None,
    workspace: str | None,
    key: str | None,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> AppHandle:
    """Submits ``app`` (once per attempt of the task run, with ``key``: see
    :meth:`core.runner.Runner.attach_or_submit`), tracking the job for the flow's hooks.

    A retry after a crash re-attaches to the job still running (or that succeeded); a retry
    after a failure runs it again; no attempt ever submits twice. Interrupted on the way
    (SIGTERM, a timeout), it cancels the job, found by its key if need be.
    """
    attempt = current_attempt()
    handle: AppHandle | None = None
    try:
        if key is None:
            handle = runner.run(app, scheduler, cfg, workspace)
            logger.info("submitted %s", handle)
        else:
            sub = runner.attach_or_submit(
                app, scheduler, cfg, key=key, attempt=attempt, workspace=workspace
            )
            handle = sub.handle
            what = (
                f"re-attaching to {handle} ({sub.state},"
                if sub.attached
                else f"submitted {handle} ("
            )
            logger.info("%s idempotency key %s)", what, sub.key)
        track(handle)
        return handle
    except BaseException as e:
        if is_interrupt(e):
            # the job may exist without our knowing its handle yet: find it by key
            if handle is None and key is not None:
                handle = runner.find(scheduler, attempt_key(key, attempt), cfg)
            cancel_quietly(runner, handle, logger, f"interrupted while submitting: {e!r}")
        raise


def cancel_quietly(
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
        cancel_quietly(runner, handle, logger, why)
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
                    cancel_quietly(runner, handle, logger, f"got {signal.Signals(signum).name}")
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
# interrupts and threads
# --------------------------------------------------------------------------------------------


#: why the async twin whose thread runs the caller was interrupted (see :func:`async_twin`)
_INTERRUPTED: contextvars.ContextVar[list[str]] = contextvars.ContextVar("shipyard_interrupted")


def interrupted() -> str | None:
    """Why the async twin running the caller in its thread was interrupted, or None.

    Long calls check it where a sync task would get the interruption as an exception: a wait
    then cancels its job, a submission cancels the job it made.
    """
    return next(iter(_INTERRUPTED.get([])), None)


def async_twin(
    fn: Callable[P, T], doc: str, before: Callable[[], object] | None = None
) -> Callable[P, Coroutine[Any, Any, T]]:
    """An async function of ``fn``'s arguments that calls ``before()`` (on the event loop), runs
    ``fn`` in a new daemon thread with a copy of the current context, and awaits it.

    Interrupted (a timeout, a cancelled task), it tells ``fn`` through :func:`interrupted` and
    blocks until ``fn`` has returned, so that the job is cancelled before the task is torn down
    (awaiting would not do: a cancelled scope interrupts every later ``await``); then raises.
    """

    @functools.wraps(fn)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> T:
        if before is not None:
            before()
        reasons: list[str] = []
        ctx = contextvars.copy_context()
        ctx.run(_INTERRUPTED.set, reasons)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # so that it cannot be cancelled

        def target() -> None:
            try:
                future.set_result(ctx.run(fn, *args, **kwargs))
            except BaseException as e:
                future.set_exception(e)

        threading.Thread(target=target, daemon=True, name="shipyard-call").start()
        try:
            return await asyncio.wrap_future(future)
        except BaseException as e:
            if is_interrupt(e):
                reasons.append(f"interrupted: {e!r}")
                concurrent.futures.wait([future])  # blocking on purpose (see above)
            raise

    twin.__name__ = twin.__qualname__ = f"{fn.__name__}_async"
    twin.__doc__ = doc
    return twin


def publish_table(rows: list[dict[str, Any]], description: str, logger: Any) -> None:
    """A table artifact of the current run (nothing outside a run, or if the API refuses: the
    log has the figures)."""
    from prefect.artifacts import acreate_table_artifact, create_table_artifact

    _publish(create_table_artifact, acreate_table_artifact, (rows,), description, logger)


def publish_link(url: str, text: str, description: str, logger: Any) -> None:
    """A link artifact of the current run (nothing outside a run, or if the API refuses)."""
    from prefect.artifacts import acreate_link_artifact, create_link_artifact

    _publish(create_link_artifact, acreate_link_artifact, (url, text), description, logger)


def _publish(
    sync: Callable[..., Any],
    async_: Callable[..., Any],
    args: tuple[Any, ...],
    description: str,
    logger: Any,
) -> None:
    if not has_api():
        return
    try:
        if _loop_running():
            sync(*args, description=description)
        else:  # (in the thread of an async task's body the sync call would only hand back a
            # coroutine: the async one is run to its end on a loop of this thread's own)
            asyncio.run(async_(*args, description=description))
    except Exception as e:
        logger.debug("no artifact %r: %s", description, e)


def has_api() -> bool:
    """Whether there is a Prefect API to send artifacts and events to: a run's, or
    ``PREFECT_API_URL`` (without either Prefect would start a temporary server for them)."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return True
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
