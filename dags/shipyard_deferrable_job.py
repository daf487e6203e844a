"""Wait for Shipyard jobs in the triggerer instead of on a worker (deferrable mode).

``train`` submits a local two-replica job and defers to ``ShipyardJobTrigger``: the worker
slot is freed while the job runs, the trigger streams the job's lines into the task log and the
task resumes only to check the result. ``submit`` starts a second job without waiting, and
``wait`` is a deferrable sensor on its handle that also puts that job's lines in its log.

Run it without a scheduler: ``python dags/shipyard_deferrable_job.py`` (after ``airflow db
migrate``); ``dag.test()`` runs the triggers in-process.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider.operators import ShipyardOperator
from airflow_provider.sensors import ShipyardJobSensor
from core.specs import AppDef, Role

with DAG(
    dag_id="shipyard_deferrable_job",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["shipyard", "example"],
) as dag:
    train = ShipyardOperator(
        task_id="train",
        app=AppDef(
            name="train",
            roles=[
                Role(
                    name="trainer",
                    entrypoint="sh",
                    args=[
                        "-c",
                        'for i in 1 2 3; do echo "trainer ${replica_id}: step $i"; sleep 1; done',
                    ],
                    num_replicas=2,
                )
            ],
        ),
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=1.0,
        execution_timeout=timedelta(minutes=10),
    )

    submit = ShipyardOperator(
        task_id="submit",
        app={
            "name": "postprocess",
            "roles": [
                {"name": "post", "entrypoint": "sh", "args": ["-c", "sleep 1; echo post done"]}
            ],
        },
        scheduler="local_cwd",
        wait_for_completion=False,
    )

    wait = ShipyardJobSensor(
        task_id="wait",
        app_handle="{{ ti.xcom_pull(task_ids='submit') }}",
        deferrable=True,
        stream_logs=True,  # the job's lines in this task's log too
        poke_interval=1.0,
        timeout=600,
    )

    train >> submit >> wait


if __name__ == "__main__":
    run = dag.test()
    raise SystemExit(0 if run.state == "success" else 1)
