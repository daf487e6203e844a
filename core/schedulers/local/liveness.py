"""Which replicas of an app still run, for a process that asks again and again (the submitter
following its app, a waiter): each replica's pidfd is opened once (and checked to be the
recorded process), and all of them are polled in one call; a first look reads /proc as before.

Bench rows: "describe 8 replicas, the submitting process" (eight /proc reads per look cost more
than the whole rest of a describe), and "local status_many, running apps" (a watcher of 1,000
apps: with 64 apps' pidfds kept, the other looks read /proc and the curve's slope was 1.1).

Standard library only.
"""

from __future__ import annotations

import os
import select
import threading
from collections import OrderedDict
from collections.abc import Callable

from core.schedulers.local.records import AppRecord
from core.schedulers.local.supervise import identities

__all__ = ["Liveness"]

#: at most this many pidfds are kept open, and at most a quarter of the process's open-file
#: limit (256 under the usual 1,024): a watcher of more replicas than that reads /proc for some
MAX_FDS = 4096


def fd_budget() -> int:
    """How many pidfds a :class:`Liveness` keeps by default (see :data:`MAX_FDS`)."""
    import resource  # (lazily: start-up)

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_FDS
    return max(8, min(soft // 4, MAX_FDS))


class _AppFds:
    """The pidfds of one app's replica wrappers, polled together."""

    def __init__(self, record: AppRecord) -> None:
        self.lock = threading.Lock()
        self.poller = select.poll()
        self.idents = identities(record)
        self.closed = False
        self.fds: dict[int, int | None] = {}
        for g, ident in self.idents.items():
            fd = ident.pidfd()  # (None: gone already)
            self.fds[g] = fd
            if fd is not None:
                self.poller.register(fd, select.POLLIN)
        self.weight = max(1, len(self.fds))  # (what it counts against the budget)

    def alive(self, indices: list[int]) -> list[bool]:
        """Whether each of ``indices`` still runs (a pidfd is readable once its process ended)."""
        with self.lock:
            if self.closed:  # (closed by another thread since it was handed out: /proc)
                return [self.idents[g].alive() for g in indices]
            ended = {fd for fd, _ in self.poller.poll(0)}
            return [(fd := self.fds[g]) is not None and fd not in ended for g in indices]

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for fd in self.fds.values():
                if fd is not None:
                    os.close(fd)
            self.fds = {}


class Liveness:
    """The pidfds of the apps this process looks at more than once (at most ``max_fds``, default
    :func:`fd_budget`; the least recently looked at app's closed first)."""

    def __init__(self, max_fds: int | None = None) -> None:
        self._lock = threading.Lock()
        self._apps: OrderedDict[str, _AppFds | None] = OrderedDict()  # None: looked at once
        self._max = max_fds
        self._kept = 0  # pidfds, and one for each app looked at once

    def checker(self, app_id: str, record: AppRecord) -> Callable[[list[int]], list[bool]] | None:
        """What tells which replicas of ``app_id`` run, for ``supervise.observe`` (None on a
        first look: its default reads /proc, cheaper than opening pidfds for one look)."""
        with self._lock:
            if app_id not in self._apps:
                self._remember(app_id, None)
                return None
            fds = self._apps[app_id]
            self._apps.move_to_end(app_id)
        if fds is None:
            fds = _AppFds(record)
            with self._lock:
                kept = self._apps.get(app_id)
                if kept is None:
                    self._remember(app_id, fds)
                else:  # (another thread opened them first)
                    fds.close()
                    fds = kept
        return fds.alive

    def _remember(self, app_id: str, fds: _AppFds | None) -> None:
        if self._max is None:
            self._max = fd_budget()
        if app_id in self._apps:
            self._kept -= _weight(self._apps[app_id])
        self._apps[app_id] = fds
        self._apps.move_to_end(app_id)
        self._kept += _weight(fds)
        while self._kept > self._max and len(self._apps) > 1:
            _, old = self._apps.popitem(last=False)
            self._kept -= _weight(old)
            if old is not None:
                old.close()

    def forget(self, app_id: str) -> None:
        """Closes the pidfds of an app that ended."""
        with self._lock:
            if app_id not in self._apps:
                return
            fds = self._apps.pop(app_id)
            self._kept -= _weight(fds)
        if fds is not None:
            fds.close()

    def close(self) -> None:
        """Closes every pidfd."""
        with self._lock:
            apps, self._apps = list(self._apps.values()), OrderedDict()
            self._kept = 0
        for fds in apps:
            if fds is not None:
                fds.close()


def _weight(fds: _AppFds | None) -> int:
    return 1 if fds is None else fds.weight
