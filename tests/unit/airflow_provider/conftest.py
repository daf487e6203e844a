from __future__ import annotations

from tests.integration.airflow.airflow_env import configure

configure()  # (before anything imports Airflow: a home of the session's own, on SQLite)
