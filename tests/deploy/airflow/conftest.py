"""Fixtures for the tests that drive the real Airflow deployment (scripts/start_airflow.sh).

Under CI (``CI=true``) a missing or unhealthy deployment fails these tests; elsewhere they are
skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.airflow.airflow_api import HOME, STATE_DIR, AirflowAPI, airflow_problem
from tests.services import require


@pytest.fixture(scope="session")
def airflow_api() -> Iterator[AirflowAPI]:
    """The deployment's REST API, logged in as its admin."""
    require("airflow", airflow_problem())
    api = AirflowAPI()
    yield api
    api.close()


@pytest.fixture
def deploy_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Shipyard runner that sees the local jobs the deployment started."""
    from core.runner import get_runner

    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(STATE_DIR))
    with get_runner() as runner:
        yield runner


@pytest.fixture
def gate() -> Iterator[Path]:
    """A file path the test's job waits for (``while [ ! -e GATE ]``); removed afterwards."""
    import uuid

    path = HOME / "work" / f"gate-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)
