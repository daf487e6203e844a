"""The operator's outcome options inside real task runs (``dag.test()``, the local backend),
waiting on the worker and deferred: ``return_result``, ``skip_on_exit_code``,
``do_xcom_push=False``."""

from __future__ import annotations

from typing import Any

import pytest

from core.specs import parse_app_handle

pytestmark = pytest.mark.airflow


def xcom_keys(result: Any, task_id: str) -> list[str]:
    """Every XCom key the task instance has."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return sorted(
            session.scalars(
                select(XComModel.key).where(
                    XComModel.dag_id == result.dag_run.dag_id,
                    XComModel.run_id == result.dag_run.run_id,
                    XComModel.task_id == task_id,
                )
            )
        )


def test_result_skip_and_no_xcoms_blocking_and_deferred(run_dag: Any) -> None:
    result = run_dag("shipyard_test_outcome")
    # (each task of the deferred half deferred)
    assert result.log.count("[DAG TEST] running trigger in line") == 3
    for mode in ("blocking", "deferred"):
        assert result.states[f"train_{mode}"] == "success"
        assert result.xcom(f"train_{mode}") == {"train": {"0": {"loss": 0.25, "rank": 0}}}
        handle = result.xcom(f"train_{mode}", "shipyard_app_handle")
        assert parse_app_handle(handle).scheduler_backend == "local_cwd"
        assert result.xcom(f"train_{mode}", "result") is None  # (once: as the return value)
        assert (result.states[f"use_{mode}"], result.xcom(f"use_{mode}")) == ("success", 1.0)

        assert result.states[f"skip_{mode}"] == "skipped"
        assert result.xcom(f"skip_{mode}", "state") == "FAILED"

        assert result.states[f"quiet_{mode}"] == "success"
        # only the extra link's, which Airflow itself stores for every task with a link
        # (empty: no URL template here), whatever do_xcom_push says
        assert xcom_keys(result, f"quiet_{mode}") == ["_link_ShipyardJobLink"]
        assert not result.xcom(f"quiet_{mode}", "_link_ShipyardJobLink")
    assert len(result.lines("exit code 99, which is in skip_on_exit_code [99, 100]")) >= 2
