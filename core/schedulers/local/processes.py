"""Processes of local apps: which process a replica is (:class:`Identity`: pid and start time,
to the clock tick), whether it runs, and ending it and everything it started (:func:`terminate`).

A pid alone never names a replica: pids are reused. Every check compares the start time
``/proc/<pid>/stat`` gives with the one recorded at spawn, so a recycled pid is never reported
running nor signalled.

Standard library only: the log collector process imports this module too.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["MARKER_ENV", "Identity", "leftovers", "terminate", "wait_exits"]

#: every process of replica ``g`` of an app inherits ``SHIPYARD_REPLICA_KEY=<app_id>:<g>``: what
#: left the replica's process group is found by it
MARKER_ENV = "SHIPYARD_REPLICA_KEY"

#: seconds between SIGTERM and SIGKILL when terminating replicas
DEFAULT_GRACE = 5.0


def proc_stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """``(state, ppid, pgrp, session, start ticks)`` of ``pid`` from /proc; None if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        rest = data[data.rindex(b")") + 2 :].split()
        return rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19])
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Identity:
    """A process, exactly: its pid and its start time in clock ticks after boot."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        """The identity of the running process ``pid`` (None if it is gone)."""
        st = proc_stat(pid)
        return None if st is None else cls(pid, st[4])

    @classmethod
    def me(cls) -> Identity:
        ident = cls.of(os.getpid())
        return ident if ident is not None else cls(os.getpid(), 0)

    def __str__(self) -> str:
        return f"{self.pid}:{self.start_ticks}"

    @classmethod
    def parse(cls, text: str) -> Identity | None:
        pid, _, ticks = text.strip().partition(":")
        try:
            return cls(int(pid), int(ticks))
        except ValueError:
            return None

    def alive(self) -> bool:
        """True if this very process runs (a zombie does not; a reused pid is another)."""
        st = proc_stat(self.pid)
        return st is not None and st[0] not in ("Z", "X", "x") and st[4] == self.start_ticks

    def exists(self) -> bool:
        """True if this very process exists, zombie or not (its group may still have members)."""
        st = proc_stat(self.pid)
        return st is not None and st[4] == self.start_ticks

    def pidfd(self) -> int | None:
        """A pidfd of this very process (readable once it exits); None if it is gone."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return None
        if not self.exists():  # checked after opening: the fd is the right process
            os.close(fd)
            return None
        return fd

    def signal_group(self, sig: int) -> bool:
        """Signals the process group this process leads (it alone if it leads none)."""
        return self.exists() and _signal_group(self.pid, sig)

    def group_empty(self) -> bool:
        """True if no process (zombies included) is left in its process group."""
        try:
            os.killpg(self.pid, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False


def _signal_group(pid: int, sig: int) -> bool:
    """Signals the process group ``pid`` leads (``pid`` alone if it leads none)."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def reap_if_child(pidfd: int) -> int | None:
    """Reaps the exited process of ``pidfd`` if it is a child of this process. Returns the
    signal that killed it (0 if it exited), None if it still runs or is not our child."""
    try:
        res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)  # type: ignore[attr-defined]
    except (ChildProcessError, OSError, AttributeError):
        return None
    if res is None:
        return None
    return int(res.si_status) if res.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else 0


def exited_child(pidfd: int) -> bool:
    """True if the process of ``pidfd`` is an exited child of this process, not reaped yet
    (it is left to be reaped, e.g. by ``os.wait4`` for its rusage)."""
    flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
    try:
        res = os.waitid(os.P_PIDFD, pidfd, flags)  # type: ignore[attr-defined]
    except (ChildProcessError, OSError, AttributeError):
        return False
    return res is not None


def pidfds(procs: dict[int, Identity]) -> dict[int, int]:
    """pidfds of those of ``procs`` (by any key) that still exist: fd -> key."""
    fds: dict[int, int] = {}
    for key, ident in procs.items():
        fd = ident.pidfd()
        if fd is not None:
            fds[fd] = key
    return fds


def wait_exits(
    procs: dict[int, Identity], timeout: float, killed: dict[int, int] | None = None
) -> list[int]:
    """Waits up to ``timeout`` seconds for the processes (by any key) to exit; returns the keys
    of those still running. Children of this process that are reaped here and were killed by a
    signal are put in ``killed`` (key -> signal): they could not record their exit code."""
    return _wait_fds(pidfds(procs), timeout, killed)


def _wait_fds(fds: dict[int, int], timeout: float, killed: dict[int, int] | None) -> list[int]:
    """:func:`wait_exits` on pidfds (fd -> key); closes them."""
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        waiting = dict(fds)
        deadline = time.monotonic() + max(timeout, 0.0)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                key = waiting.pop(fd)
                by = reap_if_child(fd)
                if by and killed is not None:
                    killed[key] = by
        return sorted(waiting.values())
    finally:
        for fd in fds:
            os.close(fd)


def _last_pid() -> int:
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0


def leftovers(app_id: str, replicas: Iterable[int] | None = None, since_pid: int = 0) -> list[int]:
    """Live processes carrying the marker of the app (or of the given replicas of it): what a
    replica left behind, also outside its process group or session. They all started after
    their replica's wrapper: with ``since_pid`` only younger pids are read (unless pids
    wrapped around since)."""
    if since_pid and _last_pid() < since_pid:
        since_pid = 0
    prefix = f"{MARKER_ENV}={app_id}:".encode()
    wanted = None if replicas is None else {str(g).encode() for g in replicas}
    me = os.getpid()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == me or int(name) < since_pid:
            continue
        env = _environ(name)
        i = env.find(prefix)
        while i > 0 and env[i - 1] != 0:  # must start a variable
            i = env.find(prefix, i + 1)
        if i < 0:
            continue
        j = env.find(b"\0", i)
        g = env[i + len(prefix) : j if j >= 0 else len(env)]
        if wanted is None or g in wanted:
            found.append(int(name))
    return found


def _environ(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()  # (empty for zombies and kernel threads)
    except OSError:
        return b""


def end_leftovers(
    app_id: str, replicas: Sequence[int] | None, grace: float, since_pid: int = 0
) -> None:
    """Terminates what is left of the given replicas: SIGTERM, SIGKILL after ``grace``."""
    left = leftovers(app_id, replicas, since_pid)
    if not left:
        return
    _kill(left, signal.SIGTERM)
    deadline = time.monotonic() + max(grace, 0.0)
    delay = 0.001
    while left and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        left = [p for p in left if proc_stat(p) is not None and proc_stat(p)[0] != "Z"]  # type: ignore[index]
    left = sorted(set(left) | set(leftovers(app_id, replicas, since_pid)))  # and new ones
    _kill(left, signal.SIGKILL)


def _kill(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def terminate(
    app_id: str,
    procs: dict[int, Identity],
    grace: float = DEFAULT_GRACE,
    scan: bool = True,
) -> dict[int, int]:
    """Ends the replicas ``procs`` (index -> wrapper identity) and their process trees:
    SIGTERM to every process group at once, SIGKILL to the groups left after ``grace``
    seconds, then (``scan``) ends what the replicas left outside their groups.

    Returns the replicas whose wrapper was killed by a signal without being able to record an
    exit code (index -> signal), for the caller to record.
    """
    killed: dict[int, int] = {}
    fds = pidfds(procs)  # each process's identity checked once, here
    for g in fds.values():  # every group at once, then wait for all
        _signal_group(procs[g].pid, signal.SIGTERM)
    left = _wait_fds(fds, grace, killed)
    if left:
        for g in left:
            if procs[g].signal_group(signal.SIGKILL):
                killed.setdefault(g, signal.SIGKILL)
        wait_exits({g: procs[g] for g in left}, 1.0, killed)
    if not scan:
        # the groups empty as their zombie wrappers are reaped; members that linger call for
        # a look at every process
        deadline = time.monotonic() + 0.05
        while not all(i.group_empty() for i in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.001)
        scan = not all(i.group_empty() for i in procs.values())
    if scan:
        end_leftovers(app_id, list(procs), grace, min((i.pid for i in procs.values()), default=0))
    return killed
