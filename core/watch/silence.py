"""Hang detection: replicas that printed no log line for too long (``max_silence``).

A job whose replicas all wait on each other (an NCCL collective that never completes) stays
RUNNING and silent until a wall-clock limit, hours later. A :class:`SilenceWatch`, fed the
lines a waiter follows and the statuses it polls, names the running replicas whose last line
(or, before their first, the moment they were first seen running) is older than
``max_silence`` seconds, with their last lines; the waiter then cancels the job and fails with
:meth:`SilenceWatch.message`.

The watch (:class:`~core.watch.JobWatch`) feeds it and acts on it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from core.durations import parse_duration
from core.errors import JobSilentError
from core.specs import AppDef, AppState, AppStatus
from core.watch.follow import LogLine

__all__ = [
    "APP_MAX_SILENCE",
    "JobSilentError",
    "app_max_silence",
    "SilenceWatch",
    "check_max_silence",
    "effective_max_silence",
]

#: the last lines of each replica a message quotes
LAST_LINES = 3


#: the app ``metadata`` key of the app's own hang limit (a duration, e.g. ``"600"``, ``"10m"``)
APP_MAX_SILENCE = "max_silence"


def check_max_silence(value: Any, where: str = "max_silence") -> float | None:
    """``value`` as seconds (None: no limit): a positive duration in the one syntax of
    :mod:`core.durations` (``600``, ``"90s"``, ``"10m"``, ``"2h"``).

    Raises:
        ValueError: naming ``where`` and the expected form, for anything else.
    """
    if value is None:
        return None
    return parse_duration(value, where)


def app_max_silence(app: AppDef) -> float | None:
    """The app's own ``max_silence`` (its ``metadata["max_silence"]``, a duration; None: none),
    which a waiter given none of its own applies.

    Raises:
        ValueError: naming ``metadata.max_silence``, for anything but a positive duration.
    """
    raw = app.metadata.get(APP_MAX_SILENCE) if isinstance(app.metadata, dict) else None
    if raw is None:
        return None
    return check_max_silence(raw, f"metadata.{APP_MAX_SILENCE}")


def effective_max_silence(own: Any, app: AppDef | None) -> float | None:
    """A waiter's ``max_silence``: its own (checked) if given, else the app's (its
    ``metadata["max_silence"]``)."""
    limit = check_max_silence(own)
    if limit is None and app is not None:
        return app_max_silence(app)
    return limit


class SilenceWatch:
    """When each replica last printed, and which running ones are silent for too long (lines
    may come from another thread than the statuses).

    Args:
        max_silence: seconds without a line after which a running replica is silent
        clock: the time source (monotonic seconds)
    """

    def __init__(self, max_silence: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_silence = max_silence
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lines: dict[str, collections.deque[str]] = {}
        self._lock = threading.Lock()

    def saw(self, line: LogLine) -> None:
        """A line of its replica came now."""
        key = f"{line.role}/{line.replica}"
        with self._lock:
            self._last[key] = self._clock()
            self._lines.setdefault(key, collections.deque(maxlen=LAST_LINES)).append(
                str(line.line).rstrip("\n")
            )

    def silent(self, status: AppStatus | None) -> list[str]:
        """The running replicas (``role/k``) of ``status`` silent for ``max_silence``."""
        if status is None or status.state != AppState.RUNNING:
            return []
        out = []
        with self._lock:
            now = self._clock()
            for rs in status.roles:
                for r in rs.replicas:
                    if r.state != AppState.RUNNING:
                        continue
                    key = f"{rs.role}/{r.id}"
                    since = self._last.setdefault(key, now)  # first seen running: clock starts
                    if now - since >= self.max_silence:
                        out.append(key)
        return out

    def hang(self, handle: str, status: AppStatus | None) -> JobSilentError | None:
        """The error to cancel the app with if replicas of ``status`` are silent past
        ``max_silence`` (it names them, with their last lines); None if none is."""
        silent = self.silent(status)
        return JobSilentError(self.message(handle, silent), handle, silent) if silent else None

    def message(self, handle: str, silent: list[str]) -> str:
        """What the waiter fails with: the silent replicas and their last lines."""
        parts = []
        for key in silent:
            with self._lock:
                last = list(self._lines.get(key, ()))
            parts.append(f"{key}: " + (" | ".join(repr(x) for x in last) if last else "no line"))
        return (
            f"{handle}: cancelled (reason silent): no log line for {self.max_silence:g}s from"
            f" {', '.join(silent)} (max_silence); last lines: " + "; ".join(parts)
        )
