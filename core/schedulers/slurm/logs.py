"""Reading a replica's log file from the cluster's :class:`Files`, once or following it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from core.schedulers.slurm.transport import Files

__all__ = ["read_lines"]

#: bytes asked for per read: a 200k-line log is read in a few calls, and only once
CHUNK = 1 << 20


def _split(data: bytes) -> list[str]:
    """Whole lines of ``data`` (which ends in ``\\n``), each keeping its ``\\n``; only ``\\n``
    ends a line (``\\r`` stays inside its line)."""
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines(True)
    if len(lines) == text.count("\n"):
        return lines
    parts = text.split("\n")
    parts.pop()
    return [p + "\n" for p in parts]


def read_lines(files: Files, path: str, ended: Callable[[], bool] | None = None) -> Iterator[str]:
    """Yields the lines of ``path``; with ``ended`` (a callable), follows the file until
    ``ended()`` is true and nothing more arrives. Lines are whole whatever their length: a
    partial line waits for its end (or for the end of the job)."""
    offset = 0
    pending = b""
    delay = 0.01
    next_check = 0.0
    finishing = False
    while True:
        data = files.read_from(path, offset, CHUNK)
        if data:
            offset += len(data)
            pending += data
            cut = pending.rfind(b"\n") + 1
            if cut:
                yield from _split(pending[:cut])
                pending = pending[cut:]
            delay = 0.01
            continue
        if data is None and ended is None:
            return
        if ended is None or finishing:
            break
        now = time.monotonic()
        if now >= next_check:
            if ended():
                finishing = True  # one more read: what was written before the job ended
                continue
            next_check = now + 1.0
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    if pending:
        yield pending.decode("utf-8", errors="replace")
