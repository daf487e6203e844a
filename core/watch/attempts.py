"""Telling each requeue of an app once: :class:`AttemptsLog`, a watch's ``on_status`` for the
CLI, the Airflow operator and the Prefect tasks ("attempt 0 ended: PREEMPTED (preempted) on
node2; requeued as attempt 1 (max_requeues 2)")."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.specs import AppStatus, Attempt

__all__ = ["AttemptsLog", "attempt_line"]


def attempt_line(attempt: Attempt, max_requeues: int | None = None) -> str:
    """The line that tells ``attempt`` ended and the app was started again."""
    total = f" (max_requeues {max_requeues})" if max_requeues else ""
    return f"{attempt.format().replace(':', ' ended:', 1)}; requeued as attempt {attempt.number + 1}{total}"


class AttemptsLog:
    """Logs each ended attempt of the statuses it is given, once (``max_requeues``: the app's,
    when known, said with each)."""

    def __init__(self, logger: logging.Logger | Any, max_requeues: int | None = None) -> None:
        self.logger = logger
        self.max_requeues = max_requeues
        self.told = 0

    def __call__(self, status: AppStatus) -> None:
        for attempt in status.attempts[self.told :]:
            self.logger.info("%s", attempt_line(attempt, self.max_requeues))
        self.told = max(self.told, len(status.attempts))
