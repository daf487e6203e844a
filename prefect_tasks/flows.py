"""The ``run_job`` flow (submit, wait while streaming the logs, result) and flow-level hooks.

``run_job`` can be called as a subflow from any flow, or run on its own::

    from prefect_tasks import run_job
    result = run_job("app.yaml", scheduler="local_cwd")
    print(result.handle, result.status.state)

The hook :func:`cancel_flow_run_jobs` cancels the jobs a flow run submitted (in this process) that
are not known to have ended; ``run_job`` uses it on failure, cancellation and crash, and a flow
that submits jobs itself can too::

    @flow(on_failure=[cancel_flow_run_jobs], on_cancellation=[cancel_flow_run_jobs],
          on_crashed=[cancel_flow_run_jobs])
    def my_flow(): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect import flow

from core.runner import get_runner
from core.specs import AppHandle, AppState, AppStatus, CfgVal
from prefect_tasks import _jobs
from prefect_tasks.tasks import (
    DEFAULT_CANCEL_CHECK_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    _logger,
    submit_job,
    submit_job_async,
    wait_for_job,
    wait_for_job_async,
)

__all__ = ["JobResult", "cancel_flow_run_jobs", "run_job", "run_job_async"]


@dataclass(frozen=True)
class JobResult:
    """What :func:`run_job` returns: the job's handle and its final status."""

    handle: AppHandle
    status: AppStatus

    @property
    def state(self) -> AppState:
        """The job's final state (SUCCEEDED: ``run_job`` raises otherwise)."""
        return self.status.state


def cancel_flow_run_jobs(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook: cancels the jobs ``flow_run`` submitted in this process and not yet seen end.

    Use it in ``on_failure``, ``on_cancellation`` and ``on_crashed``. The waiting tasks already
    cancel their own jobs; this covers jobs submitted but not (or not yet) waited on.
    """
    with get_runner() as runner:
        _jobs.cancel_tracked(
            runner, str(flow_run.id), _logger(), f"flow run {flow_run.name} is {state.name}"
        )


_HOOKS: dict[str, Any] = {
    "on_failure": [cancel_flow_run_jobs],
    "on_cancellation": [cancel_flow_run_jobs],
    "on_crashed": [cancel_flow_run_jobs],
}


@flow(name="shipyard-run-job", validate_parameters=False, **_HOOKS)
def run_job(
    app: Any,
    scheduler: str = "local_cwd",
    cfg: Mapping[str, CfgVal] | None = None,
    workspace: str | None = None,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    stream_logs: bool = True,
    cancel_check_interval: float | None = DEFAULT_CANCEL_CHECK_INTERVAL,
) -> JobResult:
    """Runs a job to the end: submits it, waits while streaming its logs, returns the result.

    Args:
        app: an ``AppDef``, a dict in the app-file format, or the path of a YAML app file
        scheduler: the scheduler to run it on (``local_cwd``, ``local_docker``, ``slurm`` ...)
        cfg: the scheduler's run options
        workspace: a directory to run the job from, where the scheduler supports it
        timeout: seconds to wait for the job at most; it is cancelled after
        poll_interval: most seconds between two status polls
        stream_logs: send the job's log lines to the Prefect run logger
        cancel_check_interval: seconds between checks for the flow run being cancelled in the API

    Retrying the flow (``run_job.with_options(retries=2)``) re-attaches to a job still running
    or succeeded and runs a failed job again. A timeout, a cancelled flow run or SIGTERM cancels
    the job.

    Raises:
        core.runner.AppFailedError: the job did not succeed (state, exit codes, last log lines).
    """
    handle = submit_job(app, scheduler, cfg, workspace)
    status = wait_for_job(
        handle,
        timeout=timeout,
        poll_interval=poll_interval,
        stream_logs=stream_logs,
        cancel_check_interval=cancel_check_interval,
    )
    return JobResult(handle, status)


@flow(name="shipyard-run-job", validate_parameters=False, **_HOOKS)
async def run_job_async(
    app: Any,
    scheduler: str = "local_cwd",
    cfg: Mapping[str, CfgVal] | None = None,
    workspace: str | None = None,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    stream_logs: bool = True,
    cancel_check_interval: float | None = DEFAULT_CANCEL_CHECK_INTERVAL,
) -> JobResult:
    """:func:`run_job` for async flows (same arguments, result and errors)."""
    handle = await submit_job_async(app, scheduler, cfg, workspace)
    status = await wait_for_job_async(
        handle,
        timeout=timeout,
        poll_interval=poll_interval,
        stream_logs=stream_logs,
        cancel_check_interval=cancel_check_interval,
    )
    return JobResult(handle, status)
