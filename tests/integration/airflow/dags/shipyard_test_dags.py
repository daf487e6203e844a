"""DAGs for the provider's tests (each a scenario); they live in the test DAG bundle."""

from __future__ import annotations

import os
import tempfile
import threading
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_provider.operators import ShipyardOperator
from airflow_provider.sensors import ShipyardJobSensor
from core.specs import AppDef, Role, parse_app_handle

START = datetime(2025, 1, 1)
SCHEDULER = os.environ.get("SHIPYARD_TEST_AIRFLOW_SCHEDULER", "local_cwd")


def sh(name: str, script: str, replicas: int = 1) -> AppDef:
    """A one-role app running ``sh -c script``."""
    return AppDef(
        name=name,
        roles=[Role(name=name, entrypoint="sh", args=["-c", script], num_replicas=replicas)],
    )


def _dag(dag_id: str, **kwargs: object) -> DAG:
    return DAG(dag_id, schedule=None, start_date=START, catchup=False, **kwargs)  # type: ignore[arg-type]


with _dag("shipyard_test_failing") as failing_dag:
    ShipyardOperator(
        task_id="fail",
        app=sh("fail", "echo 'about to fail'; echo 'bad input on stderr' >&2; exit 3"),
        scheduler=SCHEDULER,
        poll_interval=0.5,
    )

with _dag("shipyard_test_deferred_failing") as deferred_failing_dag:
    ShipyardOperator(
        task_id="fail",
        app=sh("fail", "echo 'about to fail'; sleep 2; exit 4"),
        scheduler=SCHEDULER,
        deferrable=True,
        poll_interval=0.5,
    )

with _dag("shipyard_test_log_order") as log_order_dag:
    ShipyardOperator(
        task_id="count",
        app=sh(
            "count",
            'i=1; while [ "$i" -le 150 ]; do echo "line $i"; i=$((i + 1)); done',
            replicas=2,
        ),
        scheduler=SCHEDULER,
        poll_interval=0.5,
    )

with _dag("shipyard_test_timeout") as timeout_dag:
    ShipyardOperator(
        task_id="sleepy",
        app=sh("sleepy", "echo started; sleep 600; echo never"),
        scheduler=SCHEDULER,
        poll_interval=0.5,
        execution_timeout=timedelta(seconds=4),
    )

with _dag("shipyard_test_crash") as crash_dag:
    # the job runs until the file dag_run.conf["release"] exists (at most 60 s)
    ShipyardOperator(
        task_id="crash",
        app=sh(
            "crash",
            'echo started; i=0; while [ ! -e "$RELEASE" ] && [ "$i" -lt 600 ]; do'
            " sleep 0.1; i=$((i + 1)); done; echo finished",
        ),
        env={"RELEASE": "{{ dag_run.conf.get('release', '/nonexistent') }}"},
        scheduler=SCHEDULER,
        poll_interval=0.5,
        retries=2,
        retry_delay=timedelta(seconds=0),
    )

# Jobs that run until released: ``release_soon`` (a sensor's on_execute_callback) releases the
# job a second after the sensor started, so every sensor sees the job RUNNING first, however
# slowly the machine runs the tasks before it.
RELEASE_DIR = os.path.join(tempfile.gettempdir(), "shipyard-test-release")


def held_job(name: str) -> AppDef:
    return sh(
        name,
        f'i=0; while [ ! -e "{RELEASE_DIR}/${{app_id}}" ] && [ "$i" -lt 600 ]; do'
        " sleep 0.1; i=$((i + 1)); done; echo released",
    )


def release_soon(context: Any) -> None:
    ti = context["ti"]
    submit_id = ti.task_id.replace("wait_", "submit_")
    handle = ti.xcom_pull(task_ids=submit_id)
    path = os.path.join(RELEASE_DIR, parse_app_handle(handle).app_id)
    os.makedirs(RELEASE_DIR, exist_ok=True)
    threading.Timer(1.0, lambda: open(path, "w").close()).start()


with _dag("shipyard_test_sensor_modes") as sensor_modes_dag:
    # poke: sleeps between pokes; reschedule: gives the slot back and is rescheduled;
    # deferrable: waits in the trigger
    previous = None
    for mode in ("poke", "reschedule", "deferrable"):
        submit = ShipyardOperator(
            task_id=f"submit_{mode}",
            app=held_job(f"job-{mode}"),
            scheduler=SCHEDULER,
            wait_for_completion=False,
        )
        sensor = ShipyardJobSensor(
            task_id=f"wait_{mode}",
            app_handle=f"{{{{ ti.xcom_pull(task_ids='submit_{mode}') }}}}",
            mode="reschedule" if mode == "reschedule" else "poke",
            deferrable=mode == "deferrable",
            poke_interval=0.5 if mode != "reschedule" else 1,
            timeout=120,
            on_execute_callback=release_soon,
        )
        if previous is not None:
            previous >> submit
        submit >> sensor
        previous = sensor

with _dag("shipyard_test_sensor_failure") as sensor_failure_dag:
    submit_bad = ShipyardOperator(
        task_id="submit",
        app=sh("bad", "sleep 1; exit 7"),
        scheduler=SCHEDULER,
        wait_for_completion=False,
    )
    wait_bad = ShipyardJobSensor(
        task_id="wait",
        app_handle="{{ ti.xcom_pull(task_ids='submit') }}",
        poke_interval=0.5,
        timeout=3600,
        retries=3,
    )
    submit_bad >> wait_bad

with _dag("shipyard_test_mapped") as mapped_dag:
    ShipyardOperator.partial(
        task_id="shard",
        app=sh("shard", 'echo "shard $SHARD"'),
        scheduler=SCHEDULER,
        poll_interval=0.5,
    ).expand(env=[{"SHARD": "a"}, {"SHARD": "b"}])
