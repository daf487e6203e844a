from __future__ import annotations

from tests.integration.airflow.airflow_env import configure

configure()

from tests.integration.airflow.fixtures import *  # noqa: E402,F403
