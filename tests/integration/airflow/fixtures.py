"""Fixtures for running DAGs with ``dag.test()`` on the session's SQLite Airflow home."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow.airflow_env import EXAMPLE_DAGS, TEST_DAGS, migrate

__all__ = ["DagResult", "airflow_db", "load_dag", "run_dag"]

_migrated = False
# what the console log renderer appends after a message: padding, [logger] and loc=file:line
_TAIL = re.compile(r"\s*\[[\w.]+\](\s+\S+=\S+)*\s*$")


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """The metadata database, created once per session."""
    global _migrated
    if not _migrated:
        migrate()
        _migrated = True


def load_dag(dag_id: str) -> Any:
    """Imports the DAG ``dag_id`` from its file in dags/ or tests/integration/airflow/dags/."""
    for folder in (EXAMPLE_DAGS, TEST_DAGS):
        for path in sorted(folder.glob("*.py")):
            if dag_id in path.read_text():
                mod = _import(path)
                for value in vars(mod).values():
                    if getattr(value, "dag_id", None) == dag_id and hasattr(value, "test"):
                        return value
    raise LookupError(f"no DAG {dag_id}")


def _import(path: Path) -> Any:
    name = f"_shipyard_dag_{path.parent.name}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass
class DagResult:
    """What a ``dag.test()`` run left: the run, its task states, its log and its XComs."""

    dag_run: Any
    states: dict[str, str]
    log: str

    @property
    def state(self) -> str:
        return str(self.dag_run.state)

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            row = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == self.dag_run.dag_id,
                    XComModel.run_id == self.dag_run.run_id,
                    XComModel.task_id == task_id,
                    XComModel.key == key,
                )
            ).first()
            return None if row is None else XComModel.deserialize_value(row)

    def task_instance(self, task_id: str) -> Any:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            ti = session.scalars(
                select(TaskInstance).where(
                    TaskInstance.dag_id == self.dag_run.dag_id,
                    TaskInstance.run_id == self.dag_run.run_id,
                    TaskInstance.task_id == task_id,
                )
            ).one()
            session.expunge(ti)
            return ti

    def lines(self, needle: str) -> list[str]:
        return [line for line in self.log.splitlines() if needle in line]

    def job_lines(self, prefix: str) -> list[str]:
        """The job's lines starting with ``prefix`` (e.g. ``"trainer/0 "``), in log order.

        Only the message is kept: the timestamp, level, logger name and source location that
        Airflow's console log adds around it are cut off.
        """
        out = []
        for line in self.log.splitlines():
            at = line.find(prefix)
            if (
                at < 0
                or "operators.ShipyardOperator" not in line
                and "ShipyardJobTrigger" not in line
            ):
                continue
            out.append(_TAIL.sub("", line[at:]))
        return out


@pytest.fixture
def run_dag(
    airflow_db: None, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> Callable[..., DagResult]:
    """Runs a DAG (object or id) with ``dag.test()`` and returns a :class:`DagResult`.

    The log is what the run wrote to stdout/stderr (the task logs, job lines included) followed
    by the records of Airflow's standard-library loggers (e.g. ``[DAG TEST] ...``).
    """

    def run(dag: Any, **kwargs: Any) -> DagResult:
        if isinstance(dag, str):
            dag = load_dag(dag)
        caplog.set_level(logging.INFO)
        caplog.clear()
        capfd.readouterr()
        try:
            dag_run = dag.test(**kwargs)
        finally:
            out, err = capfd.readouterr()
            # keep the output visible in pytest's report of a failing test
            sys.stdout.write(out)
            sys.stderr.write(err)
        states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
        return DagResult(dag_run=dag_run, states=states, log=out + err + caplog.text)

    return run
