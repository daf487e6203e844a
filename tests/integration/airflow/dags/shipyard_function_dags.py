"""A test DAG of ``@task.shipyard`` (issue 29): a function run as a Shipyard job, its return
value the task's XCom and a downstream task's argument, waiting on the worker and deferred;
and a function whose exception fails its task."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

SCHEDULER = os.environ.get("SHIPYARD_TEST_AIRFLOW_SCHEDULER", "local_cwd")


class NotEnoughData(Exception):
    """The function's own exception (defined in the DAG file: it travels by value)."""


with DAG(
    "shipyard_test_function", schedule=None, start_date=datetime(2025, 1, 1), catchup=False
) as function_dag:

    @task
    def seed() -> int:
        return 6

    for mode, deferrable in (("blocking", False), ("deferred", True)):

        @task.shipyard(
            task_id=f"train_{mode}", scheduler=SCHEDULER, poll_interval=0.5, deferrable=deferrable
        )
        def train(n: int, *, scale: int = 1, tag: str = "", linger: float = 0) -> dict[str, Any]:
            import time

            print(f"training on {n} samples", flush=True)
            time.sleep(linger)  # (the deferred one still runs when its task decides to defer)
            return {"loss": 1 / (n * scale), "tag": tag, "pid": os.getpid()}

        @task(task_id=f"use_{mode}")
        def use(result: dict[str, Any]) -> float:
            return result["loss"] * 12

        use(train(seed(), scale=2, tag="{{ dag_run.run_id }}", linger=2.0 if deferrable else 0))

    @task.shipyard(task_id="short", scheduler=SCHEDULER, poll_interval=0.5, retries=0)
    def short(n: int) -> None:
        raise NotEnoughData(f"only {n} samples")

    short(3)
