"""Example: a Prefect flow that runs a multi-role Shipyard job on this machine.

Run it with::

    python -m prefect_tasks.examples

Without ``PREFECT_API_URL`` configured, Prefect starts a temporary local server for the run (this
takes some seconds); with it, the run shows up in that server's UI. The flow runs a job of two
roles on the local scheduler (``local_cwd``): a ``coordinator`` and two ``worker`` replicas. Their
log lines appear in the flow's logs as they are printed, prefixed with ``role/replica``.

The same flow written with the individual tasks::

    @flow
    def train():
        handle = submit_job(APP)                                   # -> "local_cwd://..."
        errors = stream_job_logs.submit(handle, regex="ERROR")     # follows while we wait
        status = wait_for_job(handle, stream_logs=False)           # raises if the job fails
        return status, errors.result()
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger

from prefect_tasks.flows import JobResult, run_job

#: the job: one coordinator and two workers, each saying a few lines (an app file, as a dict)
APP: dict[str, Any] = {
    "name": "prefect-example",
    "roles": [
        {
            "name": "coordinator",
            "entrypoint": "sh",
            "args": ["-c", "echo 'coordinating 2 workers'; sleep 1; echo 'all workers reported'"],
        },
        {
            "name": "worker",
            "entrypoint": "sh",
            "args": [
                "-c",
                'for step in 1 2 3; do echo "worker $0: step $step of 3"; sleep 0.2; done',
                "${replica_id}",
            ],
            "num_replicas": 2,
        },
    ],
}


@flow(name="shipyard-example")
def example_flow(scheduler: str = "local_cwd") -> JobResult:
    """Runs :data:`APP` on ``scheduler`` through the ``run_job`` subflow and reports the result."""
    result = run_job(APP, scheduler=scheduler)
    codes = ", ".join(f"{role}={codes}" for role, codes in result.status.exit_codes().items())
    get_run_logger().info("%s %s (exit codes: %s)", result.handle, result.state.name, codes)
    return result


def main() -> int:
    """Runs :func:`example_flow`; returns the process exit code (0 when the job succeeded)."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    updates: dict[Any, Any] = {}
    if not PREFECT_API_URL.value():
        # the temporary server: no telemetry from it, and time to start on a busy machine
        updates[PREFECT_SERVER_ANALYTICS_ENABLED] = False
        if PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() < 120:
            updates[PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS] = 120
    with temporary_settings(updates):
        state = example_flow(return_state=True)
    if not state.is_completed():
        print(f"example flow ended {state.name}: {state.message}", file=sys.stderr)
        return 1
    result = state.result()
    print(f"example flow: job {result.handle} {result.state.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
