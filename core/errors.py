"""The errors Shipyard raises: every one derives from :class:`ShipyardError`.

``except ShipyardError`` catches whatever Shipyard itself reports (bad input, a backend that
cannot be reached, a job that failed, hung or was cancelled), and nothing else. Most errors
also derive from the standard exception they stand for (``ValueError`` for bad input,
``RuntimeError``, ``OSError``), so code that catches those keeps working.

The errors of one concern live in its module and derive from :class:`ShipyardError`; the ones
here are raised from several layers (the watch, the schedulers, the integrations). Two keep
the names of the specification (``shared/seeds``): ``MalformedAppHandleException`` and
``SignalException``; every other name ends in ``Error``.

Nothing here imports anything of Shipyard's.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = [
    "BackendUnavailableError",
    "JobCancelledError",
    "JobSilentError",
    "ShipyardError",
    "short_repr",
]


class ShipyardError(Exception):
    """The base of every error Shipyard raises."""


class BackendUnavailableError(ShipyardError, RuntimeError):
    """The backend could not be reached or did not answer (after retries, where the caller
    retried): nothing is known about the job, which may well still be running."""


class JobSilentError(ShipyardError, RuntimeError):
    """A job was cancelled because replicas printed nothing for ``max_silence`` seconds.

    Attributes:
        handle: the job's app handle
        silent: the silent replicas (``role/k``)
    """

    #: why the job ended (``core.specs.Reason.SILENT``)
    reason = "silent"

    def __init__(self, message: str, handle: str, silent: list[str]) -> None:
        super().__init__(message)
        self.handle = handle
        self.silent = silent

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.handle, self.silent))


class JobCancelledError(ShipyardError, RuntimeError):
    """A watch stopped and cancelled its job because whoever waited was going away (a
    cancelled flow run, a flow's timeout, a task runner shutting down).

    Attributes:
        handle: the cancelled job's app handle
        reason: why
    """

    def __init__(self, handle: str, reason: str) -> None:
        self.handle = handle
        self.reason = reason
        super().__init__(f"cancelled app {handle}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.handle, self.reason))


#: the longest value quoted in an error message
MAX_QUOTED = 100
_repr = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_repr.maxlevel = 2
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxstring = _repr.maxother = MAX_QUOTED


def short_repr(value: Any) -> str:
    """``repr(value)``, shortened for an error message (long strings, deep or big containers)."""
    try:
        text = _repr.repr(value)
    except Exception:  # a repr that fails (or recurses) says nothing useful anyway
        return f"<{type(value).__name__}>"
    return text if len(text) <= MAX_QUOTED else f"{text[: MAX_QUOTED - 3]}..."
