"""Following an app's logs, resuming where an earlier follower stopped.

A :class:`LogCursor` counts, per replica (``role/k``), how many of its log lines were already
delivered (e.g. written to an Airflow task log). It is a plain ``{"role/k": n}`` mapping, so it
travels in a trigger's serialized kwargs, a trigger event, an XCom or a checkpoint file (see
:mod:`core.watch.cursors`). A :class:`LogFollower` reads each replica's log in a thread of its
own and hands ``(index, LogLine)`` items to a sink; :func:`lines_after` gives what a cursor has
not delivered yet from the complete logs of an app that ended.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from core.specs import AppHandle
from core.watch.source import JobSource, LineSource

log = logging.getLogger(__name__)

__all__ = [
    "DRAIN_TIMEOUT",
    "END",
    "LogCursor",
    "LogFollower",
    "LogLine",
    "lines_after",
    "stream_logs",
]

#: what a :class:`LogFollower` delivers after the last line of every replica
END: Any = object()
#: how long a watch gives a follower to deliver the last lines of an app that ended
DRAIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class LogLine:
    """One log line of one replica."""

    role: str
    replica: int
    line: str

    @property
    def prefix(self) -> str:
        """``role/replica``"""
        return f"{self.role}/{self.replica}"

    def __str__(self) -> str:
        return f"{self.prefix} {self.line.rstrip(chr(10))}"


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

    def copy(self) -> LogCursor:
        """A cursor at the same place, moving on its own."""
        return LogCursor(self._counts)

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
    """Reads replicas' logs, one daemon thread each, handing ``(index, LogLine)`` to ``sink``.

    ``index`` is the line's 0-based number in its replica's log (among the lines matching
    ``regex``, with one); lines before ``start_at`` are not handed on. :data:`END` follows once
    every replica added was read to its end (or failed: see :attr:`errors`) and :meth:`close`
    was called, or at once after :meth:`stop`. ``sink`` runs in the reading threads: it hands
    the items over to the consumer (the watch's inbox).

    Args:
        source: reads one replica's lines (a runner)
        handle: the app
        sink: receives ``(index, LogLine)`` items, then :data:`END`
        start_at: lines already delivered (not handed on again)
        regex: only lines matching it
        should_tail: follow until the app ends (False: what is there now)
        streams: which output streams (see ``Scheduler.log_iter``)
        since: only lines from then on (where the backend knows when a line came)
    """

    def __init__(
        self,
        source: LineSource,
        handle: AppHandle,
        sink: Callable[[Any], None],
        start_at: LogCursor | None = None,
        *,
        regex: str | None = None,
        should_tail: bool = True,
        streams: Any = None,
        since: Any = None,
    ) -> None:
        self.handle = handle
        self._since = since
        self._source = source
        self._sink = sink
        self._start = start_at or LogCursor()
        self._regex, self._should_tail, self._streams = regex, should_tail, streams
        self._lock = threading.Lock()
        self._following: set[tuple[str, int]] = set()
        self._running = 0
        self._closed = False
        self._ended = False
        self._stop = threading.Event()
        #: why reading a replica failed, by ``role/k``
        self.errors: dict[str, Exception] = {}

    @property
    def replicas(self) -> set[tuple[str, int]]:
        """The replicas added so far."""
        with self._lock:
            return set(self._following)

    def add(self, replicas: Iterator[tuple[str, int]] | list[tuple[str, int]]) -> None:
        """Starts reading the replicas not read yet (a daemon thread each: a log tail never
        keeps a process alive)."""
        for role, k in replicas:
            with self._lock:
                if (role, k) in self._following or self._closed or self._stop.is_set():
                    continue
                self._following.add((role, k))
                self._running += 1
            threading.Thread(
                target=self._read, args=(role, k), daemon=True, name=f"logs-{role}-{k}"
            ).start()

    def close(self) -> None:
        """No more replicas will be added: :data:`END` follows once those added are read."""
        with self._lock:
            self._closed = True
            done = self._running == 0
        if done:
            self._end()

    def stop(self) -> None:
        """Stops handing lines on (each thread ends at its next line); :data:`END` follows."""
        self._stop.set()
        self._end()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def _end(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        try:
            self._sink(END)
        except Exception:  # the consumer is gone (e.g. its event loop closed)
            pass

    def _read(self, role: str, k: int) -> None:
        skip = self._start.get(role, k)
        try:
            lines = self._source.log_lines(
                self.handle,
                role,
                k,
                regex=self._regex,
                since=self._since,
                should_tail=self._should_tail,
                streams=self._streams,
            )
            for index, text in enumerate(lines):
                if self._stop.is_set():
                    return
                if index >= skip:
                    self._sink((index, LogLine(role, k, text)))
        except Exception as e:  # one unreadable replica must not stop the others
            self.errors[LogCursor.key(role, k)] = e
            log.warning("cannot read the logs of %s %s/%d: %s", self.handle, role, k, e)
        finally:
            with self._lock:
                self._running -= 1
                done = self._closed and self._running == 0
            if done:
                self._end()


def lines_after(
    source: JobSource,
    handle: AppHandle,
    cursor: LogCursor,
    replicas: list[tuple[str, int]] | None = None,
    regex: str | None = None,
) -> list[tuple[int, LogLine]]:
    """The lines of the complete logs of ``replicas`` (default: every replica) after
    ``cursor``, as ``(index, LogLine)``: for an app that ended, what a follower that stopped at
    ``cursor`` has not delivered.

    Raises:
        Exception: whatever the backend raises when the logs cannot be read.
    """
    out: list[tuple[int, LogLine]] = []
    for role, k in source.replicas(handle) if replicas is None else replicas:
        skip = cursor.get(role, k)
        for i, text in enumerate(source.log_lines(handle, role, k, regex=regex)):
            if i >= skip:
                out.append((i, LogLine(role, k, text)))
    return out


def stream_logs(
    source: JobSource,
    handle: AppHandle,
    replicas: list[tuple[str, int]],
    *,
    should_tail: bool = True,
    regex: str | None = None,
    streams: Any = None,
    since: Any = None,
) -> Iterator[LogLine]:
    """The lines of ``replicas``, interleaved as they arrive, each replica's in order (see
    :meth:`core.runner.Runner.stream_logs`). A replica whose log cannot be read is logged as
    a warning and skipped; the others go on."""
    if not replicas:
        return
    inbox: queue.Queue[Any] = queue.Queue(maxsize=10000)
    gone = threading.Event()

    def put(item: Any) -> None:  # (bounded: a reader waits for the consumer, unless it left)
        while not gone.is_set():
            try:
                inbox.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    follower = LogFollower(
        source, handle, put, regex=regex, should_tail=should_tail, streams=streams, since=since
    )
    follower.add(replicas)
    follower.close()
    try:
        while (item := inbox.get()) is not END:
            yield item[1]
    finally:
        gone.set()
        follower.stop()
