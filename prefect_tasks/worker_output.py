"""Where the Shipyard worker keeps how far it forwarded each flow run's job output: one small
cursor file per flow run (:class:`OutputCheckpoints`), so a worker restarted under its name
forwards each line once."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Collection
from pathlib import Path

from core.paths import state_root
from core.specs import AppHandle
from core.watch import FileCursorStore

__all__ = ["CHECKPOINT_DIR", "OutputCheckpoints"]

#: where workers keep their runs' output checkpoints, under Shipyard's state directory
CHECKPOINT_DIR = "prefect-worker"


class OutputCheckpoints:
    """How much of each flow run's job output a worker forwarded: one file per run.

    ``<directory>/<flow run id>.json`` is the run's :class:`~core.watch.FileCursorStore`
    (``{"app_handle": ..., "cursor": {"flow-run/0": n}}``, mode 0600, in a 0700 directory): the
    job's watch saves it after each batch of forwarded lines and removes it once the job ended
    and its last lines were forwarded. A worker's directory is
    ``<Shipyard state dir>/prefect-worker/<worker name>`` (:meth:`for_worker`; the state
    directory: :func:`core.paths.state_root`), so a worker restarted under its name on the same
    host finds it.
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

    def store(self, flow_run_id: uuid.UUID, handle: AppHandle) -> FileCursorStore:
        """The cursor store of the run's job ``handle`` (a cursor saved for another job of the
        run, an earlier attempt, reads as empty)."""
        return FileCursorStore(self.path(flow_run_id), handle)

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
