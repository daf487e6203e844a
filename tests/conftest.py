from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import docker_problem, require, slurm_problem

# Local apps of the test run keep their state in a directory of their own (unless one is
# given), removed after a run that passed and kept, for a look, after one that failed.
_STATE = ""
if "SHIPYARD_STATE_DIR" not in os.environ:
    _STATE = tempfile.mkdtemp(prefix="shipyard-test-state-")
    os.environ["SHIPYARD_STATE_DIR"] = _STATE


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _STATE and exitstatus == pytest.ExitCode.OK:
        shutil.rmtree(_STATE, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    if _STATE and exitstatus != pytest.ExitCode.OK and os.path.isdir(_STATE):
        terminalreporter.write_line(f"local apps' state of this run kept in {_STATE}")


@pytest.fixture
def runner() -> Iterator[Any]:
    """A runner of the default session, closed after the test."""
    from core.runner import get_runner

    with get_runner() as r:
        yield r


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A Docker SDK client to the real engine (fails in CI, skips elsewhere, when missing)."""
    require("docker", docker_problem())
    import docker

    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Requires the real Slurm cluster (fails in CI, skips elsewhere, when missing)."""
    require("slurm", slurm_problem())
