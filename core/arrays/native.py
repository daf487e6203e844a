"""Arrays the backend runs itself (Slurm's ``sbatch --array``): one submission for many elements,
the cap kept by the backend. The driver still records every element's state and takes cancel
and retry requests; what it submits is one native array per round of pending elements (the
first by the submitter itself, the failed ones again once nothing of the array runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.arrays.spec import ArraySpec, array_template
from core.arrays.store import ArrayDir
from core.specs import AppDef, AppState, ElementStatus, make_app_handle

if TYPE_CHECKING:
    from core.schedulers.api import Scheduler

__all__ = ["native_key", "submit_native", "take_natives"]


def take_natives(adir: ArrayDir, elements: list[ElementStatus], seen: int) -> int:
    """Gives the elements of the array's native submissions after its first ``seen`` their
    handles (SUBMITTED, one attempt more); returns how many submissions there are."""
    n = seen
    while (record := adir.native(n + 1)) is not None:
        for index, app_id in record["elements"]:
            e = elements[index]
            e.handle = make_app_handle(adir.backend, adir.session, app_id)
            e.state, e.msg, e.reason = AppState.SUBMITTED, "", None
            e.attempts += 1
        n += 1
    return n


def native_key(array_id: str, n: int) -> str:
    """The idempotency key of the ``n``-th native submission of an array: a submitter and a
    driver that both make it get one backend array."""
    return f"{array_id}[native]:{n}"


def submit_native(
    adir: ArrayDir,
    sched: Scheduler[Any],
    n: int,
    indices: list[int],
    keyed: bool = True,
    app: AppDef | None = None,
) -> dict[str, Any]:
    """Submits elements ``indices`` as the array's ``n``-th native array and records it
    (``native-<n>.json``); returns the record (``array``: its app id; ``elements``: pairs of
    index and element app id). ``keyed``: with the submission's idempotency key, so that
    whoever makes it again gets the same (a driver's submissions, and a keyed array's first;
    an array without a key has its first made once, by its submitter, before any driver runs:
    its handle was never returned if the submitter died before recording it). ``app``: the
    array's app, if the caller has it (else read from the array's request).

    Raises:
        ValueError: the backend refused the array (the message names why).
    """
    from core.appfile import app_from_dict

    request = adir.request() or {}
    app = app or app_from_dict(request["app"])
    key = native_key(adir.array_id, n) if keyed else None
    if request.get("single"):  # (an app held by the backend until its dependencies end)
        array = sched.schedule(sched.submit_dryrun(app, request["cfg"], key))
        ids = [array]
    else:
        spec = ArraySpec.from_json(request["spec"])
        handle = make_app_handle(adir.backend, adir.session, adir.array_id)
        template = array_template(app, spec, indices, handle)
        cap = spec.max_parallel
        array, ids = sched.submit_array(app, request["cfg"], template, indices, cap, key)
    record = {"array": array, "elements": [[i, a] for i, a in zip(indices, ids, strict=True)]}
    adir.write_native(n, record)
    return record
