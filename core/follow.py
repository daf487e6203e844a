"""Following an app's logs from any process, resuming where an earlier follower stopped.

A :class:`LogCursor` counts, per replica (``role/k``), how many of its log lines were already
delivered (e.g. written to an Airflow task log). It is a plain ``{"role/k": n}`` mapping, so it
travels in a trigger's serialized kwargs, a trigger event or an XCom; a follower started with
it delivers only the lines after it, each replica's lines in order. :func:`lines_after` gives
the same from the complete logs of an app that ended, so a consumer that resumes elsewhere can
add exactly what is missing.

Nothing here imports Airflow or Prefect.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from core.polling import status_poller
from core.runner import LogLine, Runner, get_runner
from core.specs import AppHandle

log = logging.getLogger(__name__)

__all__ = ["DRAIN_TIMEOUT", "END", "LogCursor", "LogFollower", "lines_after"]

#: what a :class:`LogFollower` delivers after its last line
END: Any = object()
#: how long a waiter gives a follower to deliver the last lines of an app that ended
DRAIN_TIMEOUT = 30.0


class LogCursor:
    """Lines already delivered, per replica (``role/k`` -> count)."""

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self._counts: dict[str, int] = {}
        for key, n in (counts or {}).items():
            if not isinstance(key, str) or isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"log cursor: expected 'role/k': count, got {key!r}: {n!r}")
            if n:
                self._counts[key] = n

    @staticmethod
    def key(role: str, replica: int) -> str:
        """``role/replica``, the key of one replica."""
        return f"{role}/{replica}"

    def get(self, role: str, replica: int) -> int:
        """How many lines of the replica were delivered."""
        return self._counts.get(self.key(role, replica), 0)

    def accept(self, index: int, line: LogLine) -> bool:
        """Whether line number ``index`` (0-based) of its replica is the next one to deliver;
        if so the cursor moves past it. A line already delivered returns False."""
        key = self.key(line.role, line.replica)
        n = self._counts.get(key, 0)
        if index < n:
            return False
        if index > n:
            # lines in between were never seen (a follower that lost them): deliver this one
            # anyway rather than hold everything after it back
            log.warning("log cursor: %s jumped from line %d to %d", key, n, index)
        self._counts[key] = index + 1
        return True

    def to_dict(self) -> dict[str, int]:
        """The cursor as a JSON-able mapping (what ``LogCursor(mapping)`` takes back)."""
        return dict(self._counts)

    def merged(self, other: Mapping[str, int] | LogCursor | None) -> LogCursor:
        """A cursor at the later position of both, replica by replica."""
        theirs = other.to_dict() if isinstance(other, LogCursor) else dict(other or {})
        out = dict(self._counts)
        for key, n in theirs.items():
            if isinstance(n, int) and not isinstance(n, bool) and n > out.get(key, 0):
                out[key] = n
        return LogCursor(out)

    @property
    def total(self) -> int:
        """Lines delivered, all replicas together."""
        return sum(self._counts.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogCursor) and self._counts == other._counts

    def __repr__(self) -> str:
        return f"LogCursor({self._counts!r})"


class LogFollower:
    """Follows an app's logs in a daemon thread, after ``start_at``.

    Each line goes to ``sink`` as ``(index, LogLine)``, ``index`` being its 0-based number in
    its replica's log; lines before ``start_at`` are not delivered. :data:`END` follows the
    last line (the app ended and its logs were read, the follower was stopped, or following
    failed: see :attr:`error`). ``sink`` runs in the follower's thread: hand the items over to
    the consumer (``queue.put``, ``loop.call_soon_threadsafe``).

    An app that has no replicas yet (queued on Slurm) is waited on through
    :func:`core.polling.status_poller` until it has, or ended.

    Args:
        handle: the app
        sink: receives ``(index, LogLine)`` items, then :data:`END`
        start_at: lines already delivered (not delivered again)
        runner_factory: makes the runner the thread uses (one of its own)
        close_runner: close that runner at the end (False: it is the caller's, shared)
        role: only this role's replicas
        replica: only this replica (of ``role``)
        regex: only lines matching it (indexes then count matching lines)
        should_tail: follow until the app ends (False: what is there now)
    """

    def __init__(
        self,
        handle: AppHandle,
        sink: Callable[[Any], None],
        start_at: LogCursor | None = None,
        runner_factory: Callable[[], Runner] = get_runner,
        *,
        close_runner: bool = True,
        role: str | None = None,
        replica: int | None = None,
        regex: str | None = None,
        should_tail: bool = True,
    ) -> None:
        self.handle = handle
        self._close_runner = close_runner
        self._sink = sink
        self._start = start_at or LogCursor()
        self._runner_factory = runner_factory
        self._role, self._replica = role, replica
        self._regex, self._should_tail = regex, should_tail
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: why following failed, if it did
        self.error: Exception | None = None

    def start(self) -> LogFollower:
        """Starts the thread (a daemon: a log tail never keeps a process alive)."""
        self._thread = threading.Thread(
            target=self._follow, daemon=True, name=f"follow-{self.handle}"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops delivering (the thread ends at its next line)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def is_alive(self) -> bool:
        """Whether the thread still follows."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Waits up to ``timeout`` seconds for the thread to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _wait_for_replicas(self, runner: Runner) -> None:
        with status_poller().watch(self.handle, 1.0, runner=runner) as watch:
            while not self._stop.is_set():
                fresh, status = watch.next(0.2)
                if fresh and (status is None or status.is_terminal() or status.roles):
                    return

    def _lines(self, runner: Runner) -> Iterator[LogLine]:
        if self._role is not None and self._replica is not None:
            role, k = self._role, self._replica
            for text in runner.log_lines(
                self.handle, role, k, regex=self._regex, should_tail=self._should_tail
            ):
                yield LogLine(role, k, text)
            return
        for line in runner.stream_logs(
            self.handle, should_tail=self._should_tail, regex=self._regex
        ):
            if self._role is None or line.role == self._role:
                yield line

    def _follow(self) -> None:
        seen: dict[str, int] = {}
        runner = self._runner_factory()
        try:
            if self._should_tail:
                self._wait_for_replicas(runner)
            for line in self._lines(runner):
                if self._stop.is_set():
                    break
                key = LogCursor.key(line.role, line.replica)
                index = seen.get(key, 0)
                seen[key] = index + 1
                if index >= self._start.get(line.role, line.replica):
                    self._sink((index, line))
        except Exception as e:
            self.error = e
            log.warning("cannot follow the logs of %s: %s", self.handle, e)
        finally:
            if self._close_runner:
                runner.close()
            try:
                self._sink(END)
            except Exception:  # the consumer is gone (e.g. its event loop closed)
                pass


def lines_after(runner: Runner, handle: AppHandle, cursor: LogCursor) -> list[tuple[int, LogLine]]:
    """The lines of every replica's complete log after ``cursor``, as ``(index, LogLine)``.

    For an app that ended: what a follower that stopped at ``cursor`` has not delivered.

    Raises:
        Exception: whatever the backend raises when the logs cannot be read.
    """
    out: list[tuple[int, LogLine]] = []
    for role, k in runner.replicas(handle):
        skip = cursor.get(role, k)
        for i, text in enumerate(runner.log_lines(handle, role, k)):
            if i >= skip:
                out.append((i, LogLine(role, k, text)))
    return out
