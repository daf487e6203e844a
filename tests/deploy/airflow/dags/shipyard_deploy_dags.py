"""DAGs the deployment tests (tests/deploy) trigger through the REST API.

The job of each is a shell script given in the run's conf (``script``), so one DAG serves
several tests; scripts that must wait for the test poll a ``gate`` file the test creates.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider.operators import ShipyardOperator
from airflow_provider.sensors import ShipyardJobSensor

START = datetime(2025, 1, 1)
# the job: two replicas of one role running the run's script
APP = {
    "name": "{{ params.name }}",
    "roles": [
        {
            "name": "job",
            "entrypoint": "sh",
            "args": ["-c", "{{ params.script }}"],
            "num_replicas": 2,
        }
    ],
}
PARAMS = {"name": "deploy", "script": "echo hello from ${replica_id}"}
# the task's "Shipyard job" extra link (a dashboard no test opens)
UI_URL = "https://dashboard.invalid/{scheduler}/{app_id}"

with DAG(
    dag_id="shipyard_deploy_deferrable",
    schedule=None,
    start_date=START,
    catchup=False,
    params=PARAMS,
    tags=["shipyard", "deploy-test"],
):
    ShipyardOperator(
        task_id="job",
        app=APP,
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=0.5,
        ui_url=UI_URL,
        execution_timeout=timedelta(minutes=10),
    )

with DAG(
    dag_id="shipyard_deploy_blocking",
    schedule=None,
    start_date=START,
    catchup=False,
    params=PARAMS,
    tags=["shipyard", "deploy-test"],
):
    ShipyardOperator(
        task_id="job",
        app=APP,
        scheduler="local_cwd",
        poll_interval=0.5,
        ui_url=UI_URL,
        retries=1,
        retry_delay=timedelta(seconds=1),
        execution_timeout=timedelta(minutes=10),
    )

# A deferrable task and a plain one share a pool of one slot: the plain one can only run while
# the deferrable one waits in the triggerer (a deferred task holds no slot).
with DAG(
    dag_id="shipyard_deploy_slot",
    schedule=None,
    start_date=START,
    catchup=False,
    params=PARAMS,
    tags=["shipyard", "deploy-test"],
):
    ShipyardOperator(
        task_id="deferred",
        app=APP,
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=0.5,
        pool="shipyard_deploy_one_slot",
        priority_weight=10,
    )
    ShipyardOperator(
        task_id="other",
        app={
            "name": "other",
            "roles": [{"name": "other", "entrypoint": "echo", "args": ["other ran"]}],
        },
        scheduler="local_cwd",
        poll_interval=0.5,
        pool="shipyard_deploy_one_slot",
        priority_weight=1,
    )

# A sensor in reschedule mode: each poke is a short run of the task, between scheduler loops.
with DAG(
    dag_id="shipyard_deploy_reschedule",
    schedule=None,
    start_date=START,
    catchup=False,
    params=PARAMS,
    tags=["shipyard", "deploy-test"],
):
    submit = ShipyardOperator(
        task_id="submit", app=APP, scheduler="local_cwd", wait_for_completion=False
    )
    wait = ShipyardJobSensor(
        task_id="wait",
        app_handle="{{ ti.xcom_pull(task_ids='submit') }}",
        mode="reschedule",
        poke_interval=1,
        timeout=600,
        stream_logs=True,
    )
    submit >> wait

# The deferrable sensor streaming the job's lines.
with DAG(
    dag_id="shipyard_deploy_deferrable_sensor",
    schedule=None,
    start_date=START,
    catchup=False,
    params=PARAMS,
    tags=["shipyard", "deploy-test"],
):
    submit = ShipyardOperator(
        task_id="submit", app=APP, scheduler="local_cwd", wait_for_completion=False
    )
    wait = ShipyardJobSensor(
        task_id="wait",
        app_handle="{{ ti.xcom_pull(task_ids='submit') }}",
        deferrable=True,
        poke_interval=0.5,
        timeout=600,
        stream_logs=True,
    )
    submit >> wait

# A deferred job on the Docker engine: its CPU time and peak are sampled by the triggerer
# (the engine keeps none after the container exits) and reach the worker in the trigger event.
with DAG(
    dag_id="shipyard_deploy_docker_deferrable",
    schedule=None,
    start_date=START,
    catchup=False,
    params=PARAMS,
    tags=["shipyard", "deploy-test"],
):
    ShipyardOperator(
        task_id="job",
        app={
            "name": "{{ params.name }}",
            "roles": [
                {
                    "name": "job",
                    "image": "shipyard-test/busybox:latest",
                    "entrypoint": "sh",
                    "args": ["-c", "{{ params.script }}"],
                }
            ],
        },
        scheduler="local_docker",
        deferrable=True,
        poll_interval=0.5,
        execution_timeout=timedelta(minutes=10),
    )

# A Slurm job of one replica taking a whole node (an urgent job there preempts it), requeued
# up to the run's max_requeues times.
with DAG(
    dag_id="shipyard_deploy_slurm_requeue",
    schedule=None,
    start_date=START,
    catchup=False,
    params={**PARAMS, "max_requeues": 0},
    render_template_as_native_obj=True,
    tags=["shipyard", "deploy-test"],
):
    ShipyardOperator(
        task_id="job",
        app={
            "name": "{{ params.name }}",
            "roles": [
                {
                    "name": "job",
                    "entrypoint": "sh",
                    "args": ["-c", "{{ params.script }}"],
                    "resource": {"cpu": 2, "gpu": 0, "memMB": 512},
                }
            ],
        },
        scheduler="slurm",
        cfg={"max_requeues": "{{ params.max_requeues }}"},
        poll_interval=0.5,
        execution_timeout=timedelta(minutes=10),
    )


def _one(name: str, script: str, image: str = "", mem: int = 0) -> dict[str, object]:
    """An app of one replica running ``script``."""
    role: dict[str, object] = {"name": name, "entrypoint": "sh", "args": ["-c", script]}
    if image:
        role["image"] = image
    if mem:
        role["resource"] = {"cpu": 1, "gpu": 0, "memMB": mem}
    return {"name": name, "roles": [role]}


# Why a job ended (issue 27): one task per reason, each pushing XCom reason; blocking and
# deferred, Docker and local processes.
with DAG(
    dag_id="shipyard_deploy_reasons",
    schedule=None,
    start_date=START,
    catchup=False,
    tags=["shipyard", "deploy-test"],
):
    BUSYBOX = "shipyard-test/busybox:latest"
    ShipyardOperator(
        task_id="oom",
        app=_one("oom", "head -c 300m /dev/zero | tail", BUSYBOX, 64),
        scheduler="local_docker",
        deferrable=True,
        poll_interval=0.5,
    )
    ShipyardOperator(
        task_id="timeout",
        app=_one("limited", "sleep 300", BUSYBOX),
        scheduler="local_docker",
        cfg={"time_limit": "2s", "stop_timeout": 1},
        poll_interval=0.5,
    )
    ShipyardOperator(
        task_id="silent",
        app=_one("hangs", "echo started; sleep 300"),
        scheduler="local_cwd",
        max_silence=2,
        deferrable=True,
        poll_interval=0.5,
    )
    ShipyardOperator(task_id="signal", app=_one("killed", "kill -9 $$"), scheduler="local_cwd")
    upstream = ShipyardOperator(
        task_id="upstream",
        app=_one("upstream", "exit 3"),
        scheduler="local_cwd",
        wait_for_completion=False,
    )
    dependent = ShipyardOperator(
        task_id="dependent",
        app=_one("dependent", "echo never"),
        scheduler="local_cwd",
        after="{{ ti.xcom_pull(task_ids='upstream') }}",
        deferrable=True,
        poll_interval=0.5,
    )
    upstream >> dependent

with DAG(
    dag_id="shipyard_deploy_function",
    schedule=None,
    start_date=START,
    catchup=False,
    params={"name": "deploy", "n": 4},
    tags=["shipyard", "deploy-test"],
):
    # (a function of this DAG file: it travels by value to the job, and back as the XCom)
    @task.shipyard(
        task_id="train",
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=0.5,
        execution_timeout=timedelta(minutes=10),
    )
    def train(name: str, n: str) -> dict[str, object]:
        import os

        print(f"training {name} on {n} samples", flush=True)
        return {"name": name, "losses": [1 / (i + 1) for i in range(int(n))], "pid": os.getpid()}

    train("{{ params.name }}", "{{ params.n }}")
