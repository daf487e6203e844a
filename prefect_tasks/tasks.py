"""Prefect 3 tasks that submit, wait on, stream the logs of and cancel Shipyard jobs.

Every task is thin over :mod:`core.runner` and passes jobs around by app handle
(``{scheduler}://{session}/{app_id}``), so a handle returned by one task, flow or process is all
another needs.

* :func:`submit_job` re-attaches instead of submitting twice when its task run is retried: it tags
  the job with a key derived from the task run (see ``jobs.derive_idempotency_key``).
* :func:`wait_for_job` streams the job's log lines to the Prefect run logger (one record per line,
  ``role/replica line``), raises :class:`core.runner.AppFailedError` (state, exit codes, last log
  lines) for a job that did not succeed, and cancels the job when the run goes away: a task or
  flow timeout, a cancelled flow run, SIGTERM to the flow process, also for ``.submit()``-ed tasks.
  All the jobs waited on in a process are polled together (one backend call per round).
* Each task has an ``async`` twin (``*_async``) for async flows: the same body, run in a thread,
  with the same cancellation (see ``jobs.async_twin``); the sync tasks also work there.

Every task uses ``cache_policy=NO_CACHE``: submitting and cancelling are side effects that must
never be skipped because an earlier run had the same inputs. Options such as ``retries`` and
``timeout_seconds`` are set with ``.with_options(...)``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from core.errors import JobCancelledError, JobSilentError
from core.joburl import job_url, template_or_env
from core.reports import usage_summary
from core.runner import Runner
from core.schedulers import get_scheduler_factories
from core.specs import AppHandle, AppStatus, Cfg, parse_app_handle
from core.watch import AttemptsLog, JobWatch, LogLine, check_max_silence, is_interrupt
from prefect_tasks import jobs, waiting
from prefect_tasks.blocks import (
    Backend,
    ShipyardBackend,
    SlurmCluster,
    resolve_backend,
    runner_for,
    use_cluster,
)
from prefect_tasks.events import JobEvents, emit_job_state, remember_name

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_CANCEL_CHECK_INTERVAL",
    "cancel_job",
    "cancel_job_async",
    "get_job_result",
    "get_job_result_async",
    "stream_job_logs",
    "stream_job_logs_async",
    "submit_job",
    "submit_job_async",
    "wait_for_job",
    "wait_for_job_async",
]

#: most seconds between two status polls of a job (polling starts faster and backs off)
DEFAULT_POLL_INTERVAL = 1.0
#: seconds between two reads of the flow run's state (to notice a flow run cancelled in the API)
DEFAULT_CANCEL_CHECK_INTERVAL = 5.0

_fallback_log = logging.getLogger("prefect_tasks")

P = ParamSpec("P")
T = TypeVar("T")


def run_logger() -> logging.Logger | logging.LoggerAdapter[Any]:
    """The Prefect run logger, or a plain logger when called outside a run (``task.fn(...)``)."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return _fallback_log


def _check_handle(handle: Any) -> AppHandle:
    if not isinstance(handle, str):
        raise ValueError(f"handle: expected an app handle string, got {type(handle).__name__}")
    backend = parse_app_handle(handle).scheduler_backend  # MalformedAppHandleException
    known = get_scheduler_factories()
    if backend not in known:
        raise ValueError(
            f"handle: unknown scheduler {backend!r} in {handle!r}; expected one of {', '.join(known)}"
        )
    return handle


def _check_positive(value: Any, where: str, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{where}: expected a positive number of seconds, got {value!r}")


def _check_submit_args(scheduler: Any, cfg: Any, workspace: Any, idempotency_key: Any) -> None:
    if not isinstance(scheduler, str) or not scheduler:
        raise ValueError(f"scheduler: expected a scheduler name, got {scheduler!r}")
    if cfg is not None and not isinstance(cfg, Mapping):
        raise ValueError(f"cfg: expected a mapping of run options, got {type(cfg).__name__}")
    if workspace is not None and not isinstance(workspace, str):
        raise ValueError(f"workspace: expected a path or URL string, got {workspace!r}")
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not idempotency_key
    ):
        raise ValueError(f"idempotency_key: expected a non-empty string, got {idempotency_key!r}")


def _async_task(
    sync_task: Task[P, T], doc: str, before: Callable[[], object] | None = None
) -> Task[P, Coroutine[Any, Any, T]]:
    """The async twin of ``sync_task``: the same body in a thread (see
    :func:`prefect_tasks.jobs.async_twin`), under the same task name."""
    twin = jobs.async_twin(sync_task.fn, doc, before)
    return task(name=sync_task.name, cache_policy=NO_CACHE)(twin)


# --------------------------------------------------------------------------------------------
# submit
# --------------------------------------------------------------------------------------------


def with_cluster(
    scheduler: str | None, cfg: Cfg | None, cluster_name: str | None
) -> tuple[str, Cfg | None]:
    """The scheduler and cfg of a submission to ``cluster_name`` (if any)."""
    if cluster_name is None:
        return ("local_cwd" if scheduler is None else scheduler), cfg
    return ("slurm" if scheduler is None else scheduler), {**(cfg or {}), "cluster": cluster_name}


@task(name="shipyard-submit-job", cache_policy=NO_CACHE)
def submit_job(
    app: Any,
    scheduler: str | ShipyardBackend | None = None,
    cfg: Cfg | None = None,
    workspace: str | None = None,
    idempotency_key: str | None = None,
    cluster: SlurmCluster | str | None = None,
) -> AppHandle:
    """Submits a job and returns its app handle.

    Args:
        app: an ``AppDef``, a dict in the app-file format, or the path of a YAML app file
        scheduler: ``local_cwd``, ``local_dir``, ``local_docker``, ``slurm`` or a plugin's name;
            or a :class:`~prefect_tasks.blocks.ShipyardBackend` block (or the name of a saved
            one), whose default ``cfg`` the given ``cfg`` goes over
        cfg: the scheduler's run options (see ``shipyard runopts``)
        workspace: a directory (or fsspec URL) to run the job from, where the scheduler supports it
        idempotency_key: overrides the key derived from the task run. A job already submitted
            with the key is re-attached to instead of submitting again, unless it failed or was
            cancelled (then a retry submits a fresh one).
        cluster: a :class:`~prefect_tasks.blocks.SlurmCluster` block (or the name of a saved
            one) to run on; the scheduler is then ``slurm`` unless given

    The scheduler defaults to ``local_cwd`` (``slurm`` with a ``cluster``).

    The job's state as read after the submit is its first Prefect event
    (``shipyard.job.<state>``, see :mod:`prefect_tasks.events`); when its page in a dashboard
    is known (the backend's ``ui_url``, else the block's ``ui_url`` template, else
    ``$SHIPYARD_UI_URL``) the run gets a link artifact to it.

    Raises:
        ValueError: bad input, naming the field, before anything is submitted.
    """
    backend = resolve_backend(scheduler, cfg)
    name, cfg = with_cluster(backend.scheduler, backend.cfg, use_cluster(cluster))
    _check_submit_args(name, cfg, workspace, idempotency_key)
    template_or_env(backend.ui_url)  # (a bad $SHIPYARD_UI_URL fails here, before the submit)
    logger = run_logger()
    appdef = jobs.resolve_app(app)
    key = idempotency_key or jobs.derive_idempotency_key(appdef, name, cfg, workspace)
    jobs.guard_flow_run()
    with backend.runner() as runner:
        handle = jobs.submit(runner, appdef, name, cfg, workspace, key, logger)
        why = jobs.interrupted()  # the async twin, while the submission was in flight
        if why:
            jobs.cancel_quietly(runner, handle, logger, why)
            raise JobCancelledError(handle, why)
        announce(runner, handle, appdef.name, backend, logger)
        return handle


def announce(runner: Runner, handle: AppHandle, name: str, backend: Backend, logger: Any) -> None:
    """What follows a submit: the job's state as its first event and, when its page is known,
    a link artifact to it. Never raises (the job runs: that is what counts)."""
    remember_name(handle, name)
    try:
        status = runner.status(handle)
    except Exception as e:  # (the wait reads it again, retrying)
        logger.debug("no status of %s after submitting it: %s", handle, e)
        status = None
    emit_job_state(handle, status, name)
    url = job_url(handle, status, backend.ui_url)
    if url:
        logger.info("%s: %s", handle, url)
        jobs.publish_link(url, handle, f"Shipyard job {handle} ({name})", logger)


submit_job_async = _async_task(
    submit_job,
    """:func:`submit_job` for async flows: the submission runs in a thread.

    Interrupted while the submission is in flight, it cancels the job it makes once it exists.
    """,
    before=jobs.guard_flow_run,  # here: signal handlers can only be set from the main thread
)


# --------------------------------------------------------------------------------------------
# wait
# --------------------------------------------------------------------------------------------


@task(name="shipyard-wait-for-job", cache_policy=NO_CACHE)
def wait_for_job(
    handle: AppHandle,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    stream_logs: bool = True,
    cancel_on_timeout: bool = True,
    cancel_check_interval: float | None = DEFAULT_CANCEL_CHECK_INTERVAL,
    cluster: SlurmCluster | ShipyardBackend | str | None = None,
    max_silence: float | None = None,
) -> AppStatus:
    """Waits for the job to end and returns its final status; raises if it did not succeed.

    Args:
        handle: the app handle from :func:`submit_job` (or anywhere else)
        timeout: seconds to wait at most (None: no limit)
        poll_interval: most seconds between two status polls
        stream_logs: send the job's log lines to the run logger while waiting
        cancel_on_timeout: cancel the job when ``timeout`` passes
        cancel_check_interval: seconds between checks of the flow run's state in the API, to
            cancel the job when the flow run is cancelled (None: do not check)
        cluster: the :class:`~prefect_tasks.blocks.SlurmCluster` the job runs on, when it is
            one (another process than the submitter's needs its settings)
        max_silence: seconds a running replica may go without a log line (with
            ``stream_logs``); past that the job is cancelled and the task fails with
            :class:`core.errors.JobSilentError` naming the silent replicas and their last lines

    Once the job ended, what each replica used (wall and CPU time, peak memory) is in the log
    and in a table artifact of the run.

    The job is cancelled when the wait is interrupted: a task or flow timeout, a cancelled flow
    run, SIGTERM to the flow process, also when this task was started with ``.submit()``. An
    ordinary error (the backend unreachable for longer than the retry budget) leaves the job
    running, so a retry of this task picks it up again.

    Raises:
        core.runner.AppFailedError: the job failed, was cancelled or is unknown; the message has
            its state, exit codes and the last log lines of the replicas that did not succeed.
        TimeoutError: ``timeout`` passed.
        JobCancelledError: the run went away and the job was cancelled.
        core.errors.JobSilentError: replicas were silent for ``max_silence`` seconds.
    """
    _check_handle(handle)
    max_silence = check_max_silence(max_silence)
    _check_positive(timeout, "timeout")
    _check_positive(poll_interval, "poll_interval", allow_none=False)
    _check_positive(cancel_check_interval, "cancel_check_interval")
    logger = run_logger()
    stop = waiting.CancelWatch(cancel_check_interval)
    with runner_for(cluster) as runner:
        watch = JobWatch(
            runner,
            handle,
            poll_interval=poll_interval,
            logger=logger,
            timeout=timeout,
            cancel_on_timeout=cancel_on_timeout,
            cancel_on_exit=True,
            should_stop=stop.reason,
            logs=stream_logs,
            on_line=lambda line: logger.info("%s", line),
            max_silence=max_silence,
            final_usage=True,
            on_status=JobEvents(handle, then=AttemptsLog(logger)),
        )
        try:
            status = watch.run().status
        except BaseException as e:
            cancelled = isinstance(e, JobCancelledError | JobSilentError) or is_interrupt(e)
            if cancelled or (isinstance(e, TimeoutError) and cancel_on_timeout):
                jobs.untrack(handle)
            raise
        jobs.untrack(handle)
        _report_usage(handle, status, logger)
        _report_attempts(handle, status, logger)
        final = runner.check_succeeded(handle, status)  # raises AppFailedError
        logger.info("%s %s", handle, final.state.name)
        return final


def _report_usage(handle: AppHandle, status: AppStatus | None, logger: Any) -> None:
    """What the ended job's replicas used: a line each in the log, and a table artifact."""
    if status is None or not status.is_terminal():
        return
    for line in usage_summary(status.roles):
        logger.info("usage: %s", line)
    if not any(r.usage is not None for rs in status.roles for r in rs.replicas):
        return
    rows = [
        {"replica": f"{rs.role}/{r.id}", "state": r.state.name, "exit_code": r.exit_code,
         **(r.usage.to_json() if r.usage is not None else {})}
        for rs in status.roles
        for r in rs.replicas
    ]  # fmt: skip
    jobs.publish_table(rows, f"Shipyard job {handle}: usage per replica", logger)


def _report_attempts(handle: AppHandle, status: AppStatus | None, logger: Any) -> None:
    """A requeued job's ended attempts: a table artifact (their lines are in the log)."""
    if status is not None and status.attempts:
        rows = [a.to_json() for a in status.attempts]
        jobs.publish_table(rows, f"Shipyard job {handle}: attempts before the last", logger)


wait_for_job_async = _async_task(
    wait_for_job, ":func:`wait_for_job` for async flows (same arguments, errors and cancellation)."
)


# --------------------------------------------------------------------------------------------
# logs
# --------------------------------------------------------------------------------------------


def _check_log_args(role: Any, replica: Any, regex: Any, max_lines: Any) -> None:
    if role is not None and (not isinstance(role, str) or not role):
        raise ValueError(f"role: expected a role name, got {role!r}")
    if replica is not None and (
        isinstance(replica, bool) or not isinstance(replica, int) or replica < 0
    ):
        raise ValueError(f"replica: expected a replica index (0, 1, ...), got {replica!r}")
    if regex is not None:
        import re

        try:
            re.compile(regex)
        except (re.error, TypeError) as e:
            raise ValueError(f"regex: not a valid regular expression ({e}): {regex!r}") from None
    if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 0:
        raise ValueError(f"max_lines: expected a non-negative integer, got {max_lines!r}")


def _check_replica_exists(
    runner: Runner, handle: AppHandle, role: str | None, replica: int | None
) -> None:
    """Fails early for a role or replica the job does not have (when its replicas are known)."""
    if role is None and replica is None:
        return
    replicas = runner.replicas(handle)
    if not replicas:
        if runner.status(handle) is None:
            raise ValueError(f"handle: no app {handle}")
        return
    if role is not None and all(r != role for r, _ in replicas):
        roles = sorted({r for r, _ in replicas})
        raise ValueError(f"role: app {handle} has no role {role!r}; roles: {roles}")
    if replica is not None and all(k != replica for r, k in replicas if role in (None, r)):
        raise ValueError(f"replica: {role or 'the app'} of {handle} has no replica {replica}")


@task(name="shipyard-stream-job-logs", cache_policy=NO_CACHE)
def stream_job_logs(
    handle: AppHandle,
    role: str | None = None,
    replica: int | None = None,
    regex: str | None = None,
    should_tail: bool = True,
    timeout: float | None = None,
    max_lines: int = 1000,
    cancel_check_interval: float | None = DEFAULT_CANCEL_CHECK_INTERVAL,
    cluster: SlurmCluster | ShipyardBackend | str | None = None,
) -> list[str]:
    """Sends the job's log lines to the run logger, one record per line (``role/replica line``).

    Args:
        handle: the job's app handle
        role: only this role's replicas (default: all roles)
        replica: only this replica index (of ``role``, or of every role)
        regex: only lines matching this regular expression (``re.search``)
        should_tail: follow the logs until the job ends (False: what is there now)
        timeout: stop following after this many seconds (the job is left alone)
        max_lines: how many of the last lines to return
        cancel_check_interval: see :func:`wait_for_job`

    Returns the last ``max_lines`` lines. It only reads: stopping (timeout, cancelled run) never
    cancels the job.
    """
    _check_handle(handle)
    _check_log_args(role, replica, regex, max_lines)
    _check_positive(timeout, "timeout")
    _check_positive(cancel_check_interval, "cancel_check_interval")
    stop = waiting.CancelWatch(cancel_check_interval)
    logger = run_logger()
    lines: collections.deque[str] = collections.deque(maxlen=max_lines)

    def take(line: LogLine) -> None:
        logger.info("%s", line)
        lines.append(str(line))

    with runner_for(cluster) as runner:
        _check_replica_exists(runner, handle, role, replica)
        watch = JobWatch(
            runner,
            handle,
            logger=logger,
            timeout=timeout,
            should_stop=stop.reason,
            logs=True,
            on_line=take,
            role=role,
            replica=replica,
            regex=regex,
            tail=should_tail,
            on_status=JobEvents(handle),
        )
        try:
            stopped = watch.run().stopped
        except TimeoutError:
            stopped = f"timeout of {timeout}s"
    if watch.log_error is not None:
        raise watch.log_error
    if stopped:
        logger.info("stopped following the logs of %s: %s", handle, stopped)
    return list(lines)


stream_job_logs_async = _async_task(stream_job_logs, ":func:`stream_job_logs` for async flows.")


# --------------------------------------------------------------------------------------------
# cancel
# --------------------------------------------------------------------------------------------


@task(name="shipyard-cancel-job", cache_policy=NO_CACHE)
def cancel_job(
    handle: AppHandle,
    wait: bool = True,
    timeout: float = 60.0,
    cluster: SlurmCluster | ShipyardBackend | str | None = None,
) -> AppStatus | None:
    """Cancels the job (idempotent) and returns its status (None if the app is unknown).

    Args:
        handle: the job's app handle
        wait: wait until the job is final (CANCELLED, or whatever it ended as first)
        timeout: seconds to wait at most
        cluster: the :class:`~prefect_tasks.blocks.SlurmCluster` the job runs on, if any

    Raises:
        TimeoutError: ``wait`` and the job is still not final after ``timeout`` seconds.
    """
    _check_handle(handle)
    _check_positive(timeout, "timeout", allow_none=False)
    logger = run_logger()
    with runner_for(cluster) as runner:
        runner.cancel(handle)
        jobs.untrack(handle)
        logger.info("cancel requested for %s", handle)
        if not wait:
            return runner.status(handle)
        watch = JobWatch(
            runner,
            handle,
            poll_interval=0.5,
            logger=logger,
            timeout=timeout,
            should_stop=jobs.interrupted,
            on_status=JobEvents(handle),
        )
        try:
            status = watch.run().status
        except TimeoutError:
            raise TimeoutError(
                f"app {handle} still {_state(watch)} {timeout}s after cancel"
            ) from None
        logger.info("%s is %s", handle, status.state.name if status else "gone")
        return status


def _state(watch: JobWatch) -> str:
    return watch.status.state.name if watch.status is not None else "UNKNOWN"


cancel_job_async = _async_task(cancel_job, ":func:`cancel_job` for async flows.")


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


@task(name="shipyard-get-job-result", cache_policy=NO_CACHE)
def get_job_result(
    handle: AppHandle, cluster: SlurmCluster | ShipyardBackend | str | None = None
) -> dict[str, dict[int, Any]]:
    """What the job's replicas wrote to ``$SHIPYARD_RESULT_FILE``, as ``{role: {replica id:
    value}}`` (replica 0 of each role; every replica with the run option
    ``result_replicas=all``). A replica's invalid or oversized result is a warning in the log,
    naming it, and left out.

    Raises:
        ValueError: the app is unknown.
        NotImplementedError: its scheduler does not collect results.
    """
    _check_handle(handle)
    logger = run_logger()
    with runner_for(cluster) as runner:
        result = runner.result(handle)
    for error in result.errors:
        logger.warning("result: %s", error)
    return result.values()


get_job_result_async = _async_task(get_job_result, ":func:`get_job_result` for async flows.")
