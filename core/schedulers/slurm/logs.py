"""Reading a replica's log file from the cluster's :class:`Files`, once or following it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from core.schedulers.slurm.transport import Files, Reader, TransportError

log = logging.getLogger(__name__)

__all__ = ["read_lines"]

#: bytes asked for per read: a 200k-line log (16 MB) is read in two calls, and only once; 8 MiB
#: (not 1) keeps the remote bench rows' log_iter within 1.3x of `cat` over ssh
CHUNK = 8 << 20


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
    partial line waits for its end (or for the end of the job). A reader that fails (a dropped
    connection) is opened again where it stopped."""
    pending = b""
    for data in _chunks(files, path, ended):
        pending += data
        cut = pending.rfind(b"\n") + 1
        if cut:
            yield from _split(pending[:cut])
            pending = pending[cut:]
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _chunks(files: Files, path: str, ended: Callable[[], bool] | None) -> Iterator[bytes]:
    """The bytes of ``path`` as they come (following it while ``ended`` says the job runs)."""
    reader: Reader | None = None
    offset = 0
    delay = 0.01
    next_check = 0.0
    finishing = False
    try:
        while True:
            if reader is None:
                reader = files.open_reader(path, offset)
                if reader is None and ended is None:
                    return
            data = b""
            if reader is not None:
                try:
                    data = reader.read(CHUNK)
                except TransportError as e:
                    log.debug("reading %s again from %d: %s", path, offset, e)
                    reader.close()
                    reader = None
                    continue
            if data:
                offset += len(data)
                delay = 0.01
                yield data
                continue
            if ended is None or finishing:
                return
            now = time.monotonic()
            if now >= next_check:
                if ended():
                    finishing = True  # one more read: what was written before the job ended
                    continue
                next_check = now + 1.0
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    finally:
        if reader is not None:
            reader.close()
