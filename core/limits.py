"""Time limits and the checkpoint signal: the run options every backend takes (``time_limit``,
``checkpoint_signal``, ``checkpoint_grace``), their one duration syntax, and their checks.

A replica still running at its app's ``time_limit`` is ended as a cancel ends it (SIGTERM, then
SIGKILL after the backend's grace) and the app ends with reason ``timeout``; with a
``checkpoint_signal``, every replica gets that signal ``checkpoint_grace`` seconds before the
limit, to save what it has.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from core import durations
from core.errors import ShipyardError
from core.options import runopts
from core.specs import Attempt, CfgVal, Reason

__all__ = [
    "ATTEMPT_ENV",
    "CHECKPOINT_DIR_ENV",
    "CHECKPOINT_GRACE_OPT",
    "CHECKPOINT_SIGNAL_OPT",
    "TIME_LIMIT_OPT",
    "LIMIT_SCRIPT",
    "Limits",
    "LimitsError",
    "MAX_REQUEUES_OPT",
    "REQUEUE_ON_TIMEOUT_OPT",
    "Requeue",
    "TIMEOUT_CODE",
    "add_limit_opts",
    "add_requeue_opts",
    "limit_command",
    "limits_from_cfg",
    "parse_attempts",
    "parse_duration",
    "requeue_from_cfg",
]

#: in every replica: which attempt of the app this is (0, 1, ... as it is requeued or retried)
ATTEMPT_ENV = "SHIPYARD_ATTEMPT"
#: in every replica: a directory kept across the app's attempts, for its checkpoints
CHECKPOINT_DIR_ENV = "SHIPYARD_CHECKPOINT_DIR"
TIME_LIMIT_OPT = "time_limit"
CHECKPOINT_SIGNAL_OPT = "checkpoint_signal"
CHECKPOINT_GRACE_OPT = "checkpoint_grace"
MAX_REQUEUES_OPT = "max_requeues"
REQUEUE_ON_TIMEOUT_OPT = "requeue_on_timeout"
DEFAULT_GRACE = 60.0


class LimitsError(ShipyardError, ValueError):
    """A time limit option is invalid (the message names it)."""


def parse_duration(value: str | float, where: str) -> float:
    """Seconds of a positive duration in the one syntax of :mod:`core.durations` (``90``,
    ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``).

    Raises:
        LimitsError: naming ``where``, for anything else or a duration that is not positive.
    """
    try:
        return durations.parse_duration(value, where)
    except durations.DurationError as e:
        raise LimitsError(str(e)) from None


def _signal_name(value: CfgVal) -> str:
    name = str(value).strip().upper()
    name = name[3:] if name.startswith("SIG") else name
    if name in ("KILL", "STOP") or not hasattr(signal.Signals, f"SIG{name}"):
        raise LimitsError(
            f"{CHECKPOINT_SIGNAL_OPT}: expected a signal a program can catch, such as USR1, USR2,"
            f" TERM or INT, got {value!r}"
        )
    return name


@dataclass(frozen=True)
class Limits:
    """An app's time limit (seconds; None: none) and its checkpoint signal (a name without
    ``SIG``; None: none), sent ``grace`` seconds before the limit."""

    time_limit: float | None = None
    signal: str | None = None
    grace: float = DEFAULT_GRACE

    @property
    def signal_at(self) -> float | None:
        """Seconds after the start at which the checkpoint signal is sent (None: never)."""
        if self.time_limit is None or self.signal is None:
            return None
        return self.time_limit - self.grace


def limits_from_cfg(cfg: Mapping[str, CfgVal]) -> Limits:
    """The limits ``cfg`` asks for, checked together.

    Raises:
        LimitsError: naming the option (an unreadable duration, an unknown signal, a grace
            that is not shorter than the limit, a signal without a limit).
    """
    raw_limit = cfg.get(TIME_LIMIT_OPT)
    limit = None if raw_limit in (None, "") else parse_duration(str(raw_limit), TIME_LIMIT_OPT)
    raw_signal = cfg.get(CHECKPOINT_SIGNAL_OPT)
    sig = None if raw_signal in (None, "") else _signal_name(raw_signal)
    raw_grace = cfg.get(CHECKPOINT_GRACE_OPT)
    if raw_grace is not None:
        grace = _grace(raw_grace)
    else:  # (60 s, or half a limit shorter than two minutes)
        grace = DEFAULT_GRACE if limit is None else min(DEFAULT_GRACE, limit / 2)
    if sig is not None and limit is None:
        raise LimitsError(f"{CHECKPOINT_SIGNAL_OPT}: needs a {TIME_LIMIT_OPT} to be sent before")
    if sig is not None and limit is not None and grace >= limit:
        raise LimitsError(
            f"{CHECKPOINT_GRACE_OPT}: expected fewer seconds than {TIME_LIMIT_OPT}"
            f" ({limit:g}), got {grace:g}"
        )
    return Limits(limit, sig, grace)


def _grace(value: CfgVal) -> float:
    try:
        return durations.parse_duration(value, CHECKPOINT_GRACE_OPT, allow_zero=True)
    except durations.DurationError as e:
        raise LimitsError(str(e)) from None


def add_limit_opts(opts: runopts) -> None:
    """Adds ``time_limit``, ``checkpoint_signal`` and ``checkpoint_grace`` to a backend's
    run options."""
    opts.add(
        TIME_LIMIT_OPT,
        type_=str,
        help="the app's time limit (90s, 30m, 2h, 1h30m, 01:30:00, 1-00:00:00): past it every"
        " replica is ended as by a cancel and the app ends with reason timeout",
    )
    opts.add(
        CHECKPOINT_SIGNAL_OPT,
        type_=str,
        help="a signal (USR1, USR2, ...) every replica gets checkpoint_grace seconds before"
        " time_limit, to save its work",
    )
    opts.add(
        CHECKPOINT_GRACE_OPT,
        type_=float,
        help=f"seconds before time_limit that checkpoint_signal is sent (default {DEFAULT_GRACE:g},"
        " or half of a shorter time_limit's)",
    )


@dataclass(frozen=True)
class Requeue:
    """How often an app is started again when preempted or its node failed (``max_requeues``)
    and whether its time limit counts too (``on_timeout``)."""

    max_requeues: int = 0
    on_timeout: bool = False


def requeue_from_cfg(cfg: Mapping[str, CfgVal], limits: Limits) -> Requeue:
    """The requeues ``cfg`` asks for.

    Raises:
        LimitsError: naming the option (a count that is not a whole number >= 0, a
            ``requeue_on_timeout`` without ``max_requeues`` or without a ``time_limit``).
    """
    raw = cfg.get(MAX_REQUEUES_OPT)
    count = 0 if raw in (None, "") else _count(raw)
    on_timeout = _flag(cfg.get(REQUEUE_ON_TIMEOUT_OPT))
    if on_timeout and count == 0:
        raise LimitsError(f"{REQUEUE_ON_TIMEOUT_OPT}: needs {MAX_REQUEUES_OPT} > 0")
    if on_timeout and limits.time_limit is None:
        raise LimitsError(f"{REQUEUE_ON_TIMEOUT_OPT}: needs a {TIME_LIMIT_OPT}")
    return Requeue(count, on_timeout)


def _count(value: CfgVal) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise LimitsError(f"{MAX_REQUEUES_OPT}: expected a whole number >= 0, got {value!r}")
    return int(text)


def _flag(value: CfgVal) -> bool:
    if value in (None, "", False, "false", "False", "0", 0):
        return False
    if value in (True, "true", "True", "1", 1):
        return True
    raise LimitsError(f"{REQUEUE_ON_TIMEOUT_OPT}: expected true or false, got {value!r}")


def add_requeue_opts(opts: runopts) -> None:
    """Adds ``max_requeues`` and ``requeue_on_timeout`` to a backend's run options."""
    opts.add(
        MAX_REQUEUES_OPT,
        type_=int,
        default=0,
        help="times the app is started again when preempted or its node failed (and with"
        " requeue_on_timeout, at its time limit); max_retries is not spent on them",
    )
    opts.add(
        REQUEUE_ON_TIMEOUT_OPT,
        type_=bool,
        default=False,
        help="requeue (within max_requeues) an app that reaches its time_limit, shortly before"
        " the limit and after checkpoint_signal",
    )


# -- a replica's time limit kept by a script -----------------------------------------------------

#: the exit code of a replica whose command the limit script ended (as GNU ``timeout``'s)
TIMEOUT_CODE = 124

#: Where nothing else keeps a replica's time limit (Docker; local apps with
#: ``requeue_on_timeout``), this ``/bin/sh`` script runs its command: the checkpoint signal
#: ``checkpoint_grace`` seconds before the limit, SIGTERM at it (SIGKILL later), counted from
#: the start of each attempt; SIGTERM to the script (a cancel, ``docker stop``) reaches the
#: command too. A command the limit ended starts again while ``requeues`` allows it
#: (``$SHIPYARD_ATTEMPT`` counting), else the script exits :data:`TIMEOUT_CODE`; a failed one
#: starts again while ``retries`` allows it. Each attempt started again is a line of its record
#: and of its stderr. Its arguments: the signal ('' for none), seconds to it, seconds from it
#: to the limit, seconds from SIGTERM to SIGKILL, retries, requeues, the record; then the
#: command. (A background command of a non-interactive shell starts with SIGINT and SIGQUIT
#: ignored: those reach it only if it sets its own handler.)
LIMIT_SCRIPT = f"""\
sig=$1 at=$2 rest=$3 kill_after=$4 retries=$5 requeues=$6 record=$7
shift 7
attempt=0 retried=0 requeued=0 child= stopping= expired=
stop() {{ stopping=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null; }}
expire() {{ expired=1; kill -TERM "$child" 2>/dev/null; }}
trap stop TERM INT HUP
trap expire ALRM
again() {{
    echo "$attempt $1 $code" >>"$record" 2>/dev/null
    echo "shipyard: attempt $attempt ended ($1, exit code $code); starting attempt \
$((attempt + 1))" >&2
    attempt=$((attempt + 1))
}}
while [ -z "$stopping" ]; do
    expired=
    {ATTEMPT_ENV}=$attempt
    export {ATTEMPT_ENV}
    "$@" &
    child=$!
    (
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        nap() {{ sleep "$1" & s=$!; wait "$s"; }}
        nap "$at"
        [ -z "$sig" ] || kill -s "$sig" "$child" 2>/dev/null
        nap "$rest"
        kill -s ALRM $$
        nap "$kill_after"
        kill -s KILL "$child" 2>/dev/null
    ) &
    timer=$!
    while :; do
        wait "$child"
        code=$?
        kill -0 "$child" 2>/dev/null || break
    done
    kill "$timer" 2>/dev/null
    child=
    [ -z "$stopping" ] || break
    if [ -n "$expired" ]; then
        [ "$requeued" -lt "$requeues" ] || exit {TIMEOUT_CODE}
        requeued=$((requeued + 1))
        again {Reason.TIMEOUT}
    elif [ "$code" -ne 0 ] && [ "$retried" -lt "$retries" ]; then
        retried=$((retried + 1))
        again {Reason.EXIT_CODE}
    else
        exit "$code"
    fi
done
exit "${{code:-143}}"
"""


def limit_command(
    limits: Limits, kill_after: int, retries: int, requeues: int, record: str
) -> list[str]:
    """The command that runs a replica's command (which follows it) under ``limits`` (which
    have a time limit): see :data:`LIMIT_SCRIPT`. ``record``: the file it notes each attempt
    it starts again in ("NUMBER REASON EXIT_CODE", read by :func:`parse_attempts`)."""
    assert limits.time_limit is not None
    limit = max(1, math.ceil(limits.time_limit))
    at = limit if limits.signal_at is None else max(0, math.floor(limits.signal_at))
    sig = limits.signal or ""
    counts = (at, limit - at, kill_after, retries, requeues)
    return ["/bin/sh", "-c", LIMIT_SCRIPT, "shipyard-limit", sig, *map(str, counts), record]


def parse_attempts(text: str, host: str = "") -> list[Attempt]:
    """The attempts of a :func:`limit_command` record (lines it cannot read are skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        reason = parts[1]
        state = "TIMEOUT" if reason == Reason.TIMEOUT else "FAILED"
        out.append(Attempt(int(parts[0]), state, reason, host))
    return out
