"""A Docker engine that cannot be reached (issue 29): one line naming the engine's URL and
exit code 75 (the retryable one), instead of the SDK's raw text and exit 1. The engine is
"down" by pointing DOCKER_HOST at a socket or port where none listens; the real engine is
never stopped, and a last command through it shows it was the address that mattered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import BackendUnavailableError
from core.schedulers.docker.engine import DockerEngine, connect
from core.schedulers.docker.unreachable import EngineUnreachableError
from core.transient import is_transient
from tests.services import docker_problem, require

pytestmark = pytest.mark.docker

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def shipyard(*args: str, docker_host: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    if docker_host is not None:
        env["DOCKER_HOST"] = docker_host
    env["SHIPYARD_RETRY_BUDGET"] = "0"
    return subprocess.run([SHIPYARD, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "host, reason",
    [
        ("unix:///nonexistent/shipyard-test/docker.sock", "no socket at that path"),
        ("tcp://127.0.0.1:9", "connection refused"),
    ],
)
def test_every_command_exits_75_naming_the_engine(host: str, reason: str) -> None:
    expected = (
        "shipyard: error: backend unavailable (try again later):"
        f" Docker engine {host} (DOCKER_HOST): cannot connect ({reason})\n"
    )
    for args in (
        ["list", "-s", "local_docker"],
        ["status", "local_docker://shipyard/nope-1"],
        ["cancel", "local_docker://shipyard/nope-1"],
        ["log", "local_docker://shipyard/nope-1"],
        ["run", "-s", "local_docker", "--image", "busybox", "--", "true"],
        ["run", "-s", "local_docker", "--wait", "--image", "busybox", "--", "true"],
    ):
        r = shipyard(*args, docker_host=host)
        assert (r.returncode, r.stderr) == (75, expected), (args, r.returncode, r.stderr)
        assert r.stdout == ""
    # (the run options need no engine)
    assert shipyard("runopts", "local_docker", docker_host=host).returncode == 0


def test_the_same_commands_reach_the_real_engine() -> None:
    require("docker", docker_problem())
    r = shipyard("list", "-s", "local_docker", "--json", docker_host=None)
    assert r.returncode == 0, r.stderr


def test_the_error_is_transient_and_still_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    from docker.errors import DockerException

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EngineUnreachableError) as err:
        connect()
    assert isinstance(err.value, BackendUnavailableError) and is_transient(err.value)
    assert isinstance(err.value, DockerException)  # (callers catching the SDK's errors)
    # an engine given by a connection is named by it
    engine = DockerEngine(host="tcp://127.0.0.1:9", origin="connection 'dk1'")
    with pytest.raises(EngineUnreachableError, match=r"^Docker engine tcp://127.0.0.1:9 \(conn"):
        connect(engine)
