"""The local scheduler's one background thread per process (:data:`BACKGROUND`):

* it reaps the replica wrappers (and collectors) this process started as soon as they exit; a
  wrapper killed by a signal could not record its exit code, so it records it;
* it starts each app's log collector process :data:`COLLECTOR_DELAY` seconds after submit, or,
  for an app that already ended by then, collects its logs right here (short apps never pay
  for an interpreter start);
* it keeps the schedulers' finished apps bounded, when idle.

Submitting only appends to a queue; the thread ticks for a while after any activity and is
woken through a pipe when it sleeps without a deadline. A forked child starts its own thread
on first use (the parent's does not exist there).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.schedulers.local.appdir import AppDir
from core.schedulers.local.collector import LogDirFullError, collect
from core.schedulers.local.outcome import OomCounter, peak_rss_kib, record_reaped
from core.schedulers.local.processes import exited_child
from core.schedulers.local.supervise import observe

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger(__name__)

__all__ = ["BACKGROUND", "COLLECTOR_DELAY", "start_collector"]

#: seconds after submit before a log collector process is started
COLLECTOR_DELAY = 0.025
_COLLECTOR_NICE = 5  # the collector yields to the replicas
_TICK = 0.025  # seconds between looks while busy
_WARM = 2.0  # seconds it keeps ticking after its last activity
# the package root: the collector process imports this package from there (standard library
# only, no site-packages: it starts in ~20 ms)
_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
_BOOT = (  # (it may be started from the background thread: signals unblocked first)
    "import signal; signal.pthread_sigmask(signal.SIG_SETMASK, ());"
    f" import sys; sys.path.insert(0, {_ROOT!r});"
    " from core.schedulers.local.collector import main; sys.exit(main(sys.argv[1:]))"
)


_OOM: list[OomCounter] = []  # the reaper's view of the kernel's OOM kills (made on first use)


def _oom_counter() -> OomCounter:
    if not _OOM:
        _OOM.append(OomCounter())
    return _OOM[0]


@dataclass
class _Child:
    """A child process to reap: a replica's wrapper (``app``, ``index``) or a collector."""

    pid: int
    app: AppDir | None = None
    index: int = -1
    popen: subprocess.Popen[bytes] | None = None
    inherited: int = 0  # the spawning process's peak RSS (KiB) when it spawned the wrapper

    def reaped(self, pidfd: int = -1) -> bool:
        """Reaps it if it exited (False if it runs); records a killed wrapper's exit code and
        what a wrapper's replica used (its ``wait4`` rusage)."""
        if self.popen is not None:
            return self.popen.poll() is not None
        if pidfd >= 0 and not exited_child(pidfd):
            return True  # (readable: it exited; not our child any more)
        try:
            done, status, rusage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True  # reaped by someone else
        if done == 0:
            return False
        by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        if by and self.app is not None:
            self.app.record_exit(self.index, -by)
        if self.app is not None:
            try:
                record_reaped(self.app, self.index, rusage, by, _oom_counter(), self.inherited)
            except OSError as e:
                log.debug("could not record the usage of %s/%d: %s", self.app.path, self.index, e)
        return True


def _start_deaf_to_stop_signals(thread: threading.Thread) -> None:
    """Starts ``thread`` with SIGINT and SIGTERM blocked, so the kernel hands them to the main
    thread: one taken by this thread would leave Python's handler (which runs in the main
    thread) waiting until the main thread's blocking call, e.g. a long ``time.sleep``, ends."""
    stop = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start_collector(app_dir: str, grace: float) -> subprocess.Popen[bytes] | None:
    """Starts the log collector process of one app (it exits at once if another one runs)."""
    app = AppDir(*os.path.split(app_dir))
    try:
        err = os.open(
            app.file(AppDir.COLLECTOR_LOG),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )
    except FileNotFoundError:
        return None  # the app is gone
    import subprocess  # (only here: a start-up cost for every import of the scheduler)

    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-I", "-c", _BOOT, app_dir, repr(float(grace))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(err)
    try:
        os.setpriority(os.PRIO_PROCESS, proc.pid, _COLLECTOR_NICE)
    except OSError:
        pass
    return proc


class Background:
    """The background thread of one process (see the module docs)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # flush() may run in a signal handler
        self._idle = threading.Condition(self._lock)
        self._pid = -1
        self._reset()

    def _reset(self) -> None:
        self._q: collections.deque[tuple[str, Any]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._rfd = self._wfd = -1
        self._asleep = False
        self._pending = 0  # collector launches not done yet
        self._flushing = False
        self._housekeepers: set[weakref.WeakMethod[Callable[[], bool]]] = set()
        self._wrappers: dict[int, _Child] = {}  # by pid: this process's wrappers, not reaped yet
        #: by app directory: what to call as each of its wrappers is reaped (see on_exit)
        self._listeners: dict[str, list[Callable[[], None]]] = {}
        self.collectors: dict[str, subprocess.Popen[bytes]] = {}

    # -- called by submitting threads -------------------------------------------------------

    def _claim(self) -> None:
        """(Under the lock) the first use in this process, or in a forked child: starts afresh
        before anything is counted (a launch counted before the reset left ``_pending`` at -1
        once done, and the exit flush waited its whole timeout)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._reset()
            atexit.register(self.flush)

    def _put(self, item: tuple[str, Any], *before: tuple[str, Any]) -> None:
        """Queues ``before`` then ``item`` for the thread (starting it if needed)."""
        with self._lock:
            self._claim()
            self._q.extend(before)  # (after a reset: a first use must not drop them)
            self._q.append(item)
            if self._thread is None:
                self._rfd, self._wfd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                self._thread = threading.Thread(
                    target=self._run, name="shipyard-local", daemon=True
                )
                _start_deaf_to_stop_signals(self._thread)
                return
        # always: a wrapper's pidfd is watched at once, not at the next tick (a describe that
        # sees its app end waits for its reaping)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"x")
        except OSError:
            pass

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread if self._pid == os.getpid() else None

    def watch(self, child: _Child) -> None:
        """Reaps ``child`` when it exits."""
        self._put(("watch", child))

    def on_exit(self, app_path: str, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Calls ``callback()`` (in the background thread: keep it short) each time one of
        the app's wrappers that this process spawned is reaped, its exit code and usage on
        record; None when this process has none of them left to reap. Returns the function
        that stops it."""
        with self._lock:
            if self._pid != os.getpid() or not self._has_wrappers(app_path):
                return None
            self._listeners.setdefault(app_path, []).append(callback)

        def stop() -> None:
            with self._lock:
                callbacks = self._listeners.get(app_path, [])
                if callback in callbacks:
                    callbacks.remove(callback)
                if not callbacks:
                    self._listeners.pop(app_path, None)

        return stop

    def wait_reaped(self, app_path: str, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds until this process has reaped every wrapper of the
        app that it spawned (an ended app's wrappers exit right after recording their exit
        codes; their usage is recorded as they are reaped). True if it waited for any."""
        if threading.current_thread() is self.thread:
            return False  # (the reaper itself: it would wait for itself)
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._pid != os.getpid():
                return False
            waited = False
            while self._has_wrappers(app_path):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                waited = True
                self._idle.wait(left)
            return waited

    def _has_wrappers(self, app_path: str) -> bool:
        """(Under the lock) True while this process has a wrapper of the app not reaped yet."""
        return any(c.app is not None and c.app.path == app_path for c in self._wrappers.values())

    def submitted(
        self, app: AppDir, pids: list[int], grace: float, housekeeping: Callable[[], bool] | None
    ) -> None:
        """Reaps a just submitted app's wrappers (replica ``g`` is ``pids[g]``) and sees to its
        log collection. ``housekeeping()`` bounds the submitting scheduler's finished apps (True
        while some must wait)."""
        with self._lock:
            self._claim()
            self._pending += 1
            if housekeeping is not None:  # (weakly: a scheduler is not kept alive for it)
                self._housekeepers.add(weakref.WeakMethod(housekeeping))  # type: ignore[arg-type]
        inherited = peak_rss_kib()
        children = [_Child(pid, app, g, inherited=inherited) for g, pid in enumerate(pids)]
        with self._lock:
            self._wrappers.update((c.pid, c) for c in children)
        watches = [("watch", c) for c in children]
        self._put(("launch", (time.monotonic() + COLLECTOR_DELAY, app, grace)), *watches)

    def flush(self, timeout: float = 10.0) -> None:
        """Starts every queued log collection now and waits for that, and for the reaping of
        every wrapper whose replica's exit code is on record (called at exit: a submitter that
        waited for its app would otherwise often exit between its replicas' last exit code and
        their reaping, and their usage, recorded as they are reaped, would be lost)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._pid != os.getpid() or not (self._pending or self._ending()):
                return
            self._flushing = True
            self._wake()
            try:
                while (self._pending or self._ending()) and time.monotonic() < deadline:
                    self._idle.wait(0.05)
            finally:
                self._flushing = False

    def _ending(self) -> bool:
        """(Under the lock) True while a wrapper whose replica's exit code is on record (it
        exits right after writing it) is not reaped yet."""
        exits: dict[str, Collection[int]] = {}
        for child in self._wrappers.values():
            assert child.app is not None
            path = child.app.path
            if path not in exits:
                exits[path] = child.app.exits().keys()
            if child.index in exits[path]:
                return True
        return False

    def _reaped(self, child: _Child, pidfd: int = -1) -> bool:
        """(The thread) :meth:`_Child.reaped`, and a reaped wrapper let go of."""
        if not child.reaped(pidfd):
            return False
        if child.app is not None:
            with self._lock:
                self._wrappers.pop(child.pid, None)
                self._idle.notify_all()
                listeners = list(self._listeners.get(child.app.path, ()))
            for listener in listeners:
                try:
                    listener()
                except Exception:
                    log.warning("a listener of %s failed", child.app.path, exc_info=True)
        return True

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            log.error("the local scheduler's background thread failed", exc_info=True)
        finally:
            with self._lock:  # the next hand-over starts another one
                self._thread = None
                self._asleep = False
                # the launches it had taken are lost (a log reader starts a collector itself)
                self._pending = sum(1 for kind, _ in self._q if kind == "launch")
                self._idle.notify_all()
                fds, self._rfd, self._wfd = (self._rfd, self._wfd), -1, -1
                for fd in fds:
                    os.close(fd)

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._rfd, select.POLLIN)
        watched: dict[int, _Child] = {}  # by pidfd
        polled: list[_Child] = []  # without a pidfd
        launches: collections.deque[tuple[float, AppDir, float]] = collections.deque()
        active_until = time.monotonic() + _WARM
        while True:
            while self._q:
                kind, item = self._q.popleft()
                if kind == "launch":
                    launches.append(item)
                    continue
                try:
                    fd = os.pidfd_open(item.pid)
                except OSError:
                    polled.append(item)
                else:
                    watched[fd] = item
                    poller.register(fd, select.POLLIN)
            now = time.monotonic()
            while launches and (launches[0][0] <= now or self._flushing):
                self._launch(*launches.popleft()[1:])
                now = time.monotonic()
            polled = [c for c in polled if not self._reaped(c)]
            if launches or watched or polled:
                active_until = now + _WARM
            if self._housekeepers and not launches:
                self._housekeeping()
            timeout = self._timeout(launches, polled, now, active_until)
            if not self._wait(poller, timeout, watched):
                continue

    def _timeout(
        self, launches: Any, polled: list[_Child], now: float, active_until: float
    ) -> float | None:
        if launches:
            return float(max(0.0, launches[0][0] - now))
        if polled or self._housekeepers:
            return _TICK * 4
        return _TICK if now < active_until else None

    def _wait(self, poller: select.poll, timeout: float | None, watched: dict[int, _Child]) -> bool:
        """Sleeps until something happens (False: woken before sleeping)."""
        if timeout is None:
            self._asleep = True
            if self._q:  # appended before the flag was set: do not sleep on it
                self._asleep = False
                return False
        try:
            events = poller.poll(None if timeout is None else timeout * 1000)
        except InterruptedError:
            events = []
        self._asleep = False
        for fd, _ in events:
            if fd == self._rfd:
                try:
                    os.read(self._rfd, 4096)
                except OSError:
                    pass
                continue
            child = watched.pop(fd)
            poller.unregister(fd)
            self._reaped(child, fd)
            os.close(fd)
        return True

    def _launch(self, app: AppDir, grace: float) -> None:
        """Collects an app that already ended here; else starts its collector process."""
        try:
            record = app.read_record()
            obs = None if record is None else observe(app, record)
            if obs is None or AppDir.LOGS_DONE in obs.names:
                return
            if not obs.running:
                collect(app.path, grace, follow=False)  # (False: another collector is on it)
                return
            proc = start_collector(app.path, grace)
            if proc is not None:
                for done in [k for k, p in self.collectors.items() if p.returncode is not None]:
                    del self.collectors[done]
                self.collectors[app.path] = proc
                self._q.append(("watch", _Child(proc.pid, popen=proc)))
        except LogDirFullError as e:
            log.warning("%s", e.strerror)
        except Exception:
            log.warning("could not collect the logs of %s", app.path, exc_info=True)
        finally:
            with self._lock:
                self._pending -= 1
                self._idle.notify_all()

    def _housekeeping(self) -> None:
        with self._lock:
            keepers, self._housekeepers = self._housekeepers, set()
        for ref in keepers:
            keep = ref()
            if keep is not None and keep():
                with self._lock:  # some apps could not go yet: again later
                    self._housekeepers.add(ref)


BACKGROUND = Background()
