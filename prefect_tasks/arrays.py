"""Prefect tasks and a flow for arrays (``Runner.run_array``): submit once per task run (a retry
runs the failed elements again), wait logging the counts as they change and each failed
element's last lines, a table artifact of the elements, the results one per element."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from core.arrays import check_allow_failures
from core.runner import AppFailedError, Runner, attempt_key
from core.specs import AppHandle, AppState, AppStatus, CfgVal
from core.watch import JobWatch
from prefect_tasks import jobs, waiting
from prefect_tasks.blocks import SlurmCluster, resolve_backend, runner_for, use_cluster
from prefect_tasks.events import JobEvents
from prefect_tasks.tasks import (
    DEFAULT_CANCEL_CHECK_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    announce,
    run_logger,
    with_cluster,
)

__all__ = [
    "ArrayResult",
    "run_array_job",
    "run_array_job_async",
    "submit_array",
    "submit_array_async",
    "wait_for_array",
    "wait_for_array_async",
]


@task(name="shipyard-submit-array", cache_policy=NO_CACHE)
def submit_array(
    app: Any,
    size: int | None = None,
    params: list[Mapping[str, Any]] | None = None,
    max_parallel: int | None = None,
    scheduler: str | None = None,
    cfg: Mapping[str, CfgVal] | None = None,
    idempotency_key: str | None = None,
    cluster: SlurmCluster | str | None = None,
    after: list[AppHandle] | None = None,
    after_condition: str = "ok",
) -> AppHandle:
    """Submits ``app`` as an array (``size`` elements, or one per mapping of ``params``, at
    most ``max_parallel`` running at once) and returns the array's handle.

    The same task run gets the same array again (its key is derived from the task run, or
    ``idempotency_key``); a retry after the array failed runs its failed elements again, under
    the same handle; after it was cancelled, a new array. ``after``: handles it waits for.

    Raises:
        ValueError: bad input, naming the argument, before anything is submitted.
    """
    backend = resolve_backend(scheduler, dict(cfg) if cfg else None)
    name, run_cfg = with_cluster(backend.scheduler, backend.cfg, use_cluster(cluster))
    logger = run_logger()
    appdef = jobs.resolve_app(app)
    key = idempotency_key or jobs.derive_idempotency_key(appdef, name, run_cfg, None)
    attempt = jobs.current_attempt()
    jobs.guard_flow_run()
    with backend.runner() as runner:
        kwargs: dict[str, Any] = dict(
            size=size, params=params, max_parallel=max_parallel, after=after,
            after_condition=after_condition,
        )  # fmt: skip
        handle = runner.run_array(appdef, name, run_cfg, idempotency_key=key, **kwargs)
        if key is not None:
            handle = _again(runner, handle, attempt, logger) or runner.run_array(
                appdef, name, run_cfg, idempotency_key=attempt_key(key, attempt), **kwargs
            )
        logger.info("array %s (key %s)", handle, key)
        jobs.track(handle)
        announce(runner, handle, appdef.name, backend, logger)
        return handle


def _again(runner: Runner, handle: AppHandle, attempt: int, logger: Any) -> AppHandle | None:
    """``handle`` for this attempt (its failed elements run again on a retry); None if it was
    cancelled before (a retry then submits a new array)."""
    status = runner.status(handle)
    if attempt > 1 and status is not None and status.state == AppState.FAILED:
        logger.info(
            "attempt %d: elements %s of %s run again", attempt, runner.retry_failed(handle), handle
        )
    if attempt > 1 and status is not None and status.state == AppState.CANCELLED:
        return None
    return handle


submit_array_async = task(name="shipyard-submit-array", cache_policy=NO_CACHE)(
    jobs.async_twin(
        submit_array.fn, ":func:`submit_array` for async flows.", before=jobs.guard_flow_run
    )
)


@task(name="shipyard-wait-for-array", cache_policy=NO_CACHE)
def wait_for_array(
    handle: AppHandle,
    allow_failures: int = 0,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    cancel_check_interval: float | None = DEFAULT_CANCEL_CHECK_INTERVAL,
    cluster: SlurmCluster | str | None = None,
) -> AppStatus:
    """Waits for the array to end, logging its counts as they change, and returns its final
    status (``.elements``, ``.counts()``); a table artifact lists every element. An
    interrupted wait (a timeout, a cancelled flow run) cancels the array.

    Raises:
        core.runner.AppFailedError: more than ``allow_failures`` elements did not succeed (the
            message has the counts and each failed element's last lines).
    """
    check_allow_failures(allow_failures)
    logger = run_logger()
    counts: list[dict[str, int]] = [{}]

    def on_status(status: AppStatus) -> None:
        if status.elements is not None and status.counts() != counts[0]:
            counts[0] = status.counts()
            text = ", ".join(f"{n} {s}" for s, n in sorted(counts[0].items()))
            logger.info("elements: %s (of %d)", text, len(status.elements))

    with runner_for(cluster) as runner:
        watch = JobWatch(
            runner, handle, poll_interval=poll_interval, logger=logger, timeout=timeout,
            cancel_on_timeout=True, cancel_on_exit=True,
            on_status=JobEvents(handle, then=on_status),
            should_stop=waiting.CancelWatch(cancel_check_interval).reason,
        )  # fmt: skip
        status = watch.run().status
        jobs.untrack(handle)
        return _judge(runner, handle, status, allow_failures, logger)


def _judge(
    runner: Runner, handle: AppHandle, status: AppStatus | None, allow: int, logger: Any
) -> AppStatus:
    elements = (status.elements if status is not None else None) or []
    rows = [
        {"element": e.index, "state": e.state.name, "exit_code": e.exit_code,
         "attempts": e.attempts, "app": e.handle or "", "message": e.msg}
        for e in elements
    ]  # fmt: skip
    jobs.publish_table(rows, f"Shipyard array {handle}: its elements", logger)
    bad = [e for e in elements if e.state != AppState.SUCCEEDED]
    if status is None or status.state == AppState.CANCELLED or len(bad) > allow:
        last: dict[str, list[str]] = {}
        for e in bad[:5]:
            if e.handle:
                for replica, lines in runner.last_lines(e.handle, n=10).items():
                    last[f"[{e.index}] {replica}"] = lines
        raise AppFailedError(handle, status, last)
    logger.info("%s: %d of %d elements succeeded", handle, len(elements) - len(bad), len(elements))
    return status


wait_for_array_async = task(name="shipyard-wait-for-array", cache_policy=NO_CACHE)(
    jobs.async_twin(wait_for_array.fn, ":func:`wait_for_array` for async flows.")
)


@dataclass(frozen=True)
class ArrayResult:
    """What :func:`run_array_job` returns: the array's handle, its final status and each
    element's result (``{role: {replica id: value}}``; None for an element without one)."""

    handle: AppHandle
    status: AppStatus
    results: list[dict[str, dict[int, Any]] | None] = field(default_factory=list)


@flow(name="shipyard-run-array-job", validate_parameters=False)
def run_array_job(
    app: Any,
    size: int | None = None,
    params: list[Mapping[str, Any]] | None = None,
    max_parallel: int | None = None,
    scheduler: str | None = None,
    cfg: Mapping[str, CfgVal] | None = None,
    allow_failures: int = 0,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    cluster: SlurmCluster | str | None = None,
) -> ArrayResult:
    """Runs ``app`` as an array to its end (:func:`submit_array`, :func:`wait_for_array`) and
    returns each element's result. A retried flow run runs only the failed elements again."""
    handle = submit_array(app, size, params, max_parallel, scheduler, cfg, cluster=cluster)
    status = wait_for_array(
        handle, allow_failures, timeout, poll_interval, DEFAULT_CANCEL_CHECK_INTERVAL, cluster
    )
    with runner_for(cluster) as runner:
        results = [r.values() if r is not None else None for r in runner.results(handle)]
    return ArrayResult(handle, status, results)


run_array_job_async = flow(name="shipyard-run-array-job", validate_parameters=False)(
    jobs.async_twin(run_array_job.fn, ":func:`run_array_job` for async flows.")
)
