"""How the Shipyard worker cancels a flow run's job within Prefect's ``grace_seconds``
(:meth:`prefect_tasks.worker.ShipyardWorker.kill_infrastructure`): a polite stop, up to
``grace_seconds`` for the job to end, then a forced end.

What core's cancel offers (:meth:`core.runner.Runner.cancel`, ``Scheduler.cancel``) is one
call: each backend stops the replicas politely (SIGTERM) and forces them after a grace. The
local and Docker schedulers take that grace from their caller (their factory's ``grace``);
so here:

* **local processes and Docker** (``local_cwd``, ``local_dir``, ``local_docker``): the cancel
  runs with ``grace_seconds`` as the scheduler's grace: SIGTERM to every replica, SIGKILL to
  those still running after ``grace_seconds`` (Docker: ``docker stop -t``, whole seconds,
  instead of the app's ``stop_timeout``). A replica that ends sooner is not waited for.
* **Slurm**: the cancel is ``scancel``, then SIGKILL after the cluster's ``KillWait`` (the
  administrator's setting, as for any ``scancel``); the worker waits up to ``grace_seconds``
  for the job to end and then asks once more, so a job whose ``KillWait`` is longer ends when
  that grace ends (the run's log says so).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio.to_thread

from core.runner import Runner
from core.schedulers import SchedulerFactory
from core.specs import AppHandle, AppStatus, parse_app_handle
from core.watch import JobWatch

__all__ = ["GRACED_SCHEDULERS", "cancel_within", "graced_factories"]

#: the schedulers whose cancel takes its grace from the caller (their factory's ``grace``)
GRACED_SCHEDULERS = ("local_cwd", "local_dir", "local_docker")
#: seconds between two looks at a job being cancelled
_POLL = 0.5


def graced_factories(
    factories: Mapping[str, SchedulerFactory], grace: float
) -> dict[str, SchedulerFactory]:
    """``factories`` with the local schedulers' grace (SIGTERM to SIGKILL) set to ``grace``."""
    out = dict(factories)
    for name in GRACED_SCHEDULERS:
        make = out.get(name)
        if make is not None:
            out[name] = _with_grace(make, grace)
    return out


def _with_grace(make: SchedulerFactory, grace: float) -> SchedulerFactory:
    def graced(session_name: str, **kwargs: Any) -> Any:
        return make(session_name, **{**kwargs, "grace": grace})

    return graced


async def _ended(runner: Runner, handle: AppHandle, within: float) -> AppStatus | None:
    """The job's final status once it ended, or None if it did not within ``within`` s."""
    watch = JobWatch(runner, handle, poll_interval=_POLL, first_delay=0.1, timeout=within)
    try:
        return (await watch.run_async()).status
    except TimeoutError:
        return None


async def cancel_within(
    runner: Callable[[float], Runner],
    handle: AppHandle,
    grace_seconds: float,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> AppStatus | None:
    """Cancels ``handle``: the polite stop, up to ``grace_seconds`` for the job to end, then
    the forced end (see the module's docs); returns its status once it ended (None if it had
    not by then: the backend ends it on its own grace).

    ``runner(grace)`` makes a runner whose local schedulers use ``grace`` (see
    :func:`graced_factories`); each is closed here.
    """
    grace = max(float(grace_seconds), 0.0)
    polite = runner(grace)
    try:
        # (the polite stop in a thread: a local one returns once its grace is over)
        stopping = asyncio.ensure_future(anyio.to_thread.run_sync(polite.cancel, handle))
        status = await _ended(polite, handle, grace + 2 * _POLL)
        if status is None:
            backend = parse_app_handle(handle).scheduler_backend
            logger.warning(
                "Shipyard job %s did not end within the grace of %ss: forcing it%s",
                handle, grace_seconds,
                "" if backend in GRACED_SCHEDULERS else f" ({backend} ends it on its own grace)",
            )  # fmt: skip
            await _force(runner, handle)
        await stopping
        return status or await anyio.to_thread.run_sync(polite.status, handle)
    finally:
        await anyio.to_thread.run_sync(polite.close)


async def _force(runner: Callable[[float], Runner], handle: AppHandle) -> None:
    """The forced end: a cancel without grace (SIGKILL at once on local processes; the cancel
    asked for once more elsewhere)."""
    with runner(0.0) as forcing:
        await anyio.to_thread.run_sync(forcing.cancel, handle)
