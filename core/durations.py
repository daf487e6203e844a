"""The one duration syntax of every time value: run options (``time_limit``), app files
(``metadata.max_silence``) and the command line (``--timeout``, ``--max-silence``, ``--since``).

A duration is seconds as a number (``90``, ``2.5``, or the same as a string), a number with a
unit (``90s``, ``10m``, ``2h``, ``1d``) or several (``1h30m``), or one of Slurm's clock forms
(``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``). Errors name the field and the expected form.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from core.errors import ShipyardError

if TYPE_CHECKING:
    from datetime import datetime

__all__ = ["DURATION_FORMS", "DurationError", "parse_duration", "parse_time", "seconds_of"]

#: the forms a duration takes, as error messages and help texts name them
DURATION_FORMS = "90s, 10m, 2h, 1h30m, 01:30:00 or plain seconds (90)"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
_UNITS_RE = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+")
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_CLOCK_RE = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)")
_DAYS_RE = re.compile(r"(\d+)-(\d+)")


class DurationError(ShipyardError, ValueError):
    """A time value is not a duration (the message names the field and the expected form)."""


def seconds_of(value: object) -> float | None:
    """The seconds ``value`` stands for in the duration syntax, or None if it is none of its
    forms (a bool, a negative or unreadable string, another type). Not checked for sign or
    finiteness: see :func:`parse_duration`."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if _NUMBER_RE.fullmatch(text):
        return float(text)
    if _UNITS_RE.fullmatch(text):
        return sum(float(n) * _UNITS[u] for n, u in _PART_RE.findall(text))
    m = _CLOCK_RE.fullmatch(text)
    if m:
        days, hours, minutes, secs = (int(g or 0) for g in m.groups())
        if m.group(2) is None:  # MM:SS (or D-MM:SS, which Slurm reads as D-HH:MM)
            hours, minutes, secs = (minutes, secs, 0) if days else (0, minutes, secs)
        return float(days * 86400 + hours * 3600 + minutes * 60 + secs)
    m = _DAYS_RE.fullmatch(text)
    if m:
        return float(int(m.group(1)) * 86400 + int(m.group(2)) * 3600)
    return None


def parse_duration(value: object, where: str, *, allow_zero: bool = False) -> float:
    """Seconds of the duration ``value`` (see the module's forms).

    Args:
        value: a number of seconds or a string in one of the forms
        where: the field, named by the error (``--timeout``, ``metadata.max_silence``)
        allow_zero: whether ``0`` is a valid duration (by default it must be positive)

    Raises:
        DurationError: naming ``where`` and the expected form, for anything else, a duration
            that is not finite, or one below (or, without ``allow_zero``, equal to) zero.
    """
    seconds = seconds_of(value)
    if (
        seconds is None
        or not math.isfinite(seconds)
        or seconds < 0
        or (seconds == 0 and not allow_zero)
    ):
        kind = "a duration >= 0" if allow_zero else "a positive duration"
        raise DurationError(f"{where}: expected {kind} such as {DURATION_FORMS}, got {value!r}")
    return seconds


def parse_time(value: str, where: str) -> datetime:
    """A point in time: ISO 8601 (``2026-01-02T03:04:05``; without a zone, local time) or a
    duration ago (``30s``, ``5m``, ``2h``, ``1d``: see :func:`parse_duration`).

    Raises:
        DurationError: naming ``where``, for anything else.
    """
    from datetime import UTC, datetime, timedelta  # (lazily: start-up)

    text = value.strip()
    try:  # ISO first: its basic form (20260102) would otherwise read as seconds
        dt = datetime.fromisoformat(text)
        return dt if dt.tzinfo else dt.astimezone()
    except ValueError:
        pass
    seconds = seconds_of(text)
    try:
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(text)
        return datetime.now(UTC) - timedelta(seconds=seconds)
    except (ValueError, OverflowError):  # not a time, or out of datetime's range
        raise DurationError(
            f"{where}: expected an ISO 8601 time or a duration ago such as {DURATION_FORMS},"
            f" got {value!r}"
        ) from None
