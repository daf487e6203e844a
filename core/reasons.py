"""Why an app and its replicas ended: :func:`fill_reasons` completes a status's ``reason``
fields from what every backend reports (exit codes, OOM kills, cancellation), keeping those a
backend set itself (a Slurm TIMEOUT, PREEMPTED, NODE_FAIL).
"""

from __future__ import annotations

from core.specs import AppState, AppStatus, Reason, ReplicaStatus, is_terminal

__all__ = ["SUBMIT_INTERRUPTED_MSG", "fill_reasons", "replica_reason"]

#: what the message of an app whose submission did not complete says (every backend)
SUBMIT_INTERRUPTED_MSG = "submit interrupted"

# when replicas ended for different reasons, the app's is the first of these found
_PRECEDENCE = (
    Reason.NODE_FAILURE,
    Reason.PREEMPTED,
    Reason.TIMEOUT,
    Reason.OOM,
    Reason.SIGNAL,
    Reason.EXIT_CODE,
)


def replica_reason(r: ReplicaStatus) -> str | None:
    """Why replica ``r`` ended (None while it runs): the backend's own, else from its OOM
    flag, its state and its exit code."""
    if r.reason or not is_terminal(r.state):
        return r.reason
    if r.usage is not None and r.usage.oom_killed:
        return Reason.OOM
    if r.state == AppState.CANCELLED:
        return Reason.CANCELLED
    if r.exit_code is not None and r.exit_code < 0:
        return Reason.SIGNAL
    return Reason.EXIT_CODE if r.exit_code is not None else None


def fill_reasons(status: AppStatus) -> AppStatus:
    """Sets the ``reason`` of every ended replica and of the app, where not set (in place;
    returns ``status``)."""
    replicas = [r for rs in status.roles for r in rs.replicas]
    for r in replicas:
        r.reason = replica_reason(r)
    if status.reason or not is_terminal(status.state):
        return status
    if status.state == AppState.CANCELLED:
        submit = SUBMIT_INTERRUPTED_MSG in (status.msg or "")
        status.reason = Reason.SUBMIT_INTERRUPTED if submit else Reason.CANCELLED
        return status
    found = {r.reason for r in replicas if r.state != AppState.SUCCEEDED}
    if status.state == AppState.FAILED and SUBMIT_INTERRUPTED_MSG in (status.msg or ""):
        status.reason = Reason.SUBMIT_INTERRUPTED
        return status
    status.reason = next((str(x) for x in _PRECEDENCE if x in found), Reason.EXIT_CODE)
    return status
