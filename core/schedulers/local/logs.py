"""Reading a local replica's logs: :class:`LogIterator`, which ``LocalScheduler.log_iter``
returns (follows a file until the app ends; ``since``/``until`` through the collector's time
index; only ``\\n`` ends a line, and lines are whole whatever their length).

The combined stream is the collector's: only what its index committed is read. If the
collector could not write (a full log disk), the combined stream is what it committed, then
the rest of stdout and of stderr: what was written is still returned, and one warning names
the log directory.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from core.schedulers.api import Stream
from core.schedulers.local.appdir import AppDir
from core.schedulers.local.collector import ERROR_FILE, LogDirFullError, collect, read_index
from core.specs import is_terminal

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger(__name__)

__all__ = ["LogIterator", "split_lines"]

_CHUNK = 1 << 20
#: how often a reader waiting for the collector wakes it (an idle app's collector sleeps longer)
_WAKE_EVERY = 0.25

# Besides \n, str.splitlines also splits on these (UTF-8 encoded); log lines end only at \n.
_OTHER_LINE_BREAKS = (b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\xc2\x85",
                      b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # fmt: skip


def split_lines(data: bytes) -> list[str]:
    """Lines of ``data`` (which ends with ``\\n``), decoded, each keeping its ``\\n``."""
    text = data.decode("utf-8", "replace")
    if not any(sep in data for sep in _OTHER_LINE_BREAKS):
        return text.splitlines(keepends=True)
    parts = text.split("\n")
    parts.pop()
    return [p + "\n" for p in parts]


class LogIterator:
    """Iterates over the lines of one replica's log file (see ``LocalScheduler.log_iter``).

    Args:
        app_id: the app
        regex: keep only lines matching this (``re.search``); '' keeps every line
        log_file: the log file to read
        scheduler: the scheduler (asked whether the app ended)
        should_tail: follow the file until the app is terminal
        since, until: only lines the collector saw in this time window
        stream: which stream ``log_file`` is
        replica: the replica's index in the app (for the time index)
        app_dir: the app's directory
    """

    def __init__(
        self,
        app_id: str,
        regex: str,
        log_file: str,
        scheduler: Any,
        should_tail: bool = True,
        since: datetime | None = None,
        until: datetime | None = None,
        stream: Stream | None = None,
        replica: int | None = None,
        app_dir: str | None = None,
    ) -> None:
        self._app_id = app_id
        self._pattern = re.compile(regex) if regex else None
        self._log_file = log_file
        self._scheduler = scheduler
        self._should_tail = should_tail
        self._since = since.timestamp() if since is not None else None
        self._until = until.timestamp() if until is not None else None
        self._stream = stream or Stream.COMBINED
        self._replica = replica
        root, _, name = (app_dir or "").rstrip("/").rpartition("/")
        self._app = AppDir(root, name) if app_dir else None
        self._it: Iterator[str] | None = None
        self._index_off = 0
        self._committed_end = 0
        self._spawned = False
        self._failure: str | None = None  # why the combined log stops early (a full disk)
        self._woken = 0.0  # when this reader last woke the collector

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self._blocks())

    def __next__(self) -> str:
        if self._it is None:
            self._it = iter(self)
        return next(self._it)

    # -- completion -------------------------------------------------------------------------

    def _app_ended(self) -> bool:
        ended = getattr(self._scheduler, "app_ended", None)
        if ended is not None:
            return bool(ended(self._app_id))
        desc = self._scheduler.describe(self._app_id)
        return desc is None or is_terminal(desc.state)

    def _collector_failed(self) -> bool:
        if self._failure is None and self._app is not None:
            text = self._app.read(ERROR_FILE)
            self._failure = text.strip() if text else None
        return self._failure is not None

    def _collected(self) -> bool:
        """True once the collector consumed everything (finishing its work if it is gone)."""
        app = self._app
        if app is None or os.path.exists(app.file(AppDir.LOGS_DONE)) or self._collector_failed():
            return True
        if not self._app_ended():
            self._ensure_collector()
            return False
        try:
            collect(app.path, follow=False)
        except LogDirFullError as e:
            self._failure = e.strerror
        return (
            not app.exists()
            or os.path.exists(app.file(AppDir.LOGS_DONE))
            or self._collector_failed()
        )

    def _ensure_collector(self) -> None:
        """Starts a collector for a running app whose collector is gone (e.g. its submitter
        was killed before it started one); once per iterator."""
        app = self._app
        if self._spawned or app is None:
            return
        made = app.record_mtime()
        if made is None or time.time() - made < 2.0 or app.collector_alive():
            return  # (the submitting process starts it right after submit)
        self._spawned = True
        self._scheduler.start_collector(app.path)

    def _complete(self) -> bool:
        """True when no more bytes will be appended to the file being read."""
        if self._replica is None:
            return self._app_ended()
        if self._stream is Stream.COMBINED or self._since is not None or self._until is not None:
            return self._collected()
        return self._app_ended()

    # -- reading ----------------------------------------------------------------------------

    def _blocks(self) -> Iterator[list[str]]:
        if self._replica is not None and (self._since is not None or self._until is not None):
            yield from self._read_windowed()
            return
        combined = self._stream is Stream.COMBINED and self._replica is not None
        if combined and not self._should_tail:
            self._wait_collected()  # a finished app's combined log is whole once collected
        yield from self._read_range(self._log_file, 0, None, self._should_tail, combined)
        if combined and self._collector_failed():
            yield from self._uncollected()

    def _uncollected(self) -> Iterator[list[str]]:
        """What the replica wrote that a collector which could not write never moved into the
        combined log: the rest of stdout, then the rest of stderr."""
        assert self._app is not None and self._replica is not None
        entries, _ = read_index(self._app.index_file(self._replica))
        out_off, err_off = (entries[-1][1], entries[-1][2]) if entries else (0, 0)
        base = self._log_file[: -len(".combined.log")]
        log.warning("%s", self._failure)
        yield from self._read_range(f"{base}.stdout.log", out_off, None, False, False)
        yield from self._read_range(f"{base}.stderr.log", err_off, None, False, False)

    def _wait_collected(self) -> None:
        if not self._app_ended():
            return
        deadline = time.monotonic() + 30.0
        delay = 0.001
        while not self._collected() and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _filter(self, lines: list[str]) -> list[str]:
        return lines if self._pattern is None else list(filter(self._pattern.search, lines))

    def _read_range(
        self, path: str, start: int, end: int | None, follow: bool, committed_only: bool
    ) -> Iterator[list[str]]:
        """Lines of bytes [start, end) of ``path``; with ``follow`` (and no end) waits for more
        until :meth:`_complete`. ``committed_only``: read only what the collector's index
        committed (a collector that dies may leave bytes its successor rewrites)."""
        limit_of: Callable[[], int | None] = (
            self._committed if committed_only and end is None else (lambda: end)
        )
        f = None
        pos, pending = start, b""
        delay, finishing = 0.002, False
        try:
            while True:
                if f is None:
                    f = _open(path)
                    if f is None and not follow:
                        return
                chunk = b""
                if f is not None:
                    limit = limit_of()
                    size = _CHUNK if limit is None else min(_CHUNK, limit - pos)
                    if size > 0:
                        f.seek(pos)
                        chunk = f.read(size)
                if chunk:
                    pos += len(chunk)
                    data = pending + chunk
                    cut = data.rfind(b"\n") + 1
                    pending = data[cut:]
                    if cut and (lines := self._filter(split_lines(data[:cut]))):
                        yield lines
                    delay = 0.002
                    continue
                if not follow or end is not None or finishing:
                    break
                if self._complete():
                    finishing = True  # one more read: bytes may have landed meanwhile
                    continue
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            if pending and (lines := self._filter([pending.decode("utf-8", "replace")])):
                yield lines
        finally:
            if f is not None:
                f.close()

    def _wake_collector(self) -> None:
        """Wakes the app's collector (once per ``_WAKE_EVERY``): this reader waits for it."""
        now = time.monotonic()
        if self._app is not None and now - self._woken >= _WAKE_EVERY:
            self._woken = now
            self._app.wake_collector()

    def _committed(self) -> int:
        """The end of the combined log as committed by the collector's index."""
        assert self._app is not None and self._replica is not None
        self._wake_collector()
        entries, self._index_off = read_index(self._app.index_file(self._replica), self._index_off)
        if entries:
            self._committed_end = entries[-1][3]
        return self._committed_end

    def _read_windowed(self) -> Iterator[list[str]]:
        """Lines whose arrival time (from the collector's index) is within [since, until]."""
        assert self._app is not None and self._replica is not None
        col = {Stream.STDOUT: 1, Stream.STDERR: 2, Stream.COMBINED: 3}[self._stream]
        index_path = self._app.index_file(self._replica)
        since = self._since if self._since is not None else float("-inf")
        until = self._until if self._until is not None else float("inf")
        offset, prev = 0, 0
        start: int | None = None  # start of the selected range not yet read
        delay, finishing = 0.002, False
        while True:
            self._wake_collector()
            entries, offset = read_index(index_path, offset)
            for t, *offs in entries:
                if t > until:
                    if start is not None and prev > start:
                        yield from self._read_range(self._log_file, start, prev, False, False)
                    return
                start = (prev if start is None else start) if t >= since else None
                prev = int(offs[col - 1])
            if start is not None and prev > start:
                yield from self._read_range(self._log_file, start, prev, False, False)
                start = prev
            if entries:
                delay = 0.002
                continue
            if finishing:
                break
            if self._collected():
                finishing = True
                continue
            if not self._should_tail:
                # still running: lines not indexed yet arrived just now
                if until == float("inf") and time.time() >= since:
                    yield from self._read_range(self._log_file, prev, None, False, False)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _open(path: str) -> Any:
    try:
        return open(path, "rb", buffering=0)  # noqa: SIM115 (closed by the reader)
    except FileNotFoundError:
        return None
