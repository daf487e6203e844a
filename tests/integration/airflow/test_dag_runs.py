"""The provider inside real Airflow task runs: ``dag.test()`` on SQLite, the real local backend."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider._common import idempotency_key
from core.runner import attempt_key
from core.specs import AppState
from tests.helpers import wait_until
from tests.integration.airflow.airflow_env import REPO

pytestmark = pytest.mark.airflow


def test_failing_job_fails_its_task_with_the_exit_code(run_dag: Any) -> None:
    result = run_dag("shipyard_test_failing")
    assert result.state == "failed"
    assert result.states == {"fail": "failed"}
    assert "ShipyardJobFailedError" in result.log
    assert "exit codes: fail/0=3" in result.log
    # the error carries the last lines; the task log got the lines as they were produced
    assert "bad input on stderr" in result.log
    assert result.lines("fail/0 about to fail")
    assert result.xcom("fail", "state") == "FAILED"


def test_deferred_failing_job_fails_its_task_with_the_exit_code(run_dag: Any) -> None:
    result = run_dag("shipyard_test_deferred_failing")
    assert result.states == {"fail": "failed"}
    assert "[DAG TEST] running trigger in line" in result.log
    assert "exit codes: fail/0=4" in result.log
    assert result.lines("fail/0 about to fail")


def test_task_log_has_the_job_lines_in_order(run_dag: Any) -> None:
    result = run_dag("shipyard_test_log_order")
    assert result.states == {"count": "success"}
    for replica in (0, 1):
        numbers = [
            int(m.group(1))
            for line in result.log.splitlines()
            if (m := re.search(rf"count/{replica} line (\d+)\b", line))
        ]
        assert numbers == list(range(1, 151)), f"replica {replica}: {numbers[:20]}..."


def test_execution_timeout_leaves_no_running_job(run_dag: Any, runner: Any) -> None:
    started = time.monotonic()
    result = run_dag("shipyard_test_timeout")
    assert result.states == {"sleepy": "failed"}
    assert time.monotonic() - started < 120  # not the job's 600 s
    assert "AirflowTaskTimeout" in result.log
    handle = runner.find(
        "local_cwd",
        idempotency_key("shipyard_test_timeout", result.dag_run.run_id, "sleepy", -1),
    )
    assert handle is not None
    status = wait_until(
        lambda: (s := runner.status(handle)) and s.is_terminal() and s, what="job end"
    )
    assert status.state == AppState.CANCELLED


def test_mapped_tasks_each_get_their_own_job(run_dag: Any, runner: Any) -> None:
    result = run_dag("shipyard_test_mapped")
    assert result.states == {"shard": "success"}
    run_id = result.dag_run.run_id
    handles = [
        runner.find("local_cwd", idempotency_key("shipyard_test_mapped", run_id, "shard", i))
        for i in (0, 1)
    ]
    assert None not in handles and handles[0] != handles[1]
    assert result.lines("shard/0 shard a") and result.lines("shard/0 shard b")


def test_sensor_in_poke_reschedule_and_deferrable_modes(run_dag: Any) -> None:
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    result = run_dag("shipyard_test_sensor_modes")
    modes = ("poke", "reschedule", "deferrable")
    assert result.states == {
        **{f"submit_{m}": "success" for m in modes},
        **{f"wait_{m}": "success" for m in modes},
    }
    for mode in modes:
        assert result.xcom(f"wait_{mode}") == "SUCCEEDED"
        # each job was still running when its sensor started: the sensors really waited
        assert result.xcom(f"submit_{mode}", "state") in ("SUBMITTED", "PENDING", "RUNNING")
    assert re.search(r"local_cwd://\S+/job-poke-\S+ is RUNNING", result.log)
    # reschedule mode gave its slot back at least once, within one try
    ti = result.task_instance("wait_reschedule")
    assert ti.try_number == 1
    with create_session() as session:
        reschedules = session.scalar(
            select(func.count()).select_from(TaskReschedule).where(TaskReschedule.ti_id == ti.id)
        )
    assert reschedules >= 1
    # the deferrable one waited in the trigger
    assert result.log.count("[DAG TEST] running trigger in line") == 1


def test_sensor_fails_fast_on_a_failure_state(run_dag: Any) -> None:
    started = time.monotonic()
    result = run_dag("shipyard_test_sensor_failure")
    assert result.states == {"submit": "success", "wait": "failed"}
    assert "is FAILED, not one of ['SUCCEEDED'] (exit codes: bad/0=7)" in result.log
    # no retries (3 were allowed) and no waiting for the hour-long timeout
    assert result.task_instance("wait").try_number == 1
    assert time.monotonic() - started < 120


_CRASH_SCRIPT = """
import sys
from datetime import datetime
from tests.integration.airflow.fixtures import load_dag
when = datetime.fromisoformat(sys.argv[1])
load_dag("shipyard_test_crash").test(logical_date=when, run_after=when, run_conf={"release": sys.argv[2]})
"""


def test_retry_after_worker_crash_reattaches_to_the_same_job(
    airflow_db: None, runner: Any, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    from tests.integration.airflow.fixtures import load_dag

    when = datetime.now(UTC).replace(microsecond=0)
    run_id = DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=when, run_after=when)
    key = idempotency_key("shipyard_test_crash", run_id, "crash", -1)
    release = tmp_path / "release"  # the job ends once this file exists

    # try 1 runs in a worker process of its own, which dies (SIGKILL) while the job runs
    worker = subprocess.Popen(
        [sys.executable, "-c", _CRASH_SCRIPT, when.isoformat(), str(release)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        handle = wait_until(lambda: runner.find("local_cwd", key), timeout=240, what="try 1's job")
        wait_until(
            lambda: runner.status(handle).state == AppState.RUNNING, what="try 1's job RUNNING"
        )
        # try 1 stored the handle in the task state store right after submitting it
        with create_session() as session:
            stored = wait_until(
                lambda: session.scalar(
                    select(TaskStateStoreModel.value).where(
                        TaskStateStoreModel.run_id == run_id,
                        TaskStateStoreModel.key == "shipyard_app_handle",
                    )
                ),
                what="the stored handle",
            )
        assert handle in stored
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert runner.status(handle).state == AppState.RUNNING  # the job outlived its worker

    # What the scheduler does with a task whose worker vanished and that has retries left: the
    # try is recorded as failed and try 2 is scheduled. Try 2 then runs through Airflow's own
    # in-process task runner (the one dag.test() uses) on the same DAG run.
    task = load_dag("shipyard_test_crash").task_dict["crash"]
    capfd.readouterr()
    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == "shipyard_test_crash", TaskInstance.run_id == run_id
            )
        ).one()
        assert (ti.try_number, ti.state) == (1, TaskInstanceState.RUNNING)
        ti.prepare_db_for_next_try(session)
        ti.try_number = 2
        ti.state = TaskInstanceState.SCHEDULED
        session.commit()
        ti_id = ti.id

        def release_once_try_2_runs() -> None:
            # let try 2 start and find the job still RUNNING, then let the job finish
            with create_session() as s2:
                wait_until(
                    lambda: (
                        s2.scalar(select(TaskInstance.state).where(TaskInstance.id == ti_id))
                        == TaskInstanceState.RUNNING
                    ),
                    timeout=240,
                    what="try 2 RUNNING",
                )
            time.sleep(3)  # not a synchronisation: either outcome below is a correct re-attach
            release.touch()

        releaser = threading.Thread(target=release_once_try_2_runs, daemon=True)
        releaser.start()
        _run_task(ti=ti, task=task)
        session.commit()
        releaser.join(60)
    log = capfd.readouterr().out

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == "shipyard_test_crash", TaskInstance.run_id == run_id
            )
        ).one()
        assert (ti.try_number, ti.state) == (2, TaskInstanceState.SUCCESS)
    assert "Reconnecting to existing job" in log or "Job already completed successfully" in log
    assert "crash/0 finished" in log
    # one job in the backend, not two
    assert runner.find("local_cwd", attempt_key(key, 2)) is None
    assert "submitted local_cwd://" not in log
    assert runner.status(handle).state == AppState.SUCCEEDED
