"""App handles: the address of an app from any process, ``{scheduler}://{session}/{app_id}``
(re-exported by :mod:`core.specs`, whose names they are)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import ShipyardError

__all__ = [
    "AppHandle",
    "MalformedAppHandleException",
    "ParsedAppHandle",
    "is_array_id",
    "make_app_handle",
    "parse_app_handle",
]

AppHandle = str


class MalformedAppHandleException(ShipyardError, ValueError):
    """Raised for an app handle that is not ``{scheduler}://{session}/{app_id}``."""

    def __init__(self, app_handle: str) -> None:
        super().__init__(
            f"app handle: expected {{scheduler}}://{{session}}/{{app_id}}, got {app_handle!r}"
        )


@dataclass(frozen=True)
class ParsedAppHandle:
    """The parts of an app handle."""

    scheduler_backend: str
    session_name: str
    app_id: str


_HANDLE_RE = re.compile(r"^(?P<backend>[A-Za-z0-9_.-]+)://(?P<session>[^/]*)/(?P<app_id>[^/\s]+)$")


def make_app_handle(scheduler_backend: str, session_name: str, app_id: str) -> AppHandle:
    """Builds ``{scheduler}://{session}/{app_id}``."""
    return f"{scheduler_backend}://{session_name}/{app_id}"


def is_array_id(app_id: str) -> bool:
    """Whether ``app_id`` names an array or one of its elements (see :mod:`core.arrays`):
    array ids hold an ``@``, which no backend's app id has."""
    return "@" in app_id


def parse_app_handle(app_handle: AppHandle) -> ParsedAppHandle:
    """Splits an app handle into its parts.

    Raises:
        MalformedAppHandleException: (a ``ValueError``) when the handle is not well formed.
    """
    if not isinstance(app_handle, str):
        raise MalformedAppHandleException(repr(app_handle))
    # the whole string: a handle with surrounding whitespace or a trailing newline is malformed
    m = _HANDLE_RE.fullmatch(app_handle)
    if not m:
        raise MalformedAppHandleException(app_handle)
    return ParsedAppHandle(m.group("backend"), m.group("session"), m.group("app_id"))
