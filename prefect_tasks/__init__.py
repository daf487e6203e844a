"""Prefect 3 tasks and flows for Shipyard jobs, thin over :mod:`core.runner`.

>>> from prefect import flow
>>> from prefect_tasks import submit_job, wait_for_job
>>> @flow
... def train():
...     handle = submit_job("app.yaml", scheduler="local_cwd")
...     return wait_for_job(handle)  # logs stream to the run logger; raises if the job fails

or as a subflow: ``run_job("app.yaml")``. Async flows use the ``*_async`` twins.

Blocks (:class:`ShipyardBackend`, :class:`SlurmCluster`): ``prefect block register -m prefect_tasks``.
Deployments run as Shipyard jobs on a work pool of type ``shipyard`` (:mod:`prefect_tasks.worker`).
"""

from __future__ import annotations

from core.errors import JobCancelledError
from prefect_tasks.arrays import (
    ArrayResult,
    run_array_job,
    run_array_job_async,
    submit_array,
    submit_array_async,
    wait_for_array,
    wait_for_array_async,
)
from prefect_tasks.blocks import ShipyardBackend, SlurmCluster
from prefect_tasks.flows import JobResult, cancel_flow_run_jobs, run_job, run_job_async
from prefect_tasks.functions import run_function_job, shipyard_task
from prefect_tasks.tasks import (
    cancel_job,
    cancel_job_async,
    get_job_result,
    get_job_result_async,
    stream_job_logs,
    stream_job_logs_async,
    submit_job,
    submit_job_async,
    wait_for_job,
    wait_for_job_async,
)

__all__ = [
    "ArrayResult",
    "JobCancelledError",
    "JobResult",
    "ShipyardBackend",
    "SlurmCluster",
    "cancel_flow_run_jobs",
    "cancel_job",
    "cancel_job_async",
    "get_job_result",
    "get_job_result_async",
    "run_function_job",
    "run_job",
    "run_job_async",
    "run_array_job",
    "run_array_job_async",
    "submit_array",
    "submit_array_async",
    "wait_for_array",
    "wait_for_array_async",
    "shipyard_task",
    "stream_job_logs",
    "stream_job_logs_async",
    "submit_job",
    "submit_job_async",
    "wait_for_job",
    "wait_for_job_async",
]
