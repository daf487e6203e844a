"""What an app produced and what it cost, and what would stop it from starting: structured
results (:class:`AppResult`), resource usage summaries and pre-flight :class:`Problem` s. Shared
by every backend; each backend only fetches the bytes and the figures.

Results: every replica gets ``$SHIPYARD_RESULT_FILE`` (:data:`RESULT_FILE_ENV`); what replica 0
of each role (or every replica, with the run option ``result_replicas=all``) writes there as JSON
comes back from :meth:`core.runner.Runner.result`. A result larger than
:data:`MAX_RESULT_BYTES` (1 MiB) or that is not JSON is an error of that replica (named in
:attr:`ReplicaResult.error`), never an exception of a wait.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import ShipyardError
from core.specs import AppState, AppStatus, ResourceUsage, RoleStatus, format_bytes

__all__ = [
    "MAX_RESULT_BYTES",
    "RESULT_FILE_ENV",
    "RESULT_REPLICAS_OPT",
    "AppResult",
    "Problem",
    "ReplicaResult",
    "ResultError",
    "format_bytes",
    "oom_message",
    "over_requests",
    "parse_result",
    "problem_from_error",
    "result_replicas",
    "usage_summary",
    "with_usage",
]

#: the environment variable naming the file a replica writes its JSON result to
RESULT_FILE_ENV = "SHIPYARD_RESULT_FILE"
#: the largest result read back (bytes); a larger one is an error of its replica
MAX_RESULT_BYTES = 1 << 20
#: the run option (every scheduler) choosing whose results are collected: ``first`` (replica 0
#: of each role, the default) or ``all``
RESULT_REPLICAS_OPT = "result_replicas"
RESULT_REPLICAS_HELP = (
    "whose $SHIPYARD_RESULT_FILE is read back by Runner.result: 'first' (replica 0 of each role)"
    " or 'all' (every replica)"
)

_FIELD_RE = re.compile(r"^([A-Za-z_][\w.\[\]-]*): ")


class ResultError(ShipyardError, ValueError):
    """A replica's result could not be read (too large, not JSON, missing, or the app is
    unknown); the message names the replica."""


def result_replicas(value: object) -> str:
    """The validated ``result_replicas`` option (``first`` or ``all``)."""
    text = "first" if value is None or value == "" else str(value)
    if text not in ("first", "all"):
        raise ValueError(f"cfg.{RESULT_REPLICAS_OPT}: expected 'first' or 'all', got {value!r}")
    return text


@dataclass
class ReplicaResult:
    """The result of one replica: its JSON ``value`` (None if it wrote none), or ``error``."""

    role: str
    replica_id: int
    value: Any = None
    present: bool = False
    error: str | None = None

    @property
    def name(self) -> str:
        """``role/replica_id``"""
        return f"{self.role}/{self.replica_id}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"role": self.role, "replica_id": self.replica_id, "value": self.value,
                "present": self.present, "error": self.error}  # fmt: skip


def parse_result(
    role: str, replica_id: int, data: bytes | None, size: int | None = None
) -> ReplicaResult:
    """The :class:`ReplicaResult` of the bytes a replica wrote (None: it wrote no file).

    ``size`` is the file's size where the backend knows it without reading it all (a file
    over the limit is not read).
    """
    out = ReplicaResult(role, replica_id)
    if data is None and size is None:
        return out
    out.present = True
    length = size if size is not None else len(data or b"")
    if length > MAX_RESULT_BYTES:
        out.error = (
            f"{out.name}: result file is {length} bytes, more than the limit of"
            f" {format_bytes(MAX_RESULT_BYTES)} ({MAX_RESULT_BYTES} bytes) for ${RESULT_FILE_ENV}"
        )
        return out
    try:
        out.value = json.loads((data or b"").decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        out.error = f"{out.name}: result file is not valid JSON: {e}"
    return out


@dataclass
class AppResult:
    """The results of an app, by role and replica id."""

    handle: str
    state: AppState
    replicas: list[ReplicaResult] = field(default_factory=list)

    def roles(self) -> dict[str, dict[int, ReplicaResult]]:
        """``{role: {replica_id: ReplicaResult}}``"""
        out: dict[str, dict[int, ReplicaResult]] = {}
        for r in self.replicas:
            out.setdefault(r.role, {})[r.replica_id] = r
        return out

    @property
    def errors(self) -> list[str]:
        """Every replica's error, each naming its replica."""
        return [r.error for r in self.replicas if r.error]

    def get(self, role: str, replica_id: int = 0) -> Any:
        """The value replica ``replica_id`` of ``role`` wrote (None if it wrote none).

        Raises:
            ResultError: the replica's result is invalid or too large, or was not collected.
        """
        for r in self.replicas:
            if r.role == role and r.replica_id == replica_id:
                if r.error:
                    raise ResultError(r.error)
                return r.value
        raise ResultError(
            f"{role}/{replica_id}: no result collected for it in {self.handle} (collected:"
            f" {', '.join(r.name for r in self.replicas) or 'none'})"
        )

    def values(self) -> dict[str, dict[int, Any]]:
        """``{role: {replica_id: value}}`` of the replicas that wrote a valid result."""
        out: dict[str, dict[int, Any]] = {}
        for r in self.replicas:
            if r.present and not r.error:
                out.setdefault(r.role, {})[r.replica_id] = r.value
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"handle": self.handle, "state": self.state.name,
                "replicas": [r.to_json() for r in self.replicas]}  # fmt: skip


@dataclass(frozen=True)
class Problem:
    """Something that would stop (``severity="error"``) or slow (``"warning"``) a submit, or
    what the backend expects (``"info"``, e.g. Slurm's estimated start time). ``field`` names
    the app or cfg field it is about (``roles[0].entrypoint``, ``cfg.partition``)."""

    field: str
    message: str
    severity: str = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def problem_from_error(e: BaseException, default_field: str = "app") -> Problem:
    """A :class:`Problem` from an error whose message starts with ``field: ...``."""
    text = str(e)
    m = _FIELD_RE.match(text)
    if m:
        return Problem(m.group(1), text[m.end() :])
    return Problem(default_field, text)


# -- usage ----------------------------------------------------------------------------------------


def oom_message(peak: int | None, requested: int | None) -> str:
    """``killed: out of memory (peak X of Y requested)``"""
    p = format_bytes(peak) if peak else "unknown"
    r = f"{format_bytes(requested)} requested" if requested else "no limit requested"
    return f"killed: out of memory (peak {p} of {r})"


def over_requests(
    statuses: Iterable[RoleStatus], ratio: float = 4.0, min_requested: int = 256 << 20
) -> list[str]:
    """Replicas that asked for at least ``ratio`` times the memory they used at their peak:
    ``trainer/0: requested 64 GiB, peak 3.0 GiB``."""
    out = []
    for rs in statuses:
        for r in rs.replicas:
            u = r.usage
            if u is None or not u.peak_memory or not u.requested_memory:
                continue
            if u.requested_memory >= min_requested and u.requested_memory >= ratio * u.peak_memory:
                out.append(
                    f"{rs.role}/{r.id}: requested {format_bytes(u.requested_memory)},"
                    f" peak {format_bytes(u.peak_memory)}"
                )
    return out


def usage_summary(statuses: Iterable[RoleStatus]) -> list[str]:
    """One line per replica with usage figures, then the over-requests flagged."""
    statuses = list(statuses)
    lines = []
    for rs in statuses:
        for r in rs.replicas:
            if r.usage is not None:
                lines.append(f"{rs.role}/{r.id}: {r.usage.format()}")
    lines += [f"over-request: {line}" for line in over_requests(statuses)]
    return lines


#: how long an ended app's usage is waited for (a backend may record it a moment after the
#: end: a local replica's once its wrapper is reaped, which a loaded host delays)
USAGE_WAIT = 2.0


def with_usage(
    status: AppStatus, ask_again: Callable[[], AppStatus | None], wait: float = USAGE_WAIT
) -> AppStatus:
    """An ended app's ``status``, asked again (``ask_again()``, backing off) for at most
    ``wait`` seconds while a replica has no usage in it (one a backend cannot measure, e.g.
    over slurmrestd, stays without)."""
    deadline = time.monotonic() + wait
    delay = 0.02
    while not all(r.usage is not None for rs in status.roles for r in rs.replicas):
        if time.monotonic() >= deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
        status = ask_again() or status
    return status


def usage_by_replica(statuses: Iterable[RoleStatus]) -> dict[str, dict[str, Any]]:
    """``{"role/k": usage JSON}`` of the replicas that have usage figures."""
    return {
        f"{rs.role}/{r.id}": r.usage.to_json()
        for rs in statuses
        for r in rs.replicas
        if r.usage is not None
    }


def fill_usage(statuses: Iterable[RoleStatus], known: Mapping[str, Mapping[str, Any]]) -> None:
    """Completes each replica's figures from ``known`` (a :func:`usage_by_replica` of another
    process): a Docker replica's CPU time and peak are sampled only by a process that watched
    it run, e.g. the Airflow triggerer, not by the worker that resumes the task."""
    for rs in statuses:
        for r in rs.replicas:
            other = known.get(f"{rs.role}/{r.id}")
            if not other:
                continue
            own = r.usage.to_json() if r.usage is not None else {}
            merged = {**other, **{k: v for k, v in own.items() if v is not None}}
            merged["oom_killed"] = bool(own.get("oom_killed") or other.get("oom_killed"))
            r.usage = ResourceUsage.from_json(merged)


def usage_or_none(usage: ResourceUsage | None) -> dict[str, Any] | None:
    """The JSON form of a usage (None stays None)."""
    return None if usage is None else usage.to_json()
