"""What the local scheduler writes about an app: the app record (``app.json``, once, before any
replica's command may run) and the final state (``done``, once, by whoever first sees the app
end). Plain dataclasses with their JSON form; :mod:`.appdir` reads and writes them.

Standard library only: the log collector process imports this module too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["LOST", "AppRecord", "FinalState", "ReplicaRecord", "RoleRecord"]

#: the exit code of a replica whose wrapper died without recording one (e.g. SIGKILLed)
LOST = "lost"

#: what :class:`AppRecord` JSON looks like; records of another version are not read
RECORD_VERSION = 3  # 3: logs and time indexes in the app's logs/ directory
#: the exit code of a replica its limit script ended (``core.limits.TIMEOUT_CODE``: this module
#: imports no more than the standard library, for the log collector)
SCRIPT_TIMEOUT = 124

ExitCode = int | str | None  # an exit code, LOST, or None while running


@dataclass
class RoleRecord:
    """A role as submitted (what ``describe`` returns as the app's roles)."""

    name: str
    num_replicas: int
    image: str = ""
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    resource: tuple[int, int, int] = (-1, -1, -1)  # cpu, gpu, memMB


@dataclass
class ReplicaRecord:
    """One replica: its process and its log files. ``index`` is its place among all the
    app's replicas (its wrapper writes ``<index> <code>`` to the exits file)."""

    index: int
    role: str
    replica_id: int
    pid: int
    #: the process's start time in clock ticks after boot (``/proc/<pid>/stat``): with the pid,
    #: it names the process exactly (a reused pid has another start time)
    start_ticks: int
    #: when it was spawned (wall clock)
    spawned: float
    stdout: str
    stderr: str
    combined: str


@dataclass
class AppRecord:
    """Everything about an app that never changes after submit."""

    app_id: str
    name: str
    backend: str
    session: str
    submit_time: float
    log_dir: str
    roles: list[RoleRecord]
    replicas: list[ReplicaRecord]
    key: str | None = None
    host: str = "localhost"
    #: whose results are collected: ``first`` (replica 0 of each role) or ``all``
    results: str = "first"
    #: seconds after ``submit_time`` at which every replica is ended (None: no limit), and the
    #: signal each gets ``checkpoint_grace`` seconds before (see :mod:`core.limits`)
    time_limit: float | None = None
    checkpoint_signal: str | None = None
    checkpoint_grace: float = 60.0
    #: None: the app's watcher keeps ``time_limit``; a count: each replica's limit script does
    #: (exit code :data:`SCRIPT_TIMEOUT`) and starts it again up to that many times
    requeues: int | None = None

    def to_json(self) -> str:
        data = {**vars(self), "roles": [vars(r) for r in self.roles],
                "replicas": [vars(r) for r in self.replicas]}  # fmt: skip
        return json.dumps({"version": RECORD_VERSION, **data}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> AppRecord | None:
        """The record, or None for text that is not a record of this version."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.pop("version", None) != RECORD_VERSION:
                return None
            data["roles"] = [
                RoleRecord(**{**r, "resource": tuple(r["resource"])}) for r in data["roles"]
            ]
            data["replicas"] = [ReplicaRecord(**r) for r in data["replicas"]]
            return cls(**data)
        except (ValueError, TypeError, KeyError):
            return None

    def replica(self, role: str, replica_id: int) -> ReplicaRecord | None:
        """Replica ``replica_id`` of ``role``."""
        for rep in self.replicas:
            if rep.role == role and rep.replica_id == replica_id:
                return rep
        return None


@dataclass
class FinalState:
    """The state of an app: each replica's exit code (None while running) and app state name
    (``RUNNING``, ``SUCCEEDED``, ``FAILED``, ``CANCELLED``), the app's state and message."""

    state: str
    codes: list[ExitCode]
    states: list[str]
    msg: str = ""
    time: float = 0.0
    #: why the app ended when its state does not say it (``timeout``)
    reason: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FinalState | None:
        try:
            data = json.loads(text)
            return cls(**data) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            return None

    def asdict(self) -> dict[str, Any]:
        return asdict(self)
