"""Fixtures for the Prefect tests: one temporary Prefect server (``prefect_test_harness``) for the
whole session, started on first use, and a unique app name per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("prefect")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A temporary Prefect server on SQLite for the session; yields its API URL."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings({PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        with prefect_test_harness(server_startup_timeout=180):
            yield str(PREFECT_API_URL.value())


@pytest.fixture(autouse=True)
def _prefect(prefect_server: str) -> str:
    return prefect_server


@pytest.fixture
def name() -> str:
    """A unique app name for the test."""
    return f"pt-{uuid.uuid4().hex[:10]}"
