"""The ``run_job`` flow (submit, wait while streaming the logs, result) and flow-level hooks.

``run_job`` can be called as a subflow from any flow, or run on its own::

    from prefect_tasks import run_job
    result = run_job("app.yaml", scheduler="local_cwd")
    print(result.handle, result.status.state)

Every flow that calls ``submit_job`` gets the hook :func:`cancel_flow_run_jobs` added to its
``on_crashed`` and ``on_cancellation`` hooks: it cancels the jobs the flow run submitted (in this
process) that are not known to have ended, so SIGTERM between ``submit_job`` and ``wait_for_job``
leaves nothing behind. ``run_job`` also uses it on failure; a flow that wants its jobs cancelled
when it fails adds it itself::

    @flow(on_failure=[cancel_flow_run_jobs])
    def my_flow(): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect import flow

from core.specs import AppHandle, AppState, AppStatus, CfgVal
from core.watch import effective_max_silence
from prefect_tasks.blocks import SlurmCluster
from prefect_tasks.jobs import async_twin, cancel_flow_run_jobs, guard_flow_run, resolve_app
from prefect_tasks.tasks import (
    DEFAULT_CANCEL_CHECK_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    get_job_result,
    submit_job,
    wait_for_job,
)

__all__ = ["JobResult", "cancel_flow_run_jobs", "run_job", "run_job_async"]


@dataclass(frozen=True)
class JobResult:
    """What :func:`run_job` returns: the job's handle, its final status and what its replicas
    wrote to ``$SHIPYARD_RESULT_FILE`` (``result``: ``{role: {replica id: value}}``, see
    :func:`~prefect_tasks.tasks.get_job_result`)."""

    handle: AppHandle
    status: AppStatus
    result: dict[str, dict[int, Any]] = field(default_factory=dict)

    @property
    def state(self) -> AppState:
        """The job's final state (SUCCEEDED: ``run_job`` raises otherwise)."""
        return self.status.state


_HOOKS: dict[str, Any] = {
    "on_failure": [cancel_flow_run_jobs],
    "on_cancellation": [cancel_flow_run_jobs],
    "on_crashed": [cancel_flow_run_jobs],
}


@flow(name="shipyard-run-job", validate_parameters=False, **_HOOKS)
def run_job(
    app: Any,
    scheduler: str | None = None,
    cfg: Mapping[str, CfgVal] | None = None,
    workspace: str | None = None,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    stream_logs: bool = True,
    cancel_check_interval: float | None = DEFAULT_CANCEL_CHECK_INTERVAL,
    cluster: SlurmCluster | str | None = None,
    max_silence: float | None = None,
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
        cluster: a :class:`~prefect_tasks.blocks.SlurmCluster` block (or a saved one's name) to
            run on (the scheduler is then ``slurm`` unless given)
        max_silence: seconds a running replica may go without a log line; past that the job is
            cancelled (:class:`core.errors.JobSilentError`). None: the app's own (its
            ``metadata.max_silence``), else no limit

    Retrying the flow (``run_job.with_options(retries=2)``) re-attaches to a job still running
    or succeeded and runs a failed job again. A timeout, a cancelled flow run or SIGTERM cancels
    the job.

    Raises:
        core.runner.AppFailedError: the job did not succeed (state, exit codes, last log lines).
    """
    appdef = resolve_app(app)  # (bad input fails here, before anything starts)
    limit = effective_max_silence(max_silence, appdef)
    handle = submit_job(appdef, scheduler, cfg, workspace, cluster=cluster)
    status = wait_for_job(
        handle,
        cluster=cluster,
        timeout=timeout,
        poll_interval=poll_interval,
        stream_logs=stream_logs,
        cancel_check_interval=cancel_check_interval,
        max_silence=limit,
    )
    try:
        result = get_job_result.fn(handle, cluster=cluster)
    except NotImplementedError:  # a scheduler that collects no results
        result = {}
    return JobResult(handle, status, result)


run_job_async = flow(name="shipyard-run-job", validate_parameters=False, **_HOOKS)(
    async_twin(
        run_job.fn,
        """:func:`run_job` for async flows (same arguments, result and errors): its body runs in a
        thread, and an interrupted flow (a timeout, a cancellation) cancels the job.""",
        before=guard_flow_run,
    )
)
