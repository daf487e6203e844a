"""Fixtures for the tests that drive the real Prefect server and Shipyard worker
(scripts/start_prefect.sh).

Under CI (``CI=true``) a missing or unhealthy deployment fails these tests; elsewhere they are
skipped with the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.prefect.prefect_api import (
    HOME,
    STATE_DIR,
    api_url,
    pool_name,
    prefect_cli,
    prefect_problem,
)
from tests.services import require

pytest.importorskip("prefect")


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """The real server's API URL, set for this process's Prefect client; the Shipyard pool
    exists (made as users make one, ``prefect work-pool create -t shipyard``, if missing)."""
    require("prefect", prefect_problem())
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url()}):
        pools = prefect_cli("work-pool", "ls").stdout
        if pool_name() not in pools:
            prefect_cli("work-pool", "create", "-t", "shipyard", pool_name())
        yield api_url()


@pytest.fixture
def deploy_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Shipyard runner that sees the jobs the worker started."""
    from core.runner import get_runner

    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(STATE_DIR))
    with get_runner() as runner:
        yield runner


@pytest.fixture
def gate() -> Iterator[Path]:
    """A file path the test's flow waits for; removed afterwards."""
    path = HOME / "work" / f"gate-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)
    Path(str(path) + ".started").unlink(missing_ok=True)
