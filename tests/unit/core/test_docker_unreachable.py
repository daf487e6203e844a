"""Which Docker errors mean the engine could not be reached, and how its address is named."""

from __future__ import annotations

import pytest

pytest.importorskip("docker")

import requests  # noqa: E402
from docker.errors import DockerException  # noqa: E402

from core.schedulers.docker.engine import DockerEngine  # noqa: E402
from core.schedulers.docker.unreachable import engine_url, unreachable_error  # noqa: E402


def _wrapped(inner: BaseException) -> DockerException:
    """What the SDK raises: its exception from requests' from the OS's."""
    try:
        try:
            try:
                raise inner
            except OSError as e:
                raise requests.exceptions.ConnectionError("Connection aborted.") from e
        except requests.exceptions.ConnectionError as e:
            raise DockerException(f"Error while fetching server API version: {e}") from e
    except DockerException as e:
        return e


def test_the_address_and_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engine_url({}) == (
        "unix:///var/run/docker.sock (the default socket; DOCKER_HOST is not set)"
    )
    monkeypatch.setenv("DOCKER_HOST", "tcp://h:2375")
    assert engine_url({"base_url": "tcp://h:2375"}) == "tcp://h:2375 (DOCKER_HOST)"
    engine = DockerEngine(host="tcp://b:2376", origin="block 'b1'")
    assert engine_url({"base_url": "tcp://b:2376"}, engine) == "tcp://b:2376 (block 'b1')"


@pytest.mark.parametrize(
    "inner, reason",
    [
        (FileNotFoundError(2, "No such file or directory"), "no socket at that path"),
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (TimeoutError("timed out"), "timed out"),
        (OSError(113, "No route to host"), "no route to host"),
    ],
)
def test_a_connection_that_failed_is_named_in_a_line(inner: OSError, reason: str) -> None:
    err = unreachable_error(_wrapped(inner), {"base_url": "unix:///x.sock"})
    assert err is not None
    assert str(err).startswith("Docker engine unix:///x.sock (")
    assert str(err).endswith(f"): cannot connect ({reason})")


def test_other_errors_are_left_alone() -> None:
    assert unreachable_error(DockerException("Install paramiko package"), {}) is None
    assert unreachable_error(ValueError("bad"), {}) is None
    ssl = requests.exceptions.SSLError("handshake failed")
    assert unreachable_error(ssl, {"base_url": "tcp://h:2376"}) is None
