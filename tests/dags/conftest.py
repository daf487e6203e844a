from __future__ import annotations

from tests.airflow_provider.airflow_env import configure

configure()

from tests.airflow_provider.fixtures import *  # noqa: E402,F403
