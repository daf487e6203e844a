"""A test DAG of the operator's outcome options (issue 29): ``return_result``,
``skip_on_exit_code`` and ``do_xcom_push=False``, each waiting on the worker and deferred."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_provider.operators import ShipyardOperator
from core.specs import AppDef, Role

SCHEDULER = os.environ.get("SHIPYARD_TEST_AIRFLOW_SCHEDULER", "local_cwd")

#: replica 0 writes {"loss": 0.25, "rank": 0} as its result
WRITE_RESULT = (
    "import json, os; open(os.environ['SHIPYARD_RESULT_FILE'], 'w').write("
    "json.dumps({'loss': 0.25, 'rank': int(os.environ['SHIPYARD_REPLICA_ID'])}))"
)


def _app(name: str, script: str, wait: float) -> AppDef:
    """``script`` after ``wait`` seconds (a deferred task defers only while its job runs)."""
    return AppDef(name, [Role(name, entrypoint="sh", args=["-c", f"sleep {wait}; {script}"])])


def _result_app(wait: float) -> AppDef:
    return _app("train", f'python3 -c "{WRITE_RESULT}"', wait)


with DAG(
    "shipyard_test_outcome", schedule=None, start_date=datetime(2025, 1, 1), catchup=False
) as outcome_dag:
    for mode, deferrable in (("blocking", False), ("deferred", True)):
        wait = 2.0 if deferrable else 0.0
        train = ShipyardOperator(
            task_id=f"train_{mode}",
            app=_result_app(wait),
            scheduler=SCHEDULER,
            poll_interval=0.5,
            deferrable=deferrable,
            return_result=True,
        )

        @task(task_id=f"use_{mode}")
        def use(result: Any) -> float:
            """A downstream task gets the job's result as its argument."""
            return float(result["train"]["0"]["loss"]) * 4

        use(train.output)
        ShipyardOperator(
            task_id=f"skip_{mode}",
            app=_app("skip", "echo 'nothing to do'; exit 99", wait),
            scheduler=SCHEDULER,
            poll_interval=0.5,
            deferrable=deferrable,
            skip_on_exit_code=[99, 100],
        )
        ShipyardOperator(
            task_id=f"quiet_{mode}",
            app=_result_app(wait),
            scheduler=SCHEDULER,
            poll_interval=0.5,
            deferrable=deferrable,
            do_xcom_push=False,
        )
