"""One Airflow home (SQLite, no example DAGs) per test session, set up before Airflow is imported.

Two DAG bundles: the example DAGs of ``dags/`` and the test DAGs of
``tests/integration/airflow/dags/`` (``dag.test()`` only runs DAGs that live in a bundle).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from tests.helpers import ROOT

REPO = ROOT
EXAMPLE_DAGS = REPO / "dags"
TEST_DAGS = Path(__file__).resolve().parent / "dags"

_MARK = "SHIPYARD_TEST_AIRFLOW_HOME"


def configure() -> Path:
    """Points Airflow at a fresh temporary home (once per process); returns it."""
    if os.environ.get(_MARK):
        return Path(os.environ[_MARK])
    if "airflow" in sys.modules:
        raise RuntimeError("airflow was imported before the test Airflow home was configured")
    home = Path(tempfile.mkdtemp(prefix="shipyard-airflow-"))
    bundles = [
        {
            "name": name,
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(path), "refresh_interval": 0},
        }
        for name, path in (("shipyard-examples", EXAMPLE_DAGS), ("shipyard-tests", TEST_DAGS))
    ]
    os.environ.update(
        {
            _MARK: str(home),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(EXAMPLE_DAGS),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False",
        }
    )
    return home


def migrate() -> None:
    """Creates the metadata database (idempotent)."""
    from airflow.utils import db

    db.upgradedb()
