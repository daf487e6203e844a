"""One rule for transient backend errors: which they are, and how long they are retried.

A transient error says nothing about the job: the backend could not be reached or did not
answer this time (a timed-out ``squeue``, a Docker engine answering 5xx or restarting, a dropped
SSH connection). Callers retry it with backoff and never report it as a job state; once the
budget is spent they raise one :class:`BackendUnavailableError` naming what failed and how often.

Everything that waits on a job (:class:`core.watch.JobWatch`: the runner's ``wait``, the CLI,
the Airflow and Prefect integrations) goes through :func:`is_transient`, :func:`backoff` and
:func:`retry_budget`; a single call retried in place uses :func:`call_with_retries`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from core.errors import BackendUnavailableError

if TYPE_CHECKING:
    from tenacity import RetryCallState

log = logging.getLogger(__name__)

__all__ = [
    "BACKOFF_MAX",
    "BUDGET",
    "BackendUnavailableError",
    "backoff",
    "call_with_retries",
    "is_transient",
    "parse_budget",
    "retry_budget",
]

T = TypeVar("T")

#: seconds a backend may keep failing transiently before a caller gives up, unless
#: ``$SHIPYARD_RETRY_BUDGET`` says otherwise (see :func:`retry_budget`)
BUDGET = 120.0
#: longest pause between two tries
BACKOFF_MAX = 15.0


def retry_budget() -> float:
    """Seconds transient failures are retried: ``$SHIPYARD_RETRY_BUDGET`` or :data:`BUDGET`.

    Raises:
        ValueError: naming the variable when it is not a non-negative number.
    """
    raw = os.environ.get("SHIPYARD_RETRY_BUDGET", "").strip()
    if not raw:
        return BUDGET
    return parse_budget(raw, "SHIPYARD_RETRY_BUDGET")


def parse_budget(raw: str, where: str) -> float:
    """A retry budget's seconds from its text (a finite number >= 0).

    Raises:
        ValueError: naming ``where`` (the variable or option it came from).
    """
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{where}: expected seconds (a number >= 0), got {raw!r}")
    return value


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _is_requests_connection_error(exc: BaseException) -> bool:
    requests = sys.modules.get("requests")  # only loaded when a backend uses it
    if requests is None:
        return False
    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth another try: the backend was unreachable or answered with a
    server error (HTTP 5xx, e.g. a Docker engine), not a verdict on the request."""
    if isinstance(exc, BackendUnavailableError | ConnectionError | TimeoutError):
        return True
    subprocess = sys.modules.get("subprocess")  # (a TimeoutExpired means it was loaded)
    if subprocess is not None and isinstance(exc, subprocess.TimeoutExpired):
        return True
    if _is_requests_connection_error(exc):
        return True
    status = _http_status(exc)
    return status is not None and status >= 500


def backoff(failures: int, first_delay: float = 0.5) -> float:
    """Seconds to wait before the next try after ``failures`` consecutive failures: doubling
    from ``first_delay`` up to :data:`BACKOFF_MAX`."""
    return float(min(first_delay * 2 ** max(failures - 1, 0), BACKOFF_MAX))


def _log_retry(state: RetryCallState) -> None:
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    log.warning("%s (try %d); retrying", exc, state.attempt_number)


def call_with_retries(
    fn: Callable[[], T], what: str, budget: float | None = None, first_delay: float = 0.5
) -> T:
    """``fn()``, tried again with backoff while it fails transiently, for up to ``budget`` s
    (default: :func:`retry_budget`).

    Raises:
        BackendUnavailableError: the budget is spent (naming ``what`` and the last error).
        BaseException: whatever ``fn`` raised that is not transient, at once.
    """
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    retrying = Retrying(
        stop=stop_after_delay(retry_budget() if budget is None else budget),
        wait=wait_exponential(multiplier=first_delay, max=BACKOFF_MAX),
        retry=retry_if_exception(is_transient),
        before_sleep=_log_retry,
        reraise=True,
    )
    try:
        return retrying(fn)
    except BaseException as e:
        if is_transient(e) and not isinstance(e, BackendUnavailableError):
            raise BackendUnavailableError(f"{what}: {e}") from e
        raise
