"""Run a Shipyard job on a Slurm cluster from a DAG.

``simulate`` submits a two-role app (a coordinator and two workers) as one heterogeneous Slurm
job, waits for it and streams each replica's output into the task log; what the coordinator
writes to ``$SHIPYARD_RESULT_FILE`` comes back as the task's ``result`` XCom. Slurm options go
in ``cfg`` (templated); here the partition and a time limit.

The cluster is the worker's own Slurm unless the run's ``shipyard_conn_id`` param names an
Airflow connection (type ``shipyard``: an SSH login node or slurmrestd, with its key or token),
e.g. ``airflow dags trigger shipyard_slurm_job --conf '{"shipyard_conn_id": "hpc1"}'``.

Run it without a scheduler: ``python dags/shipyard_slurm_job.py`` (after ``airflow db migrate``).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider.operators import ShipyardOperator

with DAG(
    dag_id="shipyard_slurm_job",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    params={"partition": "debug", "shipyard_conn_id": ""},
    tags=["shipyard", "example"],
) as dag:
    simulate = ShipyardOperator(
        task_id="simulate",
        app={
            "name": "simulate",
            "roles": [
                {
                    "name": "coordinator",
                    "entrypoint": "sh",
                    # what it writes to $SHIPYARD_RESULT_FILE is the task's "result" XCom
                    "args": [
                        "-c",
                        'echo "coordinator on $(hostname): run {{ run_id }}";'
                        ' printf \'{"run": "%s"}\' "{{ run_id }}" > "$SHIPYARD_RESULT_FILE"',
                    ],
                },
                {
                    "name": "worker",
                    "entrypoint": "sh",
                    "args": [
                        "-c",
                        'echo "worker ${replica_id}: step 1"; echo "worker ${replica_id}: done"',
                    ],
                    "num_replicas": 2,
                },
            ],
        },
        scheduler="slurm",
        cfg={"partition": "{{ params.partition }}", "time": "5"},
        shipyard_conn_id="{{ params.shipyard_conn_id }}",
        poll_interval=1.0,
    )


if __name__ == "__main__":
    run = dag.test()
    raise SystemExit(0 if run.state == "success" else 1)
