"""What a local app's replicas produced and used: results (``result.<role>.<k>.json`` in the
app's directory, the replicas' ``$SHIPYARD_RESULT_FILE``) and usage (each replica's ``wait4``
rusage, recorded by the process that reaps its wrapper: :func:`record_reaped`).

Usage is known for replicas whose wrapper was reaped by the submitting process (its background
thread does it as soon as a wrapper exits). Replicas that outlive their submitter are reaped by
init: for them, what their wrapper recorded as it ended stands in (:func:`wrapper_usages`: the
CPU time and the end, without the peak memory).

A replica killed by SIGKILL while the kernel counted a new OOM kill (``oom_kill`` of
``/proc/vmstat``) since the reaper last looked is taken as killed by the OOM killer; other
processes' OOM kills in that window could be mistaken for its own (the kernel does not say
whom it killed anywhere a process can read without privileges).
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping

from core.limits import parse_attempts
from core.reports import MAX_RESULT_BYTES, ReplicaResult, oom_message, parse_result
from core.schedulers.api import DescribeAppResponse
from core.schedulers.local.appdir import AppDir
from core.schedulers.local.records import AppRecord, FinalState
from core.schedulers.local.supervise import describe_code
from core.specs import (
    NONE,
    AppState,
    Attempt,
    ReplicaStatus,
    Resource,
    ResourceUsage,
    Role,
    RoleStatus,
)

__all__ = [
    "EndedApps",
    "OomCounter",
    "apply_usage",
    "put_usage",
    "peak_rss_kib",
    "read_results",
    "record_reaped",
    "response",
]

_KILLED = (137, -9)  # a shell's code for a SIGKILLed command; a wrapper killed itself


def read_results(app: AppDir, record: AppRecord) -> list[ReplicaResult]:
    """The results of the collected replicas (replica 0 of each role unless ``all``)."""
    out = []
    for rep in record.replicas:
        if record.results != "all" and rep.replica_id != 0:
            continue
        path = app.result_file(rep.role, rep.replica_id)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = None if size > MAX_RESULT_BYTES else f.read(MAX_RESULT_BYTES + 1)
        except FileNotFoundError:
            out.append(parse_result(rep.role, rep.replica_id, None))
            continue
        except OSError as e:
            res = ReplicaResult(rep.role, rep.replica_id, present=True)
            res.error = f"{rep.role}/{rep.replica_id}: cannot read its result file: {e}"
            out.append(res)
            continue
        out.append(parse_result(rep.role, rep.replica_id, data, size if data is None else None))
    return out


class OomCounter:
    """The kernel's count of OOM kills (``/proc/vmstat`` ``oom_kill``), as last seen."""

    def __init__(self) -> None:
        self.seen = self.read()

    @staticmethod
    def read() -> int | None:
        try:
            with open("/proc/vmstat", "rb") as f:
                for line in f:
                    if line.startswith(b"oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return None

    def new_kill(self) -> bool:
        """True if the count grew since the last look."""
        now = self.read()
        grew = now is not None and self.seen is not None and now > self.seen
        self.seen = now
        return grew


def peak_rss_kib() -> int:
    """This process's own peak resident memory in KiB (``VmHWM``): what a wrapper spawned from
    it now counts as its own peak. Not ``ru_maxrss``, which also holds the peak of the process
    this one was started from (a test runner, an Airflow worker)."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.read(fd, 65536)
        finally:
            os.close(fd)
        i = status.index(b"VmHWM:")
        return int(status[i + 6 : status.index(b"\n", i)].split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def record_reaped(
    app: AppDir,
    g: int,
    rusage: resource.struct_rusage,
    by_signal: int,
    oom: OomCounter,
    inherited: int = 0,
) -> None:
    """Records what replica ``g`` used, from its wrapper's ``wait4`` rusage (the wrapper waits
    for its command, so the figures are the command's).

    The wrapper's own peak is its spawner's (``inherited``, KiB): the kernel counts the memory
    of the process it was forked from until it execs. A peak no higher than that is not the
    command's, so it is unknown (None)."""
    code = app.exits().get(g, -by_signal if by_signal else None)
    killed = code in _KILLED
    maxrss = rusage.ru_maxrss * 1024 if rusage.ru_maxrss > inherited else None
    cpu = rusage.ru_utime + rusage.ru_stime
    app.record_usage(g, _usage_line(time.time(), cpu, maxrss, bool(killed and oom.new_kill())))


def _usage_line(end: float, cpu: float, maxrss: int | None, oom: bool) -> str:
    """A usage line's JSON (what :func:`apply_usage` reads)."""
    usage = {"end": end, "cpu": cpu, "maxrss": maxrss, "oom": oom}
    return json.dumps(usage, separators=(",", ":"))


def put_usage(
    resp: DescribeAppResponse, app: AppDir, names: set[str], record: AppRecord
) -> dict[int, str]:
    """Puts each replica's usage on ``resp`` (``names``: the app directory's files): what the
    process that reaped its wrapper recorded, else what the wrapper recorded as it ended.
    Returns the former (whole: the usage an ended app may keep)."""
    reaped = app.usages() if AppDir.USAGE in names else {}
    shown = reaped
    if len(reaped) < len(record.replicas):
        shown = {**wrapper_usages(app, names, len(record.replicas), reaped), **reaped}
    apply_usage(resp, shown, record)
    return reaped


def wrapper_usages(
    app: AppDir, names: set[str], replicas: int, reaped: Mapping[int, str]
) -> dict[int, str]:
    """Usage lines from what the wrappers of ended replicas recorded (``names``: the app
    directory's files), for those not in ``reaped``; their peak memory is unknown."""
    out: dict[int, str] = {}
    for g in range(replicas):
        if g not in reaped and f"{AppDir.TIMES_PREFIX}{g}" in names:
            times = app.wrapper_times(g)
            if times is not None:
                out[g] = _usage_line(times[1], times[0], None, False)
    return out


def apply_usage(resp: DescribeAppResponse, lines: Mapping[int, str], record: AppRecord) -> None:
    """Puts the recorded usage (``lines``: :meth:`AppDir.usages`) on the replicas of ``resp``;
    an OOM-killed replica's message says so (with its peak and what it asked for)."""
    if not lines:
        return
    requested = {r.name: r.resource[2] for r in record.roles}
    by_replica: Mapping[tuple[str, int], int] = {
        (r.role, r.replica_id): r.index for r in record.replicas
    }
    ooms = []
    for rs in resp.roles_statuses:
        for status in rs.replicas:
            g = by_replica.get((rs.role, status.id))
            text = lines.get(g) if g is not None else None
            if text is None:
                continue
            try:
                u = json.loads(text)
            except ValueError:
                continue
            mem = requested.get(rs.role, -1)
            spawned = record.replicas[g].spawned if g is not None else u["end"]
            status.usage = ResourceUsage(
                wall_time=max(0.0, u["end"] - spawned),
                cpu_time=u["cpu"],
                peak_memory=u["maxrss"],
                requested_memory=mem * (1 << 20) if mem > 0 else None,
                oom_killed=bool(u.get("oom")),
            )
            if status.usage.oom_killed and status.state == AppState.FAILED:
                msg = f"{rs.role}/{status.id} " + oom_message(
                    status.usage.peak_memory, status.usage.requested_memory
                )
                status.structured_error_msg = msg
                ooms.append(msg)
    if ooms:
        resp.msg = "; ".join([*ooms, *([] if resp.msg in ("", "<NONE>") else [resp.msg])])


#: states by name: a dict lookup, not ``AppState[name]`` (a Python-level call per replica)
_STATES = dict(AppState.__members__)


def response(
    app_id: str, record: AppRecord, st: FinalState, app: AppDir | None = None
) -> DescribeAppResponse:
    """The describe response of an app in state ``st``; its attempts are those the limit
    script of its first replica started again (``requeue_on_timeout``), read from ``app``."""
    statuses = {r.name: RoleStatus(r.name, []) for r in record.roles}
    for rep in record.replicas:
        code = st.codes[rep.index]
        statuses.setdefault(rep.role, RoleStatus(rep.role, [])).replicas.append(
            ReplicaStatus(
                id=rep.replica_id,
                state=_STATES[st.states[rep.index]],
                role=rep.role,
                hostname=record.host,
                exit_code=code if isinstance(code, int) else None,
                structured_error_msg=NONE
                if code in (None, 0)
                else f"{rep.role}/{rep.replica_id} {describe_code(code)}",
                reason=st.reason or None if code not in (None, 0) else None,
            )
        )
    roles = [
        Role(name=r.name, image=r.image, entrypoint=r.entrypoint, args=list(r.args),
             env=dict(r.env), num_replicas=r.num_replicas, resource=Resource(*r.resource))
        for r in record.roles
    ]  # fmt: skip
    return DescribeAppResponse(
        app_id=app_id,
        state=_STATES[st.state],
        num_restarts=0,
        reason=st.reason or None,
        attempts=_attempts(app, record),
        msg=st.msg or NONE,
        roles_statuses=list(statuses.values()),
        roles=roles,
    )


def _attempts(app: AppDir | None, record: AppRecord) -> list[Attempt]:
    if app is None or record.requeues is None:
        return []
    return parse_attempts(app.read(f"{AppDir.ATTEMPTS}.0") or "", record.host)


class EndedApps:
    """Ended apps whose final state and every replica's usage are on record: neither changes
    again (the first final state recorded stays, and so does a replica's first usage line), so
    describing them again needs no file read (the status polls of an ended app, its result)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._apps: OrderedDict[str, tuple[FinalState, dict[int, str]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, app_id: str) -> tuple[FinalState, dict[int, str]] | None:
        with self._lock:
            return self._apps.get(app_id)

    def put(self, app_id: str, final: FinalState, usages: dict[int, str], replicas: int) -> None:
        """Keeps an ended app whose ``usages`` has a line for each of its ``replicas``."""
        if len(usages) < replicas:
            return
        with self._lock:
            self._apps[app_id] = (final, usages)
            while len(self._apps) > self._size:
                self._apps.popitem(last=False)

    def forget(self, app_id: str) -> None:
        with self._lock:
            self._apps.pop(app_id, None)

    def clear(self) -> None:
        with self._lock:
            self._apps.clear()
