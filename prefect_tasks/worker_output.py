"""The Shipyard worker's forwarding of a job's output to its log: each line once, across
restarts of the worker (:class:`JobOutput`), through a small checkpoint file per flow run
(:class:`OutputCheckpoints`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

import anyio.to_thread

from core.follow import DRAIN_TIMEOUT, END, LogCursor, LogFollower, lines_after
from core.runner import LogLine, Runner
from core.schedulers.local.appdir import state_root
from core.specs import AppHandle

__all__ = ["CHECKPOINT_DIR", "JobOutput", "OutputCheckpoints"]

log = logging.getLogger(__name__)

#: where workers keep their runs' output checkpoints, under Shipyard's state directory
CHECKPOINT_DIR = "prefect-worker"


def _make_private_dirs(path: Path) -> None:
    """Creates ``path`` and its missing parents, each with mode 0700."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


class OutputCheckpoints:
    """How much of each flow run's job output a worker forwarded: one small file per run.

    ``<directory>/<flow run id>.json`` (mode 0600, in a 0700 directory) holds the job's app handle
    and its :class:`~core.follow.LogCursor` (``{"app_handle": ..., "cursor": {"flow-run/0": n}}``).
    It is replaced atomically after each batch of forwarded lines and removed once the job ended
    and its last lines were forwarded. A worker's directory is
    ``<Shipyard state dir>/prefect-worker/<worker name>`` (:meth:`for_worker`): the state
    directory is ``$SHIPYARD_STATE_DIR``, else ``$XDG_STATE_HOME/shipyard``, else
    ``~/.local/state/shipyard``, so a worker restarted under its name on the same host finds it.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @classmethod
    def for_worker(cls, worker_name: str) -> OutputCheckpoints:
        """The checkpoints of the worker named ``worker_name``."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", worker_name).strip("-.") or "worker"
        return cls(Path(state_root()) / CHECKPOINT_DIR / safe)

    def path(self, flow_run_id: uuid.UUID) -> Path:
        """The file of one flow run."""
        return self.directory / f"{flow_run_id}.json"

    def load(self, flow_run_id: uuid.UUID, handle: AppHandle) -> LogCursor:
        """The cursor saved for the run's job ``handle``; empty if there is none, or if it was
        saved for another job of the run (an earlier attempt)."""
        path = self.path(flow_run_id)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("app_handle") != handle:
                return LogCursor()
            return LogCursor(data.get("cursor") or {})
        except FileNotFoundError:
            return LogCursor()
        except (OSError, ValueError) as e:
            log.warning("ignoring the output checkpoint %s: %s", path, e)
            return LogCursor()

    def save(self, flow_run_id: uuid.UUID, handle: AppHandle, cursor: LogCursor) -> None:
        """Replaces the run's checkpoint (a reader sees the old one or the new one, whole).

        Raises:
            OSError: it cannot be written.
        """
        _make_private_dirs(self.directory)
        path = self.path(flow_run_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        data = json.dumps({"app_handle": handle, "cursor": cursor.to_dict()})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)

    def remove(self, flow_run_id: uuid.UUID) -> None:
        """Removes the run's checkpoint (if any)."""
        self.path(flow_run_id).unlink(missing_ok=True)

    def prune(self, keep: Collection[uuid.UUID]) -> list[str]:
        """Removes the checkpoints of runs not in ``keep`` (runs that ended while no worker
        followed them) and leftover temporary files; returns the names removed."""
        wanted = {f"{run_id}.json" for run_id in keep}
        try:
            names = sorted(p.name for p in self.directory.iterdir())
        except FileNotFoundError:
            return []
        removed = [n for n in names if n not in wanted]
        for name in removed:
            (self.directory / name).unlink(missing_ok=True)
        return removed


class JobOutput:
    """Forwards one job's output to the worker's log (``run-name | role/k line``), each line once,
    across restarts of the worker.

    A :class:`~core.follow.LogFollower` (started by :meth:`start` once the job runs: a queued job
    has no output yet, and following one costs status calls) hands the lines to the event loop,
    which logs the ones the cursor accepts and checkpoints the cursor after each batch. The lines
    of a batch are logged before the checkpoint is written: a worker killed in between logs that
    batch again, never loses it. :meth:`finish`, once the job ended, adds whatever the follower
    did not deliver (from the complete logs) and removes the checkpoint.
    """

    def __init__(
        self,
        handle: AppHandle,
        flow_run_id: uuid.UUID,
        prefix: str,
        runner: Runner,
        logger: logging.Logger,
        checkpoints: OutputCheckpoints,
    ) -> None:
        self.handle = handle
        self.flow_run_id = flow_run_id
        self._prefix = prefix
        self._runner = runner
        self._log = logger
        self._checkpoints = checkpoints
        self.cursor = checkpoints.load(flow_run_id, handle)
        self._saved = self.cursor.merged(None)
        self._loop = asyncio.get_running_loop()
        self._follower: LogFollower | None = None
        self._ended = asyncio.Event()
        self._flush_scheduled = False
        self._broken = False
        self._closed = False
        self._finishing: asyncio.Future[None] | None = None

    @property
    def started(self) -> bool:
        """Whether the follower was started."""
        return self._follower is not None

    def start(self) -> None:
        """Starts following the job's output after the cursor (once)."""
        if self._follower is not None or self._closed:
            return
        if self.cursor.total:
            self._log.info(
                "%s | resuming the output of %s after %d lines",
                self._prefix,
                self.handle,
                self.cursor.total,
            )
        self._follower = LogFollower(
            self.handle,
            self._hand_over,
            self.cursor.merged(None),
            lambda: self._runner,
            close_runner=False,
        ).start()

    def _hand_over(self, item: Any) -> None:  # in the follower's thread
        try:
            self._loop.call_soon_threadsafe(self._deliver, item)
        except RuntimeError:  # the event loop is closed: the worker is gone
            if self._follower is not None:
                self._follower.stop()

    def _deliver(self, item: Any) -> None:
        if self._closed:
            return
        if item is END:
            self._ended.set()
            return
        self._emit(*item)
        if not self._flush_scheduled:  # after the other lines already handed over
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _emit(self, index: int, line: LogLine) -> None:
        if self.cursor.accept(index, line):
            self._log.info("%s | %s", self._prefix, line)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.checkpoint()

    def checkpoint(self) -> None:
        """Saves the cursor, unless it is what was saved last. A failure to save is logged once,
        and the output goes on without checkpoints."""
        if self._closed or self._broken or self.cursor == self._saved:
            return
        try:
            self._checkpoints.save(self.flow_run_id, self.handle, self.cursor)
        except OSError as e:
            self._broken = True
            self._log.warning("cannot checkpoint the output of %s: %s", self.handle, e)
            return
        self._saved = self.cursor.merged(None)

    async def finish(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """The job ended: forwards its last lines (the follower's, for up to ``timeout`` seconds,
        then the rest from the complete logs) and removes the checkpoint."""
        if self._finishing is None:
            self._finishing = asyncio.ensure_future(self._finish(timeout))
        await asyncio.shield(self._finishing)

    async def _finish(self, timeout: float) -> None:
        if self._follower is not None:
            try:
                await asyncio.wait_for(self._ended.wait(), timeout)
            except TimeoutError:
                self._log.warning("output of %s still streaming after %ss", self.handle, timeout)
            self._follower.stop()
        try:
            missed = await anyio.to_thread.run_sync(
                lines_after, self._runner, self.handle, self.cursor.merged(None)
            )
        except Exception as e:
            self._log.warning("cannot read the output of %s: %s", self.handle, e)
            missed = []
        for index, line in missed:
            self._emit(index, line)
        self._closed = True
        try:
            self._checkpoints.remove(self.flow_run_id)
        except OSError as e:
            self._log.warning("cannot remove the output checkpoint of %s: %s", self.handle, e)

    def stop(self) -> None:
        """The worker stops: saves the cursor and stops following (the checkpoint stays, for
        the next worker)."""
        self.checkpoint()
        self._closed = True
        if self._follower is not None:
            self._follower.stop()
