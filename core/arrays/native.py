"""Arrays the backend runs itself (Slurm's ``sbatch --array``): one submission for many elements,
the cap kept by the backend. The driver still records every element's state and takes cancel
and retry requests; what it submits is one native array per round of pending elements (the
first by the submitter itself, the failed ones again once nothing of the array runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.arrays.spec import ArraySpec, array_template
from core.arrays.store import ArrayDir
from core.specs import AppDef, AppState, ElementStatus, make_app_handle

if TYPE_CHECKING:
    from core.runner import Runner
    from core.schedulers.api import Scheduler

__all__ = [
    "first_submission",
    "native_after",
    "native_key",
    "submit_native",
    "take_natives",
]


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


def first_submission(
    sched: Scheduler[Any], size: int, keyed: bool, app: AppDef
) -> Callable[[ArrayDir], None]:
    """What makes an array's (or a held app's) first native submission in the submitting
    process (``keyed``: the caller gave an idempotency key, see :func:`submit_native`)."""

    def submit(adir: ArrayDir) -> None:
        submit_native(adir, sched, 1, list(range(size)), keyed, app)

    return submit


def native_after(
    runner: Runner, scheduler: str, after: list[str] | None, condition: str, cfg: Any
) -> dict[str, Any] | None:
    """The run options that make ``scheduler`` itself hold an app until ``after`` ended
    (Slurm's ``--dependency``), if it can: each dependency an app (or an array of one native
    submission) of that backend that has not ended yet. None: a driver holds the app."""
    from core.arrays import is_array_id, native_app_id
    from core.specs import parse_app_handle

    ids = []
    for h in after or []:
        p = parse_app_handle(h)
        app_id = (
            native_app_id(p.scheduler_backend, p.session_name, p.app_id)
            if is_array_id(p.app_id)
            else p.app_id
        )
        if p.scheduler_backend != scheduler or app_id is None:
            return None
        ids.append(app_id)
    statuses = runner.status_many(after or [])
    if not ids or any(s is None or s.is_terminal() for s in statuses.values()):
        return None  # (an ended job may be gone from the controller: Slurm then runs at once)
    sched = runner.scheduler(scheduler)
    return sched.native_after(ids, condition, sched.resolve_cfg(cfg))
