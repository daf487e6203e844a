"""Waiting for an ended app's usage: a backend may record it a moment after the end."""

from __future__ import annotations

from core.reports import with_usage
from core.specs import AppState, AppStatus, ReplicaStatus, ResourceUsage, RoleStatus


def _status(usage: ResourceUsage | None) -> AppStatus:
    replica = ReplicaStatus(0, AppState.SUCCEEDED, "r", "h", usage=usage)
    return AppStatus(AppState.SUCCEEDED, roles=[RoleStatus("r", [replica])])


def test_usage_recorded_a_moment_after_the_end_is_waited_for() -> None:
    answers = [_status(None), _status(None), _status(ResourceUsage(wall_time=1.0))]
    asked = []

    def ask_again() -> AppStatus:
        asked.append(1)
        return answers[min(len(asked) - 1, 2)]

    got = with_usage(_status(None), ask_again)
    assert got.roles[0].replicas[0].usage == ResourceUsage(wall_time=1.0)
    assert len(asked) == 3


def test_usage_a_backend_never_records_is_not_waited_for_long() -> None:
    got = with_usage(_status(None), lambda: _status(None), wait=0.1)
    assert got.roles[0].replicas[0].usage is None
    measured = _status(ResourceUsage(cpu_time=2.0))
    assert with_usage(measured, lambda: None) is measured  # (not asked again)
