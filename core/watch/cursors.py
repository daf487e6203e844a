"""Where a watch keeps how far it delivered an app's log lines: a :class:`CursorStore`.

A watch that follows logs loads its :class:`~core.watch.follow.LogCursor` from its store when it
starts, saves it after each batch of lines it delivered (the lines first, then the cursor: a
watcher killed in between delivers that batch again, never loses it) and clears it once the app
ended and every line was delivered. So a watch that restarts elsewhere (a restarted triggerer or
Prefect worker, a resumed Airflow task) delivers each line once.

* :class:`MemoryCursorStore`: in this process only (the default);
* :class:`FileCursorStore`: a small JSON file (mode 0600), e.g. the Prefect worker's per flow run;
* Airflow's trigger keeps its cursor in the task instance's XCom
  (``airflow_provider.triggers``), with the async methods.
"""

from __future__ import annotations

import json
import logging
import os

from core.specs import AppHandle
from core.watch.follow import LogCursor

log = logging.getLogger(__name__)

__all__ = ["CursorStore", "FileCursorStore", "MemoryCursorStore", "make_private_dirs"]


class CursorStore:
    """Keeps one app's log cursor. Subclasses give the sync methods; the async ones run them
    in a thread unless a subclass has a native async way (e.g. Airflow's ``BaseXCom.aset``).

    ``load`` of a store that holds nothing, or holds the cursor of another app, is empty. A
    ``save`` that fails raises ``OSError``; the watch then goes on without saving."""

    def load(self) -> LogCursor:
        """The cursor saved last (empty if none)."""
        raise NotImplementedError

    def save(self, cursor: LogCursor) -> None:
        """Keeps ``cursor`` in place of the one saved before."""
        raise NotImplementedError

    def clear(self) -> None:
        """Forgets the cursor (the app ended and every line was delivered)."""
        raise NotImplementedError

    async def aload(self) -> LogCursor:
        """:meth:`load` for async code."""
        import asyncio

        return await asyncio.to_thread(self.load)

    async def asave(self, cursor: LogCursor) -> None:
        """:meth:`save` for async code."""
        import asyncio

        await asyncio.to_thread(self.save, cursor)

    async def aclear(self) -> None:
        """:meth:`clear` for async code."""
        import asyncio

        await asyncio.to_thread(self.clear)


class MemoryCursorStore(CursorStore):
    """A cursor kept in memory, starting at ``start``."""

    def __init__(self, start: LogCursor | None = None) -> None:
        self.cursor = (start or LogCursor()).copy()

    def load(self) -> LogCursor:
        return self.cursor.copy()

    def save(self, cursor: LogCursor) -> None:
        self.cursor = cursor.copy()

    def clear(self) -> None:
        self.cursor = LogCursor()

    async def aload(self) -> LogCursor:
        return self.load()

    async def asave(self, cursor: LogCursor) -> None:
        self.save(cursor)

    async def aclear(self) -> None:
        self.clear()


def make_private_dirs(path: str | os.PathLike[str]) -> None:
    """Creates ``path`` and its missing parents, each with mode 0700."""
    missing: list[str] = []
    d = os.fspath(path)
    while d and not os.path.exists(d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


class FileCursorStore(CursorStore):
    """The cursor of app ``handle`` in the file ``path``: ``{"app_handle": ..., "cursor":
    {"role/k": n}}``, mode 0600, its missing directories made with mode 0700, replaced
    atomically (a reader sees the old one or the new one, whole)."""

    def __init__(self, path: str | os.PathLike[str], handle: AppHandle) -> None:
        self.path = os.fspath(path)
        self.handle = handle

    def load(self) -> LogCursor:
        try:
            with open(self.path) as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("app_handle") != self.handle:
                return LogCursor()
            return LogCursor(data.get("cursor") or {})
        except FileNotFoundError:
            return LogCursor()
        except (OSError, ValueError) as e:
            log.warning("ignoring the log cursor %s: %s", self.path, e)
            return LogCursor()

    def save(self, cursor: LogCursor) -> None:
        parent, name = os.path.split(self.path)
        make_private_dirs(parent)
        tmp = os.path.join(parent, f".{name}.{os.getpid()}.tmp")
        data = json.dumps({"app_handle": self.handle, "cursor": cursor.to_dict()})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, self.path)

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
