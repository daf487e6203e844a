"""What ``ShipyardOperator`` makes of an ended job, apart from waiting on it: which exit code a
failed job ended with (``skip_on_exit_code``), the result as an XCom value (``return_result``),
and the XComs it pushes by hand, which ``do_xcom_push=False`` turns off (no Airflow imports).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from typing import Any

from core.reports import AppResult
from core.specs import AppState, AppStatus, Reason

__all__ = ["XComs", "failed_exit_code", "result_value", "skip_exit_codes"]


def skip_exit_codes(value: int | Container[int] | None) -> frozenset[int]:
    """``skip_on_exit_code`` as a set of exit codes (an int, or a collection of ints, as
    Airflow's DockerOperator and KubernetesPodOperator take it; None: none).

    Raises:
        ValueError: naming the argument when a code is not an int.
    """
    if value is None:
        return frozenset()
    items: Iterable[Any] = [value] if isinstance(value, int) else value  # type: ignore[assignment]
    try:
        codes = list(items)
    except TypeError:
        codes = [value]
    bad = [c for c in codes if isinstance(c, bool) or not isinstance(c, int)]
    if bad:
        raise ValueError(
            f"skip_on_exit_code: expected an exit code or a list of exit codes, got {value!r}"
        )
    return frozenset(codes)


def failed_exit_code(status: AppStatus | None) -> int | None:
    """The exit code a FAILED app ended with: its failing replica's (the first, in role order,
    that failed by its own exit code rather than being stopped after another one failed), else
    the first non-zero one; None for an app that did not fail, or without one."""
    if status is None or status.state != AppState.FAILED:
        return None
    replicas = [r for rs in status.roles for r in rs.replicas if r.exit_code not in (None, 0)]
    for pick in (
        lambda r: r.state == AppState.FAILED and r.reason == Reason.EXIT_CODE,
        lambda r: r.state == AppState.FAILED,
        lambda r: True,
    ):
        for replica in replicas:
            if pick(replica):
                return replica.exit_code
    return None


def result_value(result: AppResult | None) -> dict[str, dict[str, Any]] | None:
    """A job's result as an XCom value, ``{role: {replica id: value}}`` (ids as strings, as
    JSON has them); None for a scheduler that collects no results."""
    if result is None:
        return None
    return {role: {str(k): v for k, v in by_id.items()} for role, by_id in result.values().items()}


class XComs:
    """The XComs an operator pushes by hand (``app_id``, ``state``, ``result`` ...): pushed
    only when ``enabled`` (the task's ``do_xcom_push``), as Airflow does with the return value.

    Args:
        push: the task instance's ``xcom_push``
        enabled: the task's ``do_xcom_push``
    """

    def __init__(self, push: Callable[..., Any], enabled: bool) -> None:
        self._push = push
        self.enabled = bool(enabled)

    def __call__(self, key: str, value: Any) -> None:
        """Pushes ``value`` as XCom ``key`` (nothing when disabled)."""
        if self.enabled:
            self._push(key=key, value=value)
