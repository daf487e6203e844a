"""Prefect events of Shipyard jobs: ``shipyard.job.<state>`` as a job's state changes.

The tasks and flows (submitting, waiting, streaming, cancelling) and the worker emit, for each
state a job reaches (lower-case :class:`core.specs.AppState` names: ``shipyard.job.submitted``,
``.pending``, ``.running``, ``.succeeded``, ``.failed``, ``.cancelled``), one event:

* resource ``{"prefect.resource.id": "shipyard.job.<handle>", "prefect.resource.name": <app
  name>, "shipyard.scheduler": ..., "shipyard.session": ...}``;
* payload ``{"handle", "state", "reason", "exit_codes": {role: [code per replica]},
  "message"}``;
* related: the run that saw it (Prefect adds the flow and task run in a run's context; the
  worker names the flow run, its deployment, its work pool and itself).

Each state of a job is emitted once: a process remembers what it emitted, and the event's id
is derived from the handle and the state, so the same state seen by another process (a
retried task, a restarted worker) is the same event, which the Prefect server stores once. A
state a job reaches again (a Slurm job requeued: RUNNING, PENDING, RUNNING) is not emitted
again. Automations can trigger on them (``shipyard.job.failed``, resource
``shipyard.job.*``).

Events are sent where Prefect has an API to send them to: in a flow or task run, or with
``PREFECT_API_URL`` set (without either, Prefect would start a server of its own for them).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from core.specs import AppHandle, AppState, AppStatus, parse_app_handle
from prefect_tasks.jobs import has_api

__all__ = ["EVENT_PREFIX", "JobEvents", "emit_job_state", "job_resource", "remember_name"]

log = logging.getLogger(__name__)

#: what every Shipyard job event's name starts with
EVENT_PREFIX = "shipyard.job."
#: the namespace of the events' ids (a job's state is one event, whoever emits it)
_ID_NAMESPACE = uuid.UUID("0b6f2d1e-6c43-5e3a-9d4b-5a4c1f3e8b27")
#: states no event is emitted for (not a state the job reached)
_SKIPPED = frozenset({AppState.UNSUBMITTED, AppState.UNKNOWN})
_MAX_REMEMBERED = 10000

_lock = threading.Lock()
_emitted: OrderedDict[AppHandle, set[str]] = OrderedDict()
_names: OrderedDict[AppHandle, str] = OrderedDict()


def remember_name(handle: AppHandle, name: str) -> None:
    """Names the job of ``handle`` (its app's name) in the events this process emits for it."""
    with _lock:
        _names[handle] = name
        _names.move_to_end(handle)
        while len(_names) > _MAX_REMEMBERED:
            _names.popitem(last=False)


def job_resource(handle: AppHandle, name: str | None = None) -> dict[str, str]:
    """The event resource of a job: its handle as the id, its name (the app's, else its id)."""
    parsed = parse_app_handle(handle)
    with _lock:
        known = _names.get(handle)
    return {
        "prefect.resource.id": f"{EVENT_PREFIX}{handle}",
        "prefect.resource.name": name or known or parsed.app_id,
        "shipyard.scheduler": parsed.scheduler_backend,
        "shipyard.session": parsed.session_name,
    }


def _payload(handle: AppHandle, status: AppStatus) -> dict[str, Any]:
    return {
        "handle": handle,
        "state": status.state.name,
        "reason": str(status.reason) if status.reason else None,
        "exit_codes": status.exit_codes(),
        "message": status.msg or None,
    }


def _first_time(handle: AppHandle, state: str) -> bool:
    """Whether this process has not emitted ``state`` of ``handle`` yet (and now has)."""
    with _lock:
        seen = _emitted.get(handle)
        if seen is None:
            seen = _emitted[handle] = set()
            while len(_emitted) > _MAX_REMEMBERED:
                _emitted.popitem(last=False)
        if state in seen:
            return False
        seen.add(state)
        return True


def emit_job_state(
    handle: AppHandle,
    status: AppStatus | None,
    name: str | None = None,
    related: Sequence[Any] | None = None,
) -> bool:
    """Emits ``shipyard.job.<state>`` for ``status`` unless this job's state was emitted
    before; returns whether it was. Never raises (an event is no reason to fail a task)."""
    if status is None or status.state in _SKIPPED:
        return False
    state = status.state.name.lower()
    try:
        if not has_api() or not _first_time(handle, state):
            return False
        from prefect.events import emit_event

        emit_event(
            event=f"{EVENT_PREFIX}{state}",
            resource=job_resource(handle, name),
            related=list(related) if related else None,
            payload=_payload(handle, status),
            id=uuid.uuid5(_ID_NAMESPACE, f"{handle}\n{state}"),
        )
    except Exception as e:
        log.debug("no event for %s %s: %s", handle, state, e)
        return False
    return True


class JobEvents:
    """Emits the events of one job as its statuses come (a watch's ``on_status``), and calls
    ``then`` (another ``on_status``) with each.

    Args:
        handle: the job's app handle
        name: the job's name in the events (default: its app's, if this process submitted it,
            else its id)
        related: related resources of every event (e.g. the worker's flow run)
        then: another ``on_status`` to call
    """

    def __init__(
        self,
        handle: AppHandle,
        name: str | None = None,
        related: Sequence[Any] | None = None,
        then: Callable[[AppStatus], None] | None = None,
    ) -> None:
        self.handle, self.name, self.related, self.then = handle, name, related, then

    def __call__(self, status: AppStatus) -> None:
        emit_job_state(self.handle, status, self.name, self.related)
        if self.then is not None:
            self.then(status)
