"""``@task.shipyard`` inside real task runs (``dag.test()``, the local backend), waiting on
the worker and deferred: the function's value is the task's XCom and reaches a downstream
task; its lines reach the task log; its exception fails the task, named with the job's
traceback."""

from __future__ import annotations

import os
from typing import Any

import pytest

from core.specs import parse_app_handle

pytestmark = pytest.mark.airflow


def test_value_lines_and_exception_blocking_and_deferred(run_dag: Any) -> None:
    result = run_dag("shipyard_test_function")
    assert "[DAG TEST] running trigger in line" in result.log  # (the deferred half deferred)
    for mode in ("blocking", "deferred"):
        assert result.states[f"train_{mode}"] == "success", result.states
        value = result.xcom(f"train_{mode}")
        assert value["loss"] == 1 / 12 and value["tag"] == result.dag_run.run_id, value
        assert value["pid"] != os.getpid()  # (it ran in a job, not in the task's process)
        handle = result.xcom(f"train_{mode}", "shipyard_app_handle")
        assert parse_app_handle(handle).scheduler_backend == "local_cwd"
        assert result.xcom(f"train_{mode}", "result") is None  # (once: as the return value)
        assert (result.states[f"use_{mode}"], result.xcom(f"use_{mode}")) == ("success", 1.0)
    assert len(result.lines("training on 6 samples")) >= 2
    assert result.states["short"] == "failed"
    assert result.lines("NotEnoughData: only 3 samples"), result.log[-3000:]
