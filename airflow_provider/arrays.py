"""What ``ShipyardOperator`` does for an array (``array_size``/``array_params``): submit it once
per task instance (a retry runs the failed elements again), log the counts as they change and
the last lines of each failed element, push ``array_states`` and ``result`` (one entry per
element), and fail past ``allow_failures``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import AirflowException

from core.runner import Runner, attempt_key
from core.specs import AppDef, AppHandle, AppState, AppStatus

__all__ = ["ArrayArgs", "CountsLog", "finish_array", "submit_array"]


class ArrayArgs:
    """The operator's array arguments, after templating."""

    def __init__(self, size: Any, params: Any, max_parallel: Any) -> None:
        if isinstance(params, str):  # (a template renders to text: JSON)
            try:
                params = json.loads(params)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"array_params: expected a list of mappings or JSON of one ({e})"
                ) from None
        self.size, self.params, self.max_parallel = size, params, max_parallel

    @property
    def wanted(self) -> bool:
        """Whether the task runs an array."""
        return self.size is not None or self.params is not None


def submit_array(
    runner: Runner,
    app: AppDef,
    scheduler: str,
    cfg: dict[str, Any],
    args: ArrayArgs,
    base: str,
    try_number: int,
    after: list[str] | None,
    log: Any,  # (the task's logger)
) -> AppHandle:
    """The task instance's array: submitted by its first try (key ``base``); a later try gets
    it again and runs its failed elements again (a cancelled one: a new array, key ``base:n``)."""
    handle = runner.run_array(
        app, scheduler, cfg, size=args.size, params=args.params,
        max_parallel=args.max_parallel, idempotency_key=base, after=after,
    )  # fmt: skip
    status = runner.status(handle)
    if try_number > 1 and status is not None and status.state == AppState.FAILED:
        log.info("try %d: running the failed elements of %s again", try_number, handle)
        log.info("elements run again: %s", runner.retry_failed(handle))
    elif try_number > 1 and status is not None and status.state == AppState.CANCELLED:
        handle = runner.run_array(
            app, scheduler, cfg, size=args.size, params=args.params,
            max_parallel=args.max_parallel, idempotency_key=attempt_key(base, try_number),
            after=after,
        )  # fmt: skip
        log.info("try %d: %s was cancelled; submitted a new array", try_number, handle)
    return handle


class CountsLog:
    """Logs an array's counts each time they change (a watch's ``on_status``)."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.last: dict[str, int] | None = None

    def __call__(self, status: AppStatus) -> None:
        counts = status.counts()
        if counts != self.last and status.elements is not None:
            self.last = counts
            text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            self.log.info("elements: %s (of %d)", text, len(status.elements))


def finish_array(
    runner: Runner,
    handle: AppHandle,
    status: AppStatus,
    allow_failures: int,
    log: Any,  # (the task's logger)
    push: Callable[[str, Any], None],
    result_key: str | None = "result",
) -> list[dict[str, dict[str, Any]] | None] | None:
    """Pushes ``array_states`` (and the results under ``result_key``, unless None) through
    ``push``, logs each failed element's last lines, and fails the task if more than
    ``allow_failures`` elements did not succeed; returns the results, one per element (None
    when ``result_key`` is None and nothing needs them: see ``want_results``)."""
    elements = status.elements or []
    push("array_states", [e.state.name for e in elements])
    results = [_result(runner, e.handle) for e in elements] if want_results(push) else None
    if result_key is not None and results is not None:
        push(result_key, results)
    bad = [e for e in elements if e.state != AppState.SUCCEEDED]
    for e in bad:
        log.warning("element %d %s: %s", e.index, e.state.name, e.msg or f"exit {e.exit_code}")
        if e.handle:
            for replica, lines in runner.last_lines(e.handle, n=10).items():
                for line in lines:
                    log.warning("[%d] %s %s", e.index, replica, line.rstrip("\n"))
    if status.state == AppState.CANCELLED or len(bad) > allow_failures:
        raise AirflowException(
            f"{handle} {status.state.name}: {len(bad)} of {len(elements)} elements did not"
            f" succeed (allow_failures={allow_failures}). {status.msg}".rstrip()
        )
    log.info("%s: %d of %d elements succeeded", handle, len(elements) - len(bad), len(elements))
    return results


def want_results(push: Callable[[str, Any], None]) -> bool:
    """Whether the elements' results are wanted: not when ``push`` pushes nothing (an
    operator's ``do_xcom_push=False``: Airflow drops its return value too)."""
    return bool(getattr(push, "enabled", True))


def _result(runner: Runner, handle: str | None) -> dict[str, dict[str, Any]] | None:
    """An element's result XCom entry: ``{role: {replica id: value}}`` (None: none read)."""
    if handle is None:
        return None
    try:
        found = runner.result(handle)
    except (NotImplementedError, ValueError):  # a backend without results; an unknown app
        return None
    return {role: {str(k): v for k, v in by_id.items()} for role, by_id in found.values().items()}
