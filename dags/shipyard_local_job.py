"""Run Shipyard jobs as local processes from a DAG.

* ``train`` submits a two-role app (2 trainers + 1 reporter) from the Jinja-templated app file
  ``apps/train.yaml`` and waits for it; the job's log lines show up in the task log, prefixed by
  ``role/replica``.
* ``sweep`` runs one app as an array: one element per learning rate (``array_params``, which
  could as well come from an upstream task's XCom), at most two at once; its XComs
  ``array_states`` and ``result`` have one entry per element.
* ``evaluate`` submits a second app (given as a dict) and returns at once with its handle.
* ``wait_for_evaluate`` is a sensor in a separate task that waits for that handle (pulled from
  XCom) to succeed.

Run it without a scheduler: ``python dags/shipyard_local_job.py`` (after ``airflow db migrate``).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider.operators import ShipyardOperator
from airflow_provider.sensors import ShipyardJobSensor

with DAG(
    dag_id="shipyard_local_job",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    params={"epochs": 3},
    tags=["shipyard", "example"],
) as dag:
    train = ShipyardOperator(
        task_id="train",
        app="apps/train.yaml",
        scheduler="local_cwd",
        env={"RUN_ID": "{{ run_id }}"},
        poll_interval=1.0,
    )

    sweep = ShipyardOperator(
        task_id="sweep",
        app={
            "name": "sweep",
            "roles": [
                {
                    "name": "point",
                    "entrypoint": "sh",
                    "args": [
                        "-c",
                        'echo "lr=${params.lr}"; echo "{\\"lr\\": ${params.lr}}" > "$SHIPYARD_RESULT_FILE"',
                    ],
                }
            ],
        },
        scheduler="local_cwd",
        array_params='[{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}]',
        max_parallel=2,
        poll_interval=1.0,
    )

    evaluate = ShipyardOperator(
        task_id="evaluate",
        app={
            "name": "evaluate",
            "roles": [
                {
                    "name": "evaluator",
                    "entrypoint": "sh",
                    "args": ["-c", "echo 'evaluating the model of {{ run_id }}'; sleep 1"],
                }
            ],
        },
        scheduler="local_cwd",
        wait_for_completion=False,
    )

    wait_for_evaluate = ShipyardJobSensor(
        task_id="wait_for_evaluate",
        app_handle="{{ ti.xcom_pull(task_ids='evaluate') }}",
        poke_interval=1.0,
        timeout=300,
    )

    train >> sweep >> evaluate >> wait_for_evaluate


if __name__ == "__main__":
    run = dag.test()
    raise SystemExit(0 if run.state == "success" else 1)
