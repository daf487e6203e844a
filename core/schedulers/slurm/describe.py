"""What Slurm says of a set of jobs: the controller's answer, completed from accounting for the
jobs it forgot and for the ended attempts of requeued ones. A job neither answers for is an
error while either is down (it may have ended long ago), and unknown only when both answered."""

from __future__ import annotations

from core.schedulers.slurm.jobinfo import JobInfo, app_state
from core.schedulers.slurm.transport import AccountingUnavailableError, SlurmClient
from core.specs import Attempt, is_terminal
from core.transient import BackendUnavailableError

__all__ = ["describe_jobs"]


def describe_jobs(
    client: SlurmClient, ids: list[str], attempts: dict[tuple[str, int], list[Attempt]]
) -> dict[str, JobInfo]:
    """What the controller says of ``ids``, completed from accounting where it must be;
    ``attempts``: the ended attempts of requeued jobs already read, by (job id, restarts)."""
    found, controller_error = client.controller_jobs(ids)
    # accounting for jobs the controller forgot, and for requeued ones that ended (the
    # controller's derived exit codes span every attempt; accounting has each attempt's steps)
    need = [
        a
        for a in ids
        if a not in found or (found[a].restarts > 0 and is_terminal(app_state(found[a].state)))
    ]
    # (a running requeued job's earlier attempts: read once per requeue)
    listing = [
        a
        for a in ids
        if a in found
        and a not in need
        and found[a].restarts > 0
        and _attempts_key(found[a]) not in attempts
    ]
    accounting_error = None
    try:
        acct = (client.accounting_jobs(need + listing) or {}) if need or listing else {}
    except AccountingUnavailableError as e:  # (the controller's answer stands where it has one)
        acct, accounting_error = {}, str(e)
    for a in listing:
        info = acct.get(a)
        if info is not None and len(info.attempts) == found[a].restarts:
            attempts[_attempts_key(found[a])] = info.attempts
    for a in ids:
        if a in found and found[a].restarts > 0:
            found[a].attempts = list(attempts.get(_attempts_key(found[a]), []))
    if need:
        for a in need:
            info = acct.get(a)
            if info is None or not info.components:
                continue
            if a in found and (
                not is_terminal(app_state(info.state))
                or set(info.components) != set(found[a].components)
            ):
                _await_accounting(found[a])  # accounting lags behind the controller
                continue
            if a in found:
                info.restarts = max(info.restarts, found[a].restarts)
                _fill_exit_codes(info, found[a])
            found[a] = info
    unknown = [a for a in ids if a not in found]
    if unknown and (controller_error is not None or accounting_error is not None):
        raise _not_known_yet(unknown, controller_error, accounting_error)
    return found


def _attempts_key(info: JobInfo) -> tuple[str, int]:
    return info.app_id, info.restarts


def _await_accounting(controller: JobInfo) -> None:
    """A requeued job that failed, while accounting lags: only accounting tells which replica
    failed in the last attempt, so the job is reported still ending until it does."""
    if controller.restarts > 0 and controller.state not in ("COMPLETED", "CANCELLED"):
        controller.reason = f"{controller.state}; waiting for accounting of its last attempt"
        controller.state = "COMPLETING"


def _fill_exit_codes(acct: JobInfo, controller: JobInfo) -> None:
    """Exit codes accounting lost (slurmrestd 22.05 reports 0 for a failed step: None here)
    taken from the controller's answer for the same component."""
    for off, comp in acct.components.items():
        known = controller.components.get(off)
        if comp.exit_code is None and known is not None and known.exit_code is not None:
            comp.exit_code = known.exit_code


def _not_known_yet(
    unknown: list[str], controller_error: str | None, accounting_error: str | None
) -> BackendUnavailableError:
    """Jobs neither the controller nor accounting answered for while one of them was down:
    "no such job" would be a lie (an ended job may be known to accounting only)."""
    controller = (
        "the controller no longer holds them"
        if controller_error is None
        else f"the controller did not answer ({controller_error})"
    )
    accounting = (
        "accounting does not know them"
        if accounting_error is None
        else f"accounting did not answer ({accounting_error})"
    )
    return BackendUnavailableError(
        f"slurm: cannot describe job(s) {', '.join(unknown)}: {controller} and {accounting}"
    )
