"""Each requeue of an app is told once, by the CLI's progress and by the log that the Airflow
operator and the Prefect tasks write (:class:`core.watch.AttemptsLog`)."""

from __future__ import annotations

import io
import logging

import pytest

from core.specs import AppState, AppStatus, Attempt
from core.watch import AttemptsLog
from core.watch.progress import Progress

FIRST = Attempt(0, "PREEMPTED", "preempted", "node2")
SECOND = Attempt(1, "NODE_FAIL", "node_failure", "node1")


def _statuses() -> list[AppStatus]:
    return [
        AppStatus(AppState.RUNNING),
        AppStatus(AppState.PENDING, num_restarts=1, attempts=[FIRST]),
        AppStatus(AppState.RUNNING, num_restarts=1, attempts=[FIRST]),
        AppStatus(AppState.SUCCEEDED, num_restarts=2, attempts=[FIRST, SECOND]),
    ]


def test_the_log_tells_each_requeue_once(caplog: pytest.LogCaptureFixture) -> None:
    told = AttemptsLog(logging.getLogger("t"), max_requeues=3)
    with caplog.at_level(logging.INFO, "t"):
        for status in _statuses():
            told(status)
    assert caplog.messages == [
        "attempt 0 ended: PREEMPTED (preempted) on node2; requeued as attempt 1 (max_requeues 3)",
        "attempt 1 ended: NODE_FAIL (node_failure) on node1; requeued as attempt 2 (max_requeues 3)",
    ]


@pytest.mark.parametrize("live", [False, True])
def test_progress_prints_each_requeue_on_a_line_of_its_own(live: bool) -> None:
    out = io.StringIO()
    progress = Progress(out, live=live)
    for status in _statuses():
        progress.update(status)
    lines = [line for line in out.getvalue().split("\n") if "requeued" in line]
    assert len(lines) == 2 and "attempt 0 ended: PREEMPTED (preempted) on node2" in lines[0]


def test_status_json_and_format_list_the_attempts() -> None:
    status = _statuses()[-1]
    assert status.to_json()["attempts"][0] == {
        "number": 0, "state": "PREEMPTED", "reason": "preempted", "nodes": "node2",
    }  # fmt: skip
    assert "  attempt 1: NODE_FAIL (node_failure) on node1" in status.format()
