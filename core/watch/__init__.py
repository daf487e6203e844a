"""Following a job: the one place for it.

* :class:`JobWatch` (:mod:`core.watch.job`): the loop that follows one job to its end, with a
  sync face (:meth:`JobWatch.run`) and an async one (:meth:`JobWatch.run_async`);
* :func:`status_poller` (:mod:`core.watch.polling`): the process's one batched status poller;
* :class:`LogFollower`, :class:`LogCursor`, :func:`lines_after`, :func:`stream_logs`
  (:mod:`core.watch.follow`): reading logs, resuming from a cursor;
* :class:`CursorStore` and its stores (:mod:`core.watch.cursors`): where a cursor is kept;
* :class:`SilenceWatch` (:mod:`core.watch.silence`): hang detection (``max_silence``);
* :class:`Progress` (:mod:`core.watch.progress`): what ``shipyard run --wait`` shows;
* :class:`AttemptsLog` (:mod:`core.watch.attempts`): each requeue of an app, told once.

``Runner.wait``, ``Runner.stream_logs``, the CLI, the Airflow operator, trigger and sensor, the
Prefect tasks and worker all use it. Nothing here imports Airflow or Prefect, nor
:mod:`core.runner` (what the watch needs of a runner is :class:`~core.watch.source.JobSource`).
"""

from __future__ import annotations

from core.errors import BackendUnavailableError, JobCancelledError, JobSilentError
from core.watch.attempts import AttemptsLog
from core.watch.cursors import CursorStore, FileCursorStore, MemoryCursorStore
from core.watch.follow import (
    DRAIN_TIMEOUT,
    LogCursor,
    LogFollower,
    LogLine,
    lines_after,
    stream_logs,
)
from core.watch.job import JobWatch, WatchEnd, is_interrupt
from core.watch.polling import StatusPoller, StatusWatch, status_poller
from core.watch.silence import (
    SilenceWatch,
    app_max_silence,
    check_max_silence,
    effective_max_silence,
)
from core.watch.source import JobSource

__all__ = [
    "AttemptsLog",
    "DRAIN_TIMEOUT",
    "BackendUnavailableError",
    "CursorStore",
    "FileCursorStore",
    "JobCancelledError",
    "JobSilentError",
    "JobSource",
    "JobWatch",
    "LogCursor",
    "LogFollower",
    "LogLine",
    "MemoryCursorStore",
    "SilenceWatch",
    "StatusPoller",
    "StatusWatch",
    "WatchEnd",
    "app_max_silence",
    "check_max_silence",
    "effective_max_silence",
    "is_interrupt",
    "lines_after",
    "status_poller",
    "stream_logs",
]
