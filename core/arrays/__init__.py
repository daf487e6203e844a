"""Arrays: one app run as many elements (``size`` of them, or one per ``params`` mapping), at
most ``max_parallel`` at once, addressed as one handle ``{scheduler}://{session}/{array_id}`` and
one per element ``...{array_id}[i]`` (see ``Runner.run_array``).

The elements are ordinary apps of the backend, started by the array's driver
(:mod:`core.arrays.driver`): a process detached from the submitter, so the array goes on when the
submitter is killed, and any process on this host can follow, cancel and retry it. Array ids
hold an ``@`` (``train@3f9c0a1b2c4d``), which no backend's app id has.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.arrays.driver import cancel_targets, ensure_driver
from core.arrays.native import take_natives
from core.arrays.spec import (
    ArraySpec,
    ArraySpecError,
    check_after_condition,
    check_allow_failures,
    element_app,
    make_spec,
)
from core.arrays.store import ArrayDir, prune
from core.specs import (
    AppDef,
    AppState,
    AppStatus,
    ElementStatus,
    Reason,
    is_array_id,
    is_terminal,
    make_app_handle,
)

__all__ = [
    "ArrayDir",
    "ArraySpec",
    "ArraySpecError",
    "array_status",
    "cancel_array",
    "check_after",
    "check_after_condition",
    "check_allow_failures",
    "create_array",
    "element_app_status",
    "element_handle",
    "element_status",
    "first_element",
    "is_array_id",
    "is_single",
    "make_spec",
    "native_app_id",
    "open_array",
    "request_retry",
    "requested_app",
    "revive",
    "split_element_id",
]

if TYPE_CHECKING:
    from core.runner import Runner

log = logging.getLogger(__name__)

_ELEMENT_RE = re.compile(r"(?P<array>[^@\[\]]+@[0-9a-f]+)\[(?P<index>[0-9]+)\]")


def split_element_id(app_id: str) -> tuple[str, int | None]:
    """``(array_id, index)`` of an element id, ``(array_id, None)`` of an array id."""
    m = _ELEMENT_RE.fullmatch(app_id)
    return (m.group("array"), int(m.group("index"))) if m else (app_id, None)


def first_element(app: AppDef, spec: ArraySpec) -> AppDef:
    """Element 0's app (what a backend's dry run checks before the array is submitted)."""
    return element_app(app, spec, 0, "")


def requested_app(adir: ArrayDir) -> AppDef | None:
    """The app the array's elements run (before their macros are substituted)."""
    from core.appfile import app_from_dict

    request = adir.request()
    return app_from_dict(request["app"]) if request else None


def check_after(runner: Runner, after: Any, condition: str) -> list[str]:
    """``after`` as a list of handles of apps ``runner`` knows, else an error naming it."""
    check_after_condition(condition)
    if after is None:
        return []
    if isinstance(after, str) or not isinstance(after, list | tuple):
        raise ValueError(f"after: expected a list of app handles, got {after!r}")
    for h in after:
        try:
            known = runner.status(h) is not None
        except ValueError as e:
            raise ValueError(f"after: {e}") from None
        if not known:
            raise ValueError(f"after: no app {h} (unknown to its scheduler)")
    return list(after)


def _array_id(app: AppDef, key: str | None) -> str:
    import hashlib
    import uuid

    tag = hashlib.sha256(key.encode()).hexdigest()[:12] if key else uuid.uuid4().hex[:12]
    return f"{app.name}@{tag}"


def create_array(
    app: AppDef,
    backend: str,
    session: str,
    cfg: dict[str, Any],
    spec: ArraySpec,
    key: str | None = None,
    after: list[str] | None = None,
    condition: str = "ok",
    single: bool = False,
    native: bool = False,
    after_native: bool = False,
    submit_first: Callable[[ArrayDir], None] | None = None,
) -> str:
    """Records the array on this host and starts its driver; returns the array id. With
    ``key``, a second submit (after a crash, or racing) gets the same array. With ``after``,
    no element starts before those apps ended as ``condition`` says; ``single``: not an array
    but one app that waits for them (its handle stands for that app). ``native``: the array
    runs as the backend's own arrays (:mod:`core.arrays.native`); ``submit_first`` makes the
    first one before the driver starts (unless the array has one). ``after_native``: ``cfg``
    makes the backend itself hold the elements until ``after`` ended (Slurm's
    ``--dependency``), so the driver submits them at once."""
    from core.appfile import app_to_dict  # (yaml and the schema: not for every status read)

    adir = ArrayDir(backend, session, _array_id(app, key))
    created = adir.create()
    if created and submit_first is None:
        _prune(backend, session)
    if not adir.exists():  # (a first submit that died before recording it is completed here)
        adir.write_request(
            {
                "app": app_to_dict(app),
                "cfg": cfg,
                "spec": spec.to_json(),
                "key": key,
                "after": after or [],
                "condition": condition,
                "single": single,
                "native": native,
                "after_native": after_native,
                "cwd": os.getcwd(),
                "created": time.time(),
            }
        )
    if submit_first is not None and not adir.natives():
        try:
            submit_first(adir)
        except ValueError:  # refused by the backend: nothing queued, nothing to keep
            if created:
                adir.remove()
            raise
        # the backend queued every element: the driver only records their states, so it is
        # started beside the return (a status read starts one if this process dies first)
        threading.Thread(
            target=_start_beside, args=(adir, created), name="shipyard-array-start"
        ).start()
    else:
        ensure_driver(adir)
    return adir.array_id


def _start_beside(adir: ArrayDir, created: bool) -> None:
    # (first hands the interpreter back to the submitter, whose return is what its caller
    # waits for; else this thread's Python work may hold it for a switch interval, 5 ms)
    time.sleep(0.002)
    ensure_driver(adir)
    if created:
        _prune(adir.backend, adir.session)


def _prune(backend: str, session: str) -> None:
    try:
        gone = prune(backend, session, time.time())
    except OSError as e:  # (housekeeping: never the submit's failure)
        log.debug("pruning old arrays failed: %s", e)
        return
    if gone:
        log.info("removed %d ended arrays past their retention: %s", len(gone), ", ".join(gone))


def native_app_id(backend: str, session: str, app_id: str) -> str | None:
    """The backend's own app id of an array (or element, or held app) that was submitted once
    as a native array (:mod:`core.arrays.native`); None for any other (its elements are apps
    of their own, or not submitted yet, or submitted again by a retry)."""
    array_id, index = split_element_id(app_id)
    adir = open_array(backend, session, array_id)
    if adir is None or adir.retries_pending():
        return None
    records = adir.natives()
    if len(records) != 1:
        return None
    if index is None:
        return str(records[0]["array"])
    return next((str(a) for i, a in records[0]["elements"] if i == index), None)


def open_array(backend: str, session: str, array_id: str) -> ArrayDir | None:
    """The array's directory, or None if it was not submitted on this host."""
    adir = ArrayDir(backend, session, array_id)
    return adir if adir.exists() else None


def is_single(adir: ArrayDir) -> bool:
    """Whether the "array" is one app that waits for others (``Runner.run(after=...)``)."""
    return bool((adir.request() or {}).get("single"))


def _elements(adir: ArrayDir, state: dict[str, Any] | None = None) -> list[ElementStatus]:
    state = state if state is not None else adir.state()
    if state is not None:
        elements = [ElementStatus.from_json(e) for e in state["elements"]]
    else:
        request = adir.request() or {}
        elements = [ElementStatus(i, AppState.PENDING) for i in range(int(request["spec"]["size"]))]
    # (a native submission its driver has not recorded yet: its elements are queued already)
    take_natives(adir, elements, int((state or {}).get("natives", 0)))
    return elements


def _aggregate(elements: list[ElementStatus], cancelled: bool) -> AppState:
    states = {e.state for e in elements}
    if not all(is_terminal(s) for s in states):
        started = any(e.handle for e in elements)
        return AppState.RUNNING if started or cancelled else min(states)
    if states == {AppState.SUCCEEDED}:
        return AppState.SUCCEEDED
    return AppState.CANCELLED if cancelled or AppState.FAILED not in states else AppState.FAILED


def _message(elements: list[ElementStatus]) -> str:
    failed = [e for e in elements if e.state == AppState.FAILED]
    if not failed:
        return ""
    shown = ", ".join(
        f"[{e.index}] " + (f"exit {e.exit_code}" if e.exit_code is not None else e.msg or "failed")
        for e in failed[:5]
    )
    more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    return f"{len(failed)} of {len(elements)} elements failed: {shown}{more}"


def _reason(elements: list[ElementStatus], state: AppState) -> str | None:
    """Why an ended array ended: its elements' reason (the first of the failed ones')."""
    if not is_terminal(state):
        return None
    if state == AppState.SUCCEEDED:
        return Reason.EXIT_CODE
    ended_badly = [e.reason for e in elements if e.state == state and e.reason]
    return (
        ended_badly[0]
        if ended_badly
        else str(Reason.CANCELLED if state == AppState.CANCELLED else Reason.EXIT_CODE)
    )


def array_status(adir: ArrayDir) -> AppStatus:
    """The array's state (from its elements'), each element's status and the counts; starts a
    new driver if the array has not ended and its driver died."""
    written = adir.state()
    elements = _elements(adir, written)
    retrying = adir.retries_pending()
    for e in elements:
        if e.index in retrying and e.state == AppState.FAILED:
            e.state, e.handle = AppState.PENDING, None
    state = _aggregate(elements, adir.cancel_requested())
    if written is None and state == AppState.PENDING:  # (its driver is starting)
        state = AppState.SUBMITTED
    if not is_terminal(state):
        revive(adir)
    array_handle = make_app_handle(adir.backend, adir.session, adir.array_id)
    return AppStatus(
        state=state,
        reason=_reason(elements, state),
        num_restarts=sum(max(e.attempts - 1, 0) for e in elements),
        msg=_message(elements),
        elements=elements,
        ui_url=f"{array_handle} ({adir.path})",
    )


def revive(adir: ArrayDir) -> None:
    """Starts a driver for an array that has not ended if its driver died."""
    if not adir.driver_alive():
        log.warning("the driver of array %s is gone: starting another", adir.array_id)
        ensure_driver(adir)


def element_status(adir: ArrayDir, index: int) -> ElementStatus:
    """Element ``index``'s record (its handle is None while it waits for a slot).

    Raises:
        ValueError: no such element.
    """
    elements = _elements(adir)
    if not 0 <= index < len(elements):
        raise ValueError(
            f"app handle: array {adir.array_id} has elements 0..{len(elements) - 1}, not {index}"
        )
    return elements[index]


def element_app_status(
    adir: ArrayDir, index: int, status_of: Callable[[str], AppStatus | None]
) -> AppStatus | None:
    """The status of element ``index`` (``status_of`` reads its app's by handle): its record's
    while it waits for a slot; its app's once started, except that an app its backend ended for
    its dependencies reads as waiting until its driver recorded which dependency it was."""
    element = element_status(adir, index)
    if element.handle is None:
        if not is_terminal(element.state):
            revive(adir)
        return AppStatus(element.state, msg=element.msg, reason=element.reason)
    status = status_of(element.handle)
    if status is None or status.reason != Reason.DEPENDENCY:
        return status
    if not is_terminal(element.state):
        revive(adir)
        return AppStatus(AppState.PENDING, msg="its dependencies can never be met")
    status.msg = element.msg or status.msg
    return status


def element_handle(adir: ArrayDir, index: int) -> str | None:
    """The app handle of element ``index``'s latest attempt (None while it waits)."""
    return element_status(adir, index).handle


def cancel_array(adir: ArrayDir) -> list[str]:
    """Asks the driver to start nothing more (it marks the waiting elements CANCELLED) and
    returns the handles of the elements that may still run, for the caller to cancel."""
    adir.request_cancel()
    if not adir.driver_alive():
        ensure_driver(adir)  # (one that died still has to record the end)
    return cancel_targets(adir, _elements(adir))


def request_retry(adir: ArrayDir) -> list[int]:
    """Asks the driver to run the failed elements again; returns their indices.

    Raises:
        ValueError: the array was cancelled.
    """
    if adir.cancel_requested():
        raise ValueError(f"app handle: array {adir.array_id} was cancelled; nothing to retry")
    failed = [e.index for e in _elements(adir) if e.state == AppState.FAILED]
    if failed:
        adir.request_retry(failed)
        ensure_driver(adir)
    return failed
