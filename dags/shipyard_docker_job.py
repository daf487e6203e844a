"""Run a Shipyard job in Docker containers from a DAG.

``greet`` runs three replicas of a role in the image ``$SHIPYARD_TEST_IMAGE`` (default
``shipyard-test/busybox:latest``, built locally by ``scripts/build_test_images.sh``) on the
``local_docker`` scheduler; each container's output lands in the task log as ``greeter/k ...``.
``check`` then verifies the job's final state and greeter/0's result from the XComs the operator
pushed.

Run it without a scheduler: ``python dags/shipyard_docker_job.py`` (after ``airflow db migrate``).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_provider.operators import ShipyardOperator
from core.specs import AppDef, Role

IMAGE = os.environ.get("SHIPYARD_TEST_IMAGE", "shipyard-test/busybox:latest")

with DAG(
    dag_id="shipyard_docker_job",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["shipyard", "example"],
) as dag:
    greet = ShipyardOperator(
        task_id="greet",
        app=AppDef(
            name="greet",
            roles=[
                Role(
                    name="greeter",
                    image=IMAGE,
                    entrypoint="sh",
                    # role args and env are Jinja-templated too
                    # greeter/0's $SHIPYARD_RESULT_FILE (copied out of its container) is the
                    # task's "result" XCom
                    args=[
                        "-c",
                        'echo "hello from container ${replica_id} of {{ dag.dag_id }}";'
                        ' echo \'{"greeted": ${replica_id}}\' > "$SHIPYARD_RESULT_FILE"',
                    ],
                    env={"RUN_ID": "{{ run_id }}"},
                    num_replicas=3,
                )
            ],
        ),
        scheduler="local_docker",
        poll_interval=1.0,
    )

    @task
    def check(state: str, app_id: str, result: dict[str, dict[str, object]]) -> None:
        if state != "SUCCEEDED":
            raise ValueError(f"job {app_id} ended {state}")
        if result.get("greeter", {}).get("0") != {"greeted": 0}:
            raise ValueError(f"job {app_id}: greeter/0 gave no result ({result})")

    check(
        state=greet.output["state"],  # type: ignore[arg-type]
        app_id=greet.output["app_id"],  # type: ignore[arg-type]
        result=greet.output["result"],  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    run = dag.test()
    raise SystemExit(0 if run.state == "success" else 1)
