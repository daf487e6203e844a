"""The stress suite: load, concurrency and polling cost on the real backends.

Every test here is marked ``stress`` and sized to finish in a few minutes on 2 cores (CI runs it as
part of the default ``pytest``). Scale it up with ``SHIPYARD_STRESS_SCALE`` (a multiplier).
Deselect it with ``-m "not stress"``.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stress: load and concurrency tests (tests/stress)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.stress)


def scaled(n: int) -> int:
    """``n`` times ``SHIPYARD_STRESS_SCALE`` (default 1), at least 1."""
    return max(1, round(n * float(os.environ.get("SHIPYARD_STRESS_SCALE", "1"))))
