"""Reading apps back from the engine: the containers' labels and states, and the apps' record
volumes (a key's claim, an app's tombstone), as ``DescribeAppResponse`` and ``ListAppResponse``.
Nothing here changes the engine.

An app whose containers have not all started by its submission's deadline was interrupted
mid-submit (its submitter died, and no retry with its key completed the submission before):
it is reported FAILED with a message saying so, never left PENDING for ever.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from core.limits import TIMEOUT_CODE
from core.schedulers.api import DescribeAppResponse
from core.schedulers.docker import timelimit
from core.schedulers.docker.model import (
    LABEL_APP_ID,
    LABEL_ATTEMPTS,
    LABEL_CLAIM,
    LABEL_DEADLINE,
    LABEL_MAX_RETRIES,
    LABEL_MSG,
    LABEL_NUM_RESTARTS,
    LABEL_REPLICA_ID,
    LABEL_REPLICAS,
    LABEL_REQUEUES,
    LABEL_ROLE_NAME,
    LABEL_ROLES,
    LABEL_STATE,
    LABEL_TIME_LIMIT,
    LABEL_TOMBSTONE,
    hostname,
    is_cancelling,
    replica_state,
)
from core.specs import (
    NONE,
    AppState,
    Attempt,
    Reason,
    ReplicaStatus,
    ResourceUsage,
    RetryPolicy,
    Role,
    RoleStatus,
    is_terminal,
)

Containers = list[dict[str, Any]]
Labels = Mapping[str, str]


@dataclass
class Records:
    """The record volumes of some apps, by app id."""

    tombstones: dict[str, Labels] = field(default_factory=dict)
    claims: dict[str, Labels] = field(default_factory=dict)


def list_containers(api: Any, label_filter: str) -> Containers:
    """Every container (running or not) carrying ``label_filter``: one engine call."""
    return api.containers(all=True, filters={"label": label_filter})  # type: ignore[no-any-return]


def list_records(api: Any, label_filter: str) -> Records:
    """The claims and tombstones carrying ``label_filter``: one engine call."""
    records = Records()
    for vol in api.volumes(filters={"label": label_filter}).get("Volumes") or []:
        labels = vol.get("Labels") or {}
        app_id = labels.get(LABEL_APP_ID)
        if not app_id:
            continue
        if labels.get(LABEL_TOMBSTONE):
            records.tombstones[app_id] = labels
        elif labels.get(LABEL_CLAIM):
            records.claims[app_id] = labels
    return records


def by_app(containers: Containers) -> dict[str, Containers]:
    """Containers grouped by their app's id."""
    out: dict[str, Containers] = {}
    for c in containers:
        app_id = (c.get("Labels") or {}).get(LABEL_APP_ID)
        if app_id:
            out.setdefault(app_id, []).append(c)
    return out


def restart_counts(
    api: Any, pool: ThreadPoolExecutor, containers: Containers
) -> dict[str, list[Attempt]]:
    """The attempts each container that may have started again ended (its ``RestartCount`` of
    the engine, or the record of its time limit's script: see :mod:`.timelimit`); the list
    call carries neither."""
    from docker.errors import NotFound

    def may_restart(c: Mapping[str, Any]) -> bool:
        labels = c.get("Labels") or {}
        return (
            label_int(labels.get(LABEL_MAX_RETRIES)) > 0
            or label_int(labels.get(LABEL_REQUEUES)) > 0
        )

    def attempts(c: Mapping[str, Any]) -> list[Attempt]:
        labels = c.get("Labels") or {}
        host = hostname(labels.get(LABEL_ROLE_NAME, ""), label_int(labels.get(LABEL_REPLICA_ID)))
        if labels.get(LABEL_TIME_LIMIT):
            return timelimit.read_attempts(api, c["Id"], host)
        try:
            n = int(api.inspect_container(c["Id"]).get("RestartCount") or 0)
        except NotFound:
            n = 0
        return [Attempt(i, AppState.FAILED.name, Reason.EXIT_CODE, host) for i in range(n)]

    chosen = [c for c in containers if may_restart(c)]
    if len(chosen) <= 1:
        return {c["Id"]: attempts(c) for c in chosen}
    return {c["Id"]: a for c, a in zip(chosen, pool.map(attempts, chosen), strict=True)}


def resolve(
    app_id: str,
    containers: Containers,
    records: Callable[[], Records],
    restarts: Callable[[Containers], dict[str, list[Attempt]]],
    now: float,
) -> DescribeAppResponse | None:
    """The app's response from its containers; from its tombstone when it has none left, is
    being cancelled or misses some (the records are only looked up then); from its key's claim
    while its submission has created none yet. None if the engine has no trace of it."""
    resp: DescribeAppResponse | None = None
    if containers:
        resp, complete = summarize(app_id, containers, restarts(containers), now)
        if complete and not any(is_cancelling(c) for c in containers):
            return resp
    found = records()
    tomb = found.tombstones.get(app_id)
    if tomb is not None:
        return from_tombstone(app_id, tomb)
    if resp is not None:
        return resp
    claim = found.claims.get(app_id)
    return from_claim(app_id, claim, now) if claim is not None else None


def summarize(
    app_id: str, containers: Containers, restarts: dict[str, list[Attempt]], now: float
) -> tuple[DescribeAppResponse, bool]:
    """The response from an app's containers, and whether every replica has its container.
    Its ``attempts`` are those of its first replica, where a time limit's script runs it."""
    role_specs = _role_specs(containers[0].get("Labels") or {})
    found = {}
    msgs: list[str] = []
    attempts: list[Attempt] = []
    for c in containers:
        status = _replica(c, len(restarts.get(c["Id"], [])), msgs)
        if status is not None and status.id == 0 and (c.get("Labels") or {}).get(LABEL_TIME_LIMIT):
            if not role_specs or status.role == role_specs[0].get("name"):
                attempts = restarts.get(c["Id"], [])
        if status is not None:
            found[(status.role, status.id)] = status
    roles_statuses, roles, missing = _roles(role_specs, found)
    never_started = [_replica_name(c) for c in containers if c.get("State") == "created"]
    deadline = _float((containers[0].get("Labels") or {}).get(LABEL_DEADLINE), math.inf)
    state = _app_state([r.state for r in found.values()], missing)
    # every container is created before any is started: one never started past the deadline
    # means its submitter stopped halfway (a missing one alone means it was removed)
    if state in (AppState.PENDING, AppState.RUNNING) and never_started and now > deadline:
        state = AppState.FAILED
        msgs.append(
            f"submit interrupted: {', '.join(never_started + missing)} never started (the"
            " submitting process stopped before starting every replica)"
        )
    elif missing and state == AppState.FAILED and not msgs:
        msgs.append(f"replica container(s) missing: {', '.join(missing)}")
    elif state == AppState.RUNNING and gang_survivors(containers):
        msgs.append("stopping the other replicas")
    resp = DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=max((len(a) for a in restarts.values()), default=0),
        attempts=attempts,
        msg="; ".join(msgs) if msgs else NONE,
        roles_statuses=roles_statuses,
        roles=roles,
    )
    return resp, not missing


def _replica(c: Mapping[str, Any], restarts: int, msgs: list[str]) -> ReplicaStatus | None:
    labels = c.get("Labels") or {}
    role = labels.get(LABEL_ROLE_NAME, "")
    try:
        rid = int(labels.get(LABEL_REPLICA_ID, "0"))
    except ValueError:
        return None
    state, code = replica_state(c.get("State", ""), c.get("Status", ""))
    if is_cancelling(dict(c)):
        state = AppState.CANCELLED
    status = ReplicaStatus(
        id=rid, state=state, role=role, hostname=hostname(role, rid), exit_code=code
    )
    limit = labels.get(LABEL_TIME_LIMIT)
    if state == AppState.FAILED and limit and code == TIMEOUT_CODE:
        status.reason = Reason.TIMEOUT
        what = f"reached its time limit of {limit}s"
        msgs.append(f"{role}/{rid} {what}")
        status.structured_error_msg = json.dumps({"message": msgs[-1], "exit_code": code})
    elif state == AppState.FAILED:
        what = f"exited with code {code}" if code is not None else "died"
        more = f" after {restarts} restart(s)" if restarts else ""
        status.structured_error_msg = json.dumps(
            {"message": f"{role}/{rid} {what}{more}", "exit_code": code}
        )
        msgs.append(f"{role}/{rid} {what}{more}")
    return status


def _replica_name(c: Mapping[str, Any]) -> str:
    labels = c.get("Labels") or {}
    return f"{labels.get(LABEL_ROLE_NAME, '')}/{labels.get(LABEL_REPLICA_ID, '')}"


def _roles(
    role_specs: list[dict[str, Any]], found: dict[tuple[str, int], ReplicaStatus]
) -> tuple[list[RoleStatus], list[Role], list[str]]:
    """Role statuses (a replica without a container is UNKNOWN), partial roles, and the names
    of the missing replicas."""
    specs = {s["name"]: s for s in role_specs}
    names = list(specs) or sorted({r for r, _ in found})
    statuses, roles, missing = [], [], []
    for name in names:
        n = label_int(specs.get(name, {}).get("num_replicas")) or 1 + max(
            (rid for r, rid in found if r == name), default=0
        )
        rs = RoleStatus(name)
        for rid in range(n):
            status = found.get((name, rid))
            if status is None:
                missing.append(f"{name}/{rid}")
                status = ReplicaStatus(rid, AppState.UNKNOWN, name, hostname(name, rid))
            rs.replicas.append(status)
        statuses.append(rs)
        roles.append(_role(specs.get(name, {"name": name}), n))
    return statuses, roles, missing


def _app_state(states: list[AppState], missing: list[str]) -> AppState:
    """The app ends when every replica has ended (gang semantics: once one failed for good, the
    scheduler stops the others), so an ended app's state and exit codes are final."""
    if AppState.CANCELLED in states:
        return AppState.CANCELLED
    if any(s in (AppState.PENDING, AppState.RUNNING) for s in states):
        return AppState.PENDING if all(s == AppState.PENDING for s in states) else AppState.RUNNING
    if missing or any(s != AppState.SUCCEEDED for s in states):
        return AppState.FAILED
    return AppState.SUCCEEDED


def gang_survivors(containers: Containers) -> Containers:
    """The containers still running or to be restarted in an app one of whose replicas failed
    for good (its container exited non-zero with no restart to come, or died): the scheduler
    stops them. None (an empty list) while the app is being cancelled."""
    going = [c for c in containers if c.get("State") in ("running", "restarting", "paused")]
    # (every container going, the usual case on a poll: none failed, and nothing is parsed)
    if not going or len(going) == len(containers) or any(is_cancelling(c) for c in containers):
        return []
    failed = (replica_state(c.get("State", ""), c.get("Status", ""))[0] for c in containers)
    return going if any(s in (AppState.FAILED, AppState.UNKNOWN) for s in failed) else []


def from_tombstone(app_id: str, labels: Labels) -> DescribeAppResponse:
    """The final state an app's tombstone recorded (cancelled, or ended and retired)."""
    state = AppState.__members__.get(labels.get(LABEL_STATE, ""), AppState.CANCELLED)
    role_specs = _role_specs(labels)
    try:
        replicas = json.loads(labels.get(LABEL_REPLICAS, "[]"))
    except ValueError:
        replicas = []
    by_role = {s["name"]: RoleStatus(s["name"]) for s in role_specs}
    for r in replicas:
        rs = by_role.setdefault(r["role"], RoleStatus(r["role"]))
        rid = int(r["id"])
        rs.replicas.append(
            ReplicaStatus(
                rid,
                AppState[r["state"]],
                r["role"],
                hostname(r["role"], rid),
                exit_code=r.get("exit_code"),
                usage=ResourceUsage.from_json(r["usage"]) if r.get("usage") else None,
                reason=r.get("reason"),
            )
        )
    for rs in by_role.values():
        rs.replicas.sort(key=lambda r: r.id)
    parts = ("cancelled" if state == AppState.CANCELLED else "", labels.get(LABEL_MSG, ""))
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=label_int(labels.get(LABEL_NUM_RESTARTS)),
        attempts=_attempts(labels),
        msg="; ".join([p for p in parts if p and p != NONE] + ["containers and network removed"]),
        roles_statuses=list(by_role.values()),
        roles=[_role(s, label_int(s.get("num_replicas")) or 1) for s in role_specs],
    )


def _attempts(labels: Labels) -> list[Attempt]:
    try:
        return [Attempt(**a) for a in json.loads(labels.get(LABEL_ATTEMPTS) or "[]")]
    except (ValueError, TypeError):
        return []


def from_claim(app_id: str, labels: Labels, now: float) -> DescribeAppResponse:
    """An app whose key is claimed but which has no container: still being submitted until its
    deadline, interrupted after it."""
    if now <= _float(labels.get(LABEL_DEADLINE), 0.0):
        return DescribeAppResponse(app_id=app_id, state=AppState.PENDING, msg="being submitted")
    return DescribeAppResponse(
        app_id=app_id,
        state=AppState.FAILED,
        msg="submit interrupted before any container was created (the submitting process stopped)",
    )


def list_state(app_id: str, containers: Containers, records: Records, now: float) -> AppState:
    """The state ``list`` gives an app (no restart counts needed)."""
    tomb = records.tombstones.get(app_id)
    if containers:
        resp, complete = summarize(app_id, containers, {}, now)
        if tomb is None or (complete and not any(is_cancelling(c) for c in containers)):
            return resp.state
    if tomb is not None:
        return from_tombstone(app_id, tomb).state
    return from_claim(app_id, records.claims[app_id], now).state


def final_replicas(resp: DescribeAppResponse, default: AppState) -> list[dict[str, Any]]:
    """The replicas of ``resp`` as a tombstone records them (a replica still going: ``default``)."""
    return [
        {
            "role": r.role,
            "id": r.id,
            "state": (r.state if is_terminal(r.state) else default).name,
            "exit_code": r.exit_code,
            **({"reason": r.reason} if r.reason else {}),
            **({"usage": r.usage.to_json()} if r.usage is not None else {}),
        }
        for rs in resp.roles_statuses
        for r in rs.replicas
    ]


def _role_specs(labels: Labels) -> list[dict[str, Any]]:
    try:
        specs = json.loads(labels.get(LABEL_ROLES, "[]"))
    except ValueError:
        return []
    return specs if isinstance(specs, list) else []


def _role(spec: Mapping[str, Any], n: int) -> Role:
    return Role(
        name=str(spec["name"]),
        image=str(spec.get("image", "")),
        num_replicas=n,
        max_retries=label_int(spec.get("max_retries")),
        retry_policy=RetryPolicy.REPLICA,
    )


def label_int(value: Any) -> int:
    """A label's integer value (0 when missing or malformed)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default
