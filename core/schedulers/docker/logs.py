"""Log lines of a replica, from the engine's log of its container (public ``APIClient.logs``),
or from the app's archive once retention has removed the container.

Following a replica reads the engine's frames with their timestamps: a line longer than the
engine's 16 KiB chunk arrives as several frames (all with the line's timestamp) and is put back
together here, whole, in order. When a follow stream ends (the container stopped or restarted)
the next read resumes after the last frame taken, so nothing is repeated or lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.schedulers.api import Stream, split_lines
from core.schedulers.docker.model import parse_docker_time
from core.transient import call_with_retries, is_transient

log = logging.getLogger(__name__)

# a frame's timestamp prefix: RFC3339Nano with fixed width, in UTC, then a space
TS_LEN = len("2006-01-02T15:04:05.000000000Z ")


def timestamp(value: datetime | None, where: str) -> float | None:
    """A positive UNIX timestamp for the engine's logs API (naive datetimes are local time)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f"{where}: expected a datetime, got {value!r}")
    ts = value.timestamp()
    # the API treats 0 as "unset": anything at or before the epoch means "from the start".
    return ts if ts > 0 else 1e-9


def stamp(seconds: float) -> bytes:
    """``seconds`` in the engine's fixed-width timestamp form (compares as bytes)."""
    whole = int(seconds)
    dt = datetime.fromtimestamp(whole, UTC)
    nanos = round((seconds - whole) * 1e9)
    return f"{dt:%Y-%m-%dT%H:%M:%S}.{nanos:09d}Z".encode()


def read_all(
    api: Any, name: str, stream: Stream, since: float | None, until: float | None
) -> list[str]:
    """Every line the container logged (between ``since`` and ``until``): one engine call."""
    data = api.logs(
        name,
        stdout=stream != Stream.STDERR,
        stderr=stream != Stream.STDOUT,
        stream=False,
        since=since,
        until=until,
    )
    return split_lines(data.decode("utf-8", errors="replace"))


@dataclass
class _Cursor:
    """Where a follower is: the timestamp of the last frame taken, and how many frames with that
    very timestamp were taken (the chunks of a long line share the line's timestamp)."""

    ts: bytes = b""
    taken_at_ts: int = 0

    def new_frames(self, frames: Iterable[bytes]) -> Iterator[bytes]:
        """The payloads of the frames not taken yet, of a read that starts at or before ``ts``."""
        same = 0
        for frame in frames:
            ts = frame[: TS_LEN - 1]
            if ts < self.ts:
                continue
            if ts == self.ts:
                same += 1
                if same <= self.taken_at_ts:
                    continue
                self.taken_at_ts += 1
            else:
                self.ts, self.taken_at_ts, same = ts, 1, 1
            yield frame[TS_LEN:]

    def since(self, floor: float | None) -> float | None:
        resume = parse_docker_time(self.ts.decode("ascii", "replace")) if self.ts else None
        if resume is None:
            return floor
        return max(resume - 1e-6, floor or 1e-9)


def follow(
    api: Any, name: str, stream: Stream, since: float | None, until: float | None
) -> Iterator[str]:
    """Lines of a container as it writes them, through its restarts, until it has ended for
    good (or ``until`` is reached). A partial line at the end of a run is given as it is."""
    from docker.errors import NotFound

    cursor = _Cursor()
    started = api.inspect_container(name)["State"].get("StartedAt", "")
    live = True
    while True:
        try:
            yield from _lines(_frames(api, name, stream, live, cursor.since(since), until), cursor)
        except NotFound:
            return
        except Exception as e:  # noqa: BLE001 - told apart below
            if not _cut_short(e):
                raise
            # the engine went away mid-stream (restarted): resume after the last frame taken
            log.info("the log stream of %s was cut (%s); resuming", name, e)
        if not live or (until is not None and until <= time.time()):
            return
        # The stream ends when the container stops. Docker may start it again (restart policy):
        # then follow the next run; else read once more and stop.
        state = _next_run(api, name, started)
        if state is None:
            return
        started, live = state


def _cut_short(e: Exception) -> bool:
    """Whether a follow stream failed because the engine went away (not a verdict on it)."""
    from requests.exceptions import ChunkedEncodingError
    from urllib3.exceptions import ProtocolError

    return is_transient(e) or isinstance(e, ChunkedEncodingError | ProtocolError)


def _next_run(api: Any, name: str, started: str) -> tuple[str, bool] | None:
    """After a follow stream ended: (the run's start, whether to follow it) or None if gone."""
    from docker.errors import NotFound

    delay = 0.02
    while True:
        try:  # (through an engine restart: retried within the retry budget)
            state = call_with_retries(
                lambda: api.inspect_container(name)["State"], f"docker: the state of {name}"
            )
        except NotFound:
            return None
        now_started = state.get("StartedAt", "")
        if now_started != started:
            return now_started, True  # a new run
        if state.get("Running") and not state.get("Restarting"):
            return started, True  # the same run: the stream was cut short
        if not state.get("Restarting"):
            return started, False  # ended for good: one last plain read
        time.sleep(delay)  # restarting: the engine's back-off, polled
        delay = min(delay * 2, 0.5)


def _frames(
    api: Any, name: str, stream: Stream, live: bool, since: float | None, until: float | None
) -> Iterator[bytes]:
    res = api.logs(
        name,
        stdout=stream != Stream.STDERR,
        stderr=stream != Stream.STDOUT,
        stream=True,
        follow=live,
        timestamps=True,
        since=since,
        until=until,
    )
    try:
        yield from res
    finally:
        res.close()


def _lines(frames: Iterable[bytes], cursor: _Cursor) -> Iterator[str]:
    """Whole lines from frame payloads (a line may span several frames); the rest at the end."""
    pending = b""
    for payload in cursor.new_frames(frames):
        pending += payload
        if b"\n" in payload:
            head, sep, pending = pending.rpartition(b"\n")
            yield from split_lines((head + sep).decode("utf-8", errors="replace"))
    if pending:
        yield pending.decode("utf-8", errors="replace")


def stamped_lines(api: Any, name: str, stream: Stream) -> Iterator[bytes]:
    """Each whole line of one stream of a container, prefixed with its timestamp and a space
    (the archive's form)."""
    ts, pending = b"", b""
    for frame in _frames(api, name, stream, False, None, None):
        if not pending:
            ts = frame[: TS_LEN - 1]
        pending += frame[TS_LEN:]
        if pending.endswith(b"\n"):
            yield ts + b" " + pending
            pending = b""
    if pending:
        yield ts + b" " + pending
