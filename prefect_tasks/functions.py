"""Python functions as Shipyard jobs from Prefect: :func:`shipyard_task` turns a function into
a Prefect task whose every call runs the function as a job (:mod:`core.functions`) and
returns its return value.

>>> from prefect import flow
>>> from prefect_tasks import shipyard_task
>>> @shipyard_task(scheduler="slurm", cfg={"partition": "gpu"})
... def train(lr: float) -> float:
...     return lr * 2
>>> @flow
... def sweep() -> list[float]:
...     return [train(lr) for lr in (0.1, 0.01)]

Each call is one task run: it submits once per attempt (a retried task run re-attaches to its
job, as :func:`prefect_tasks.tasks.submit_job` does), streams the job's log lines to the run
logger, and gives the value back, or re-raises the function's own exception with the job's
traceback as its cause. A run that goes away (timeout, cancelled flow run, SIGTERM) cancels
the job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from core.functions import function_job, function_value, outcome
from core.runner import AppFailedError
from core.specs import Cfg, Resource
from prefect_tasks import jobs
from prefect_tasks.blocks import ShipyardBackend, SlurmCluster, resolve_backend, use_cluster
from prefect_tasks.tasks import run_logger, wait_for_job, with_cluster

__all__ = ["run_function_job", "shipyard_task"]

P = ParamSpec("P")
R = TypeVar("R")


def run_function_job(
    fn: Callable[..., R],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    scheduler: str | ShipyardBackend | None = None,
    cfg: Cfg | None = None,
    image: str = "",
    resource: Resource | None = None,
    cluster: SlurmCluster | str | None = None,
    stream_logs: bool = True,
) -> R:
    """Runs ``fn(*args, **kwargs)`` as a Shipyard job from inside a task run and returns what
    it returned (the body of a :func:`shipyard_task`; the arguments as for
    :func:`prefect_tasks.tasks.submit_job` and :meth:`core.runner.Runner.run_function`).

    Raises:
        ValueError: bad input or an unfit interpreter, naming it, before anything starts.
        The function's own exception; :class:`core.functions.FunctionError` when the job gave
        no value; :class:`core.runner.AppFailedError` when it ended without an outcome.
    """
    backend = resolve_backend(scheduler, cfg)
    name, merged = with_cluster(backend.scheduler, backend.cfg, use_cluster(cluster))
    name, rest, app = function_job(
        fn, args, kwargs or {}, scheduler=name, cfg=merged, image=image, resource=resource,
        docker_engine=backend.docker_engine,
    )  # fmt: skip
    logger = run_logger()
    key = jobs.derive_idempotency_key(app, name, rest, None)
    jobs.guard_flow_run()
    with backend.runner() as runner:
        handle = jobs.submit(runner, app, name, rest, None, key, logger)
        try:
            wait_for_job.fn(handle, stream_logs=stream_logs, cluster=cluster)
        except AppFailedError:
            result = runner.result(handle)
            if outcome(result) is None:
                raise  # (killed, cancelled: its exit codes and last lines say more)
            function_value(result)  # raises the function's exception, or why no value came
            raise
        return function_value(runner.result(handle))  # type: ignore[no-any-return]


@overload
def shipyard_task(fn: Callable[P, R], /) -> Task[P, R]: ...


@overload
def shipyard_task(fn: None = None, /, **options: Any) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def shipyard_task(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Makes ``fn`` a Prefect task that runs it as a Shipyard job and returns its value.

    ``options``: ``scheduler``, ``cfg``, ``image``, ``resource``, ``cluster`` and
    ``stream_logs`` choose where and how (see :func:`run_function_job`; ``cfg["python"]``
    the job's interpreter); any other option goes to ``prefect.task`` (``retries``,
    ``timeout_seconds``, ``name``...). The task's default name is ``shipyard-<fn name>``.
    """
    job_keys = ("scheduler", "cfg", "image", "resource", "cluster", "stream_logs")
    job = {k: options.pop(k) for k in job_keys if k in options}

    def decorate(f: Callable[..., Any]) -> Task[Any, Any]:
        @functools.wraps(f)
        def body(*args: Any, **kwargs: Any) -> Any:
            return run_function_job(f, args, kwargs, **job)

        opts = {"name": f"shipyard-{f.__name__}", "cache_policy": NO_CACHE, **options}
        return task(**opts)(body)

    return decorate(fn) if fn is not None else decorate
