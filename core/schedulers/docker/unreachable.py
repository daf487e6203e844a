"""A Docker engine that cannot be reached, said in one line that names its URL.

The docker SDK reports a missing socket or a refused connection as a ``DockerException``
wrapping ``requests``' and ``urllib3``'s errors (``Error while fetching server API version:
('Connection aborted.', FileNotFoundError(2, ...))``). :func:`unreachable_error` turns it into
an :class:`EngineUnreachableError`: a :class:`~core.errors.BackendUnavailableError` (so it is
transient: retried by waiters, exit code 75 from the CLI) that is still a ``DockerException``
for callers that catch the SDK's errors.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import requests
from docker.errors import DockerException

from core.errors import BackendUnavailableError

if TYPE_CHECKING:
    from core.schedulers.docker.engine import DockerEngine

__all__ = ["DEFAULT_URL", "EngineUnreachableError", "engine_url", "unreachable_error"]

#: the engine Docker's own tools reach without ``DOCKER_HOST``
DEFAULT_URL = "unix:///var/run/docker.sock"


class EngineUnreachableError(BackendUnavailableError, DockerException):
    """The Docker engine did not accept a connection (no socket, refused, timed out, unknown
    host); the message names its URL and where that came from."""


def engine_url(args: Mapping[str, Any], engine: DockerEngine | None = None) -> str:
    """The engine's URL as the user gave it, and where it came from:
    ``unix:///tmp/x.sock (DOCKER_HOST)``, ``tcp://h:2376 (connection 'dk1')`` or
    ``unix:///var/run/docker.sock (the default socket)``."""
    base_url = args.get("base_url")
    if engine is not None and engine.host:
        return f"{engine.host} ({engine.origin})"
    if base_url:
        where = "DOCKER_HOST" if os.environ.get("DOCKER_HOST") else "the client's base_url"
        return f"{base_url} ({where})"
    return f"{DEFAULT_URL} (the default socket; DOCKER_HOST is not set)"


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def _reason(errors: list[BaseException]) -> str:
    """What went wrong, in a few words, from the innermost OS-level error."""
    for err in reversed(errors):
        if isinstance(err, FileNotFoundError):
            return "no socket at that path"
        if isinstance(err, ConnectionRefusedError):
            return "connection refused"
        if isinstance(err, socket.gaierror):
            return "unknown host"
        if isinstance(err, TimeoutError):
            return "timed out"
        if isinstance(err, OSError) and err.strerror:
            return err.strerror.lower()
    for err in errors:
        if isinstance(err, requests.exceptions.Timeout):
            return "timed out"
    return "no connection"


def unreachable_error(
    e: BaseException, args: Mapping[str, Any], engine: DockerEngine | None = None
) -> EngineUnreachableError | None:
    """``e`` as an :class:`EngineUnreachableError` if it says the engine at ``args``'
    ``base_url`` (else the environment's) could not be connected to; None for any other error
    (a TLS failure, an engine that answered with an error)."""
    errors = list(_chain(e))
    connection = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
    if not any(isinstance(err, connection) for err in errors):
        return None
    if any(isinstance(err, requests.exceptions.SSLError) for err in errors):
        return None  # (a handshake failed: the engine was reached)
    return EngineUnreachableError(
        f"Docker engine {engine_url(args, engine)}: cannot connect ({_reason(errors)})"
    )
