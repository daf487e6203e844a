"""The local scheduler: runs each replica of each role as a process on this host.

Exposed as ``local_cwd`` (replicas run in the current working directory; the image is ignored)
and ``local_dir`` (the role's image is an absolute directory the replicas run in).

Properties of a role that cannot be enforced on one host are ignored: resource requirements and
limits, retry policies and counts, deployment preferences.

**Any process can address a local app.** Each app keeps a small state directory under
``$SHIPYARD_STATE_DIR`` (else ``$XDG_STATE_HOME/shipyard``, else ``~/.local/state/shipyard``), in
``local/<app_id>/`` (layout in :mod:`core.schedulers._local_runtime`): what was submitted, the
replicas' pids and spawn times, their exit codes (each replica runs under a tiny ``/bin/sh``
wrapper that records it) and a few markers. So ``describe``, ``list``, ``exists``,
``log_iter`` and ``cancel`` work from any process on the host, also after the submitting
process exited; apps keep running when it does. Each replica runs in a process group of its
own and gets ``SHIPYARD_APP_ID``, ``SHIPYARD_ROLE_NAME``, ``SHIPYARD_REPLICA_ID``,
``SHIPYARD_NUM_REPLICAS``, ``SHIPYARD_RANK0_HOST`` (the ``rank0_env`` macro) and
``SHIPYARD_REPLICA_KEY`` (inherited by everything it starts; used to find leftovers).

**Logs.** A replica writes its stdout and stderr straight into ``<role>.<k>.stdout.log`` and
``<role>.<k>.stderr.log`` in the app's log directory (``<log_dir>/<app_id>/`` with cfg
``log_dir``, else the app's state directory). A collector writes ``<role>.<k>.combined.log``
(whole lines of both streams in the order it saw them arrive) and a coarse time index that
``log_iter``'s ``since``/``until`` use. The collector of an app still running 25 ms after
submit is a process of its own (it survives the submitting process); a shorter app has its logs
collected by the submitting process; a reader finishes the work of a collector that is gone.

**Nothing is orphaned.** ``cancel`` sends SIGTERM to the process group of every replica at once,
waits for the wrappers, sends SIGKILL after a grace period (:data:`DEFAULT_GRACE`), then ends
whatever the replicas left behind, also outside their process groups (found by their inherited
``SHIPYARD_REPLICA_KEY``). When a replica fails, the other replicas of the app are terminated
the same way (gang semantics: they are reported CANCELLED) and the app ends FAILED, naming the
replica that failed first; what a replica that ended leaves running is ended too. A
:class:`LocalScheduler` created in the main thread terminates the apps its process launched
when the process receives SIGTERM or SIGINT and raises :class:`SignalException`. Processes
that also clear their environment escape (a cgroup would be needed to catch those).

Exit codes: a replica killed by signal N reports ``-N``. The ``/bin/sh`` wrapper cannot tell
"killed by signal N" from "exited with 128+N", so exit codes 129..192 are reported as signals.
"""

from __future__ import annotations

import abc
import atexit
import collections
import itertools
import json
import logging
import os
import re
import shutil
import signal
import string
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

from core.schedulers import _local_runtime as rt
from core.schedulers.api import (
    IDEMPOTENCY_KEY,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
)
from core.specs import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    ReplicaStatus,
    Resource,
    Role,
    RoleStatus,
    is_terminal,
    macros,
    runopts,
)

if TYPE_CHECKING:
    import subprocess  # imported where used: ~5 ms of every CLI start, rarely needed

log = logging.getLogger(__name__)

__all__ = [
    "CWDImageProvider",
    "DEFAULT_GRACE",
    "ImageProvider",
    "LocalDirectoryImageProvider",
    "LocalOpts",
    "LocalScheduler",
    "LogIterator",
    "PopenRequest",
    "ReplicaParam",
    "SignalException",
    "create_cwd_scheduler",
    "create_scheduler",
    "state_dir",
]

LocalOpts = Mapping[str, CfgVal]

#: seconds between SIGTERM and SIGKILL when terminating replicas
DEFAULT_GRACE = rt.DEFAULT_GRACE

#: the environment variable holding the host of replica 0 (value of the ``rank0_env`` macro)
RANK0_ENV = "SHIPYARD_RANK0_HOST"

# The replica's wrapper: ``sh -c _WRAPPER EXITS_FILE STDOUT_LOG STDERR_LOG G CWD CMD ARGS...``.
# It first waits for end-of-file on fd 3, the read end of a pipe whose write end the submitting
# process closes once it started every replica (or dies): the wrappers' start-up work does not
# compete for the CPU with the submit loop. It opens the log files itself (so the submit path
# creates no files) and the app's exits file (kept open on fd 4, in append mode), changes to CWD
# (if not empty), and appends "G CODE" to the exits file when the command ended, in one write.
# Trapping TERM/INT/HUP keeps it alive to do so while the command gets the default dispositions
# (the subshell resets them). A signal can reach the group before the command's process exists
# (a cancel right after submit): the wrapper only notes it, and the subshell, forked in that
# moment, would miss it. So the subshell starts the command only if no signal was noted and
# neither the app's cancel nor its gang-failure marker exists: a canceller writes the marker
# before signalling, so a subshell that checked before it was written already gets the signal.
# Its own stderr is /dev/null (only the command's goes to the log): its "Terminated" notices
# stay out of the log.
_WRAPPER = (
    "trap 'c=129' HUP; trap 'c=130' INT; trap 'c=143' TERM;"
    ' read _ <&3; exec 3<&- >>"$1" 4>>"$0"; e=$2; g=$3; d=${0%/*};'
    ' if [ -n "$4" ]; then cd -- "$4" 2>>"$e" || { echo "$g 126" >&4; exit 126; }; fi; shift 4;'
    f' (trap - HUP INT TERM; [ -z "$c" ] && [ ! -e "$d/{rt.CANCELLED}" ] && [ ! -e "$d/{rt.GANG}" ]'
    ' || exit "${c:-143}"; exec "$@" 2>>"$e" 4>&-); echo "$g $?" >&4'
)
# Replicas start with every signal at its default disposition, as a fresh process: ignored
# signals would be inherited (Python ignores SIGPIPE, a terminal job may ignore SIGINT) and a
# shell cannot trap a signal ignored on entry. (glibc's own two real-time signals, which Python
# does not let one name, are left to glibc: its programs install handlers for them on use.)
_SIGDEF = tuple(
    sig for sig in signal.valid_signals() if sig not in (signal.SIGKILL, signal.SIGSTOP)
)
_SH = "/bin/sh"

_APP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
# byte -> suffix character, for bytes.translate (one C call per app id)
_SUFFIX_TABLE = bytes(ord(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)]) for b in range(256))
_HOSTNAME = "localhost"
# app.json's encoder: made once (json.dumps makes one per call) and compact; the summary is a
# fresh tree of plain values, so the cycle check is not needed
_encode_json = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode
_MAX_PIDFDS = 256  # per scheduler: pidfds kept to check running replicas cheaply
_WHICH: dict[tuple[str, str, str], str] = {}  # (command, PATH, cwd) -> its absolute path
_COLLECTOR_DELAY = 0.025  # seconds after submit before a log collector process is started
_COLLECTOR_NICE = 5  # the collector yields to the replicas
_TICK = 0.025  # seconds between looks of the background thread while it is busy
_WARM = 2.0  # seconds it keeps ticking after its last activity
_CHUNK = 1 << 20


def state_dir() -> str:
    """The directory holding the local apps' state directories (see the module docstring)."""
    return rt.apps_root()


class SignalException(Exception):
    """Raised when the process that created a :class:`LocalScheduler` gets SIGTERM or SIGINT
    (after the apps it launched were terminated)."""

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval


# --------------------------------------------------------------------------------------------
# requests
# --------------------------------------------------------------------------------------------


@dataclass
class ReplicaParam:
    """What ``LocalScheduler`` starts for one replica (the command, run by a small wrapper).

    ``env`` holds only what the replica adds to the submitting process's environment.
    ``stdout``/``stderr``/``combined`` are the replica's log files.
    """

    args: list[str]
    env: dict[str, str]
    stdout: str | None = None
    stderr: str | None = None
    combined: str | None = None
    cwd: str | None = None


@dataclass
class PopenRequest:
    """Parameters to start every replica of every role of an app.

    ``log_dir`` is the app's log directory, ``role_log_dirs[role][k]`` the directory of replica
    k's log files (``<role>.<k>.stdout.log``, ``.stderr.log``, ``.combined.log``).
    """

    app_id: str
    log_dir: str
    role_params: dict[str, list[ReplicaParam]]
    role_log_dirs: dict[str, list[str]]
    app_name: str = ""
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    backend: str = "local_cwd"
    session_name: str = ""


def _format_request(req: PopenRequest) -> str:
    lines = [f"app_id: {req.app_id}", f"log_dir: {req.log_dir}"]
    for role, params in req.role_params.items():
        for k, p in enumerate(params):
            lines.append(f"{role}/{k}: cwd={p.cwd}")
            lines.append(f"  args: {' '.join(_quote(a) for a in p.args)}")
            for key, val in sorted(p.env.items()):
                lines.append(f"  env: {key}={val}")
            lines.append(f"  stdout: {p.stdout}")
            lines.append(f"  stderr: {p.stderr}")
            lines.append(f"  combined: {p.combined}")
    return "\n".join(lines)


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# --------------------------------------------------------------------------------------------
# image providers
# --------------------------------------------------------------------------------------------


class ImageProvider(abc.ABC):
    """Sets up a role's image on this host (only the local scheduler needs this)."""

    @abc.abstractmethod
    def fetch(self, image: str) -> str:
        """Fetches ``image``; returns the path of its root on this host ('' if no-op)."""

    def fetch_role(self, role: Role) -> str:
        """Like :meth:`fetch` for the role's image; may update the role. Default: ``fetch``."""
        return self.fetch(role.image)

    def get_cwd(self, image: str) -> str | None:
        """The working directory of the replicas (None: the submitting process's cwd)."""
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """Where the role's entrypoint is."""
        return role.entrypoint

    def get_replica_param(
        self,
        img_root: str,
        role: Role,
        stdout: str | None = None,
        stderr: str | None = None,
        combined: str | None = None,
    ) -> ReplicaParam:
        """The :class:`ReplicaParam` of one replica of ``role`` (macros already applied).

        ``img_root`` is what :meth:`fetch` returned for the role's image.
        """
        args = [self.get_entrypoint(img_root, role), *role.args]
        return ReplicaParam(
            args=args,
            env=dict(role.env),
            stdout=stdout,
            stderr=stderr,
            combined=combined,
            cwd=self.get_cwd(img_root),
        )


class CWDImageProvider(ImageProvider):
    """Ignores the image and uses the current working directory as the image root.

    ``fetch("/tmp/foobar")`` and ``fetch("foobar:latest")`` both return ``os.getcwd()``.
    """

    def __init__(self, cfg: LocalOpts) -> None:
        self._cfg = cfg
        self._cwd: str | None = None  # (one provider per submit: one getcwd)

    def fetch(self, image: str) -> str:
        if self._cwd is None:
            self._cwd = os.getcwd()
        return self._cwd

    def get_cwd(self, image: str) -> str | None:
        return self.fetch(image)

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        return role.entrypoint


class LocalDirectoryImageProvider(ImageProvider):
    """Interprets the image as the path of a directory on this host; fetches nothing.

    The image must be an absolute path of an existing directory; the replicas run in it. A
    relative entrypoint is resolved against the image directory (a bare command name that is
    not there is looked up on ``PATH``); an absolute entrypoint runs as given.
    """

    def __init__(self, cfg: LocalOpts) -> None:
        self._cfg = cfg

    def fetch(self, image: str) -> str:
        """Returns ``image``.

        Raises:
            ValueError: if ``image`` is not an absolute path of an existing directory.
        """
        if not isinstance(image, str) or not os.path.isabs(image):
            raise ValueError(
                f"image: local_dir expects the absolute path of a directory, got {image!r}"
            )
        if not os.path.isdir(image):
            raise ValueError(f"image: {image!r} does not exist or is not a directory")
        return image

    def get_cwd(self, image: str) -> str | None:
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        entrypoint = role.entrypoint
        if os.path.isabs(entrypoint):
            return entrypoint
        candidate = os.path.join(img_root, entrypoint)
        if os.sep in entrypoint or os.path.exists(candidate):
            return candidate
        return entrypoint


# --------------------------------------------------------------------------------------------
# process-wide helpers: reaping our children, signal handling, collector launching
# --------------------------------------------------------------------------------------------


class _Background:
    """The one background thread of the local scheduler in a process.

    * reaps the replica wrappers (and collectors) this process started as soon as they exit
      (pidfds); a wrapper killed by a signal could not record its exit code, so it does;
    * starts each app's log collector :data:`_COLLECTOR_DELAY` seconds after submit, or, for an
      app that already ended by then, collects its logs right here (short apps never pay for
      an interpreter start);
    * evicts old finished apps when idle.

    Submitting only appends to a queue: the thread polls every :data:`_TICK` seconds for a while
    after any activity, and is woken through a pipe only when it sleeps without a deadline.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # flush() may run in a signal handler
        self._idle = threading.Condition(self._lock)
        self._q: collections.deque[tuple[str, Any]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._rfd = self._wfd = -1
        self._asleep = False  # True while it waits without a deadline
        self._pending = 0  # collector launches not done yet
        self._flushing = False
        self._evict: set[weakref.ref[LocalScheduler]] = set()  # schedulers with apps to bound

    # -- called by submitting threads --------------------------------------------------------

    def _put(self, item: tuple[str, Any]) -> None:
        self._q.append(item)
        if self._thread is None:  # (not started yet, or it ended: see _run)
            with self._lock:
                if self._thread is None:
                    self._rfd, self._wfd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                    self._thread = threading.Thread(
                        target=self._run, name="shipyard-local", daemon=True
                    )
                    self._thread.start()
                    return
        if self._asleep:  # read after the append: see _loop for why no wake-up is lost
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"x")
        except OSError:
            pass

    def watch(self, pid: int, app_dir: str | None = None, g: int = -1) -> None:
        """Reaps child ``pid`` when it exits (recording replica ``g``'s exit code if it must)."""
        self._put(("watch", (pid, app_dir, g, None)))

    def watch_popen(self, proc: subprocess.Popen[bytes]) -> None:
        """Reaps the child of ``proc`` (through ``proc.poll``) when it exits."""
        self._put(("watch", (proc.pid, None, -1, proc)))

    def submitted(
        self,
        app_dir: str,
        pids: list[int],
        grace: float,
        sched: weakref.ref[LocalScheduler] | None = None,
    ) -> None:
        """Reaps the replica wrappers ``pids`` (replica ``g`` is ``pids[g]``) of a just submitted
        app and sees to its log collection: one hand-over (a submit wakes the thread at most
        once, after its own work). ``sched``: the submitting scheduler, which bounds its apps."""
        with self._lock:
            self._pending += 1
            if sched is not None:
                self._evict.add(sched)
        for g, pid in enumerate(pids):
            self._q.append(("watch", (pid, app_dir, g, None)))
        self._put(("launch", (time.monotonic() + _COLLECTOR_DELAY, app_dir, grace)))

    def flush(self, timeout: float = 10.0) -> None:
        """Starts every queued log collection now and waits for that (called at exit)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if not self._pending:
                return
            self._flushing = True
            self._wake()
            try:
                while self._pending and time.monotonic() < deadline:
                    self._idle.wait(0.05)
            finally:
                self._flushing = False

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            log.error("the local scheduler's background thread failed", exc_info=True)
        finally:
            with self._lock:  # the next hand-over starts another (submitters do not poll it)
                self._thread = None
                self._asleep = False
                # the launches it had taken are lost (a log reader starts a collector itself);
                # the queued ones are the next thread's
                self._pending = sum(1 for kind, _ in self._q if kind == "launch")
                self._idle.notify_all()
                # (-1 first: a late wake-up must not write into a reused descriptor)
                fds, self._rfd, self._wfd = (self._rfd, self._wfd), -1, -1
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    def _loop(self) -> None:
        import select

        poller = select.poll()
        poller.register(self._rfd, select.POLLIN)
        procs: dict[int, _Watched] = {}  # by pidfd
        unwatched: list[_Watched] = []  # without pidfds: polled
        launches: collections.deque[tuple[float, str, float]] = collections.deque()
        active_until = time.monotonic() + _WARM
        while True:
            while self._q:
                kind, item = self._q.popleft()
                if kind == "watch":
                    try:
                        fd = os.pidfd_open(item[0])
                    except (OSError, AttributeError):
                        unwatched.append(item)
                    else:
                        procs[fd] = item
                        poller.register(fd, select.POLLIN)
                else:
                    launches.append(item)
            now = time.monotonic()
            while launches and (launches[0][0] <= now or self._flushing):
                _, app_dir, grace = launches.popleft()
                try:
                    _start_collection(app_dir, grace)
                except Exception:
                    log.warning("could not collect the logs of %s", app_dir, exc_info=True)
                finally:
                    with self._lock:
                        self._pending -= 1
                        self._idle.notify_all()
                now = time.monotonic()
            if unwatched:
                unwatched = [item for item in unwatched if not _reaped(item)]
            if launches or procs or unwatched:
                active_until = now + _WARM
            if len(self._evict) and not launches:
                self._run_evictions()
            # sleep: until the next launch, a tick while warm, or until woken
            timeout: float | None
            if launches:
                timeout = max(0.0, launches[0][0] - now)
            elif unwatched or len(self._evict):
                timeout = _TICK * 4
            elif now < active_until:
                timeout = _TICK
            else:
                timeout = None
            if timeout is None:
                self._asleep = True
                if self._q:  # appended before the flag was set: do not sleep on it
                    self._asleep = False
                    continue
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
                item = procs.pop(fd, None)
                poller.unregister(fd)
                if item is not None:
                    _reaped(item, fd)
                os.close(fd)

    def _run_evictions(self) -> None:
        with self._lock:
            refs = self._evict
            self._evict = set()
        for ref in refs:
            sched = ref()
            if sched is not None and sched._housekeeping():
                with self._lock:  # some apps could not go yet: try again later
                    self._evict.add(ref)

    def after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


_Watched = tuple[int, "str | None", int, "subprocess.Popen[bytes] | None"]


def _reaped(item: _Watched, pidfd: int = -1) -> bool:
    """Reaps an exited child (False if it still runs); records the exit code of a wrapper that
    was killed by a signal (it could not record one itself)."""
    pid, app_dir, g, proc = item
    if proc is not None:
        return proc.poll() is not None
    killed_by = 0
    try:
        if pidfd >= 0:
            res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)  # type: ignore[attr-defined]
            if res is None:
                return False
            if res.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                killed_by = res.si_status
        else:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                return False
            if os.WIFSIGNALED(status):
                killed_by = os.WTERMSIG(status)
    except (ChildProcessError, AttributeError, OSError):
        return True  # reaped by someone else (e.g. terminate)
    if app_dir is not None and killed_by:
        rt.record_exit(app_dir, g, -killed_by)
    return True


_BG = _Background()
atexit.register(_BG.flush)
os.register_at_fork(after_in_child=_BG.after_fork)

# Write ends of the start gates (see _WRAPPER) of submits in progress. A child forked meanwhile
# (without exec) must not keep one open, or the replicas would wait for that child to exit.
_GATES: set[int] = set()
_GATES_LOCK = threading.Lock()


def _open_gate() -> tuple[int, int]:
    """A start gate: ``(read end, write end)``, both close-on-exec."""
    with _GATES_LOCK:  # a fork waits: the write end is in _GATES before any child can see it
        r, w = os.pipe2(os.O_CLOEXEC)
        _GATES.add(w)
    if r == 3:  # fd 3 is where the replicas get it: never dup2'ed onto itself (stays cloexec)
        r2 = os.dup(r)  # non-inheritable
        os.close(r)
        r = r2
    return r, w


def _release_gate(r: int, w: int) -> None:
    with _GATES_LOCK:
        _GATES.discard(w)
        os.close(w)  # end-of-file: every replica goes on
    os.close(r)


def _gates_after_fork_in_child() -> None:
    global _GATES_LOCK
    _GATES_LOCK = threading.Lock()
    for fd in _GATES:
        try:
            os.close(fd)
        except OSError:
            pass
    _GATES.clear()


os.register_at_fork(
    before=lambda: _GATES_LOCK.acquire(),
    after_in_parent=lambda: _GATES_LOCK.release(),
    after_in_child=_gates_after_fork_in_child,
)


def _start_collection(app_dir: str, grace: float) -> None:
    """Collects the logs of an app that already ended in this process, else starts its
    collector process."""
    summary = rt.load_summary(app_dir)
    if summary is None:
        return
    obs = rt.observe(app_dir, summary)
    if obs is None:
        return
    if rt.LOGS_DONE in obs.names:
        return
    if not obs.running:
        rt.collect(app_dir, grace, follow=False)  # (False: another collector is on it)
        return
    spawn_collector(app_dir, grace)


_COLLECTORS: dict[str, subprocess.Popen[bytes]] = {}


def spawn_collector(app_dir: str, grace: float = DEFAULT_GRACE) -> None:
    """Starts the log collector of one app (it exits at once if another one runs)."""
    if os.path.exists(os.path.join(app_dir, rt.LOGS_DONE)):
        return
    python = sys.executable or shutil.which("python3") or "python3"
    try:
        err = os.open(
            os.path.join(app_dir, rt.COLLECTOR_LOG),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o644,
        )
    except FileNotFoundError:
        return  # the app is gone
    import subprocess

    try:
        proc = subprocess.Popen(
            [python, "-S", "-I", rt.__file__, "collect", app_dir, repr(float(grace))],
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
    _COLLECTORS[app_dir] = proc
    for done in [d for d, p in _COLLECTORS.items() if p.returncode is not None]:
        _COLLECTORS.pop(done, None)
    _BG.watch_popen(proc)


def _finish_collector(app_dir: str, timeout: float = 5.0) -> None:
    """Makes sure the logs of an ended app are collected and its collector (if this process
    started one) has exited, so that nothing this process started outlives it."""
    _BG.flush(timeout)
    proc = _COLLECTORS.get(app_dir)
    if proc is None:
        rt.collect(app_dir, follow=False)
        return
    import subprocess

    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("the log collector of %s did not finish in %ss", app_dir, timeout)


class _SignalHandlers:
    """SIGTERM/SIGINT handlers shared by the schedulers created in the main thread."""

    def __init__(self) -> None:
        self._schedulers: weakref.WeakSet[LocalScheduler] = weakref.WeakSet()
        self._previous: dict[int, Any] = {}
        self._handling = False

    def register(self, sched: LocalScheduler) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._schedulers.add(sched)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                current = signal.getsignal(sig)
                # installed already (another framework may have replaced it since: then again)
                if current == self._handle:
                    continue
                if current is signal.SIG_IGN:
                    continue  # respect an ignored signal (e.g. nohup)
                signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not the main interpreter / thread
                continue
            self._previous[sig] = current

    def unregister(self, sched: LocalScheduler) -> None:
        self._schedulers.discard(sched)
        if len(self._schedulers) or threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in list(self._previous.items()):
            try:
                if signal.getsignal(sig) == self._handle:
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
                # a handler installed over ours since stays; ours is no longer in the chain
                del self._previous[sig]
            except (ValueError, OSError):
                pass

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self._handling:  # a chained handler called back into us (or a second signal)
            raise SignalException(f"terminating on {sig.name}", sig)
        self._handling = True
        try:
            log.info("received %s: terminating the local apps launched by this process", sig.name)
            for sched in list(self._schedulers):
                sched._terminate_launched()
            previous = self._previous.get(signum)
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signum, frame)
        finally:
            self._handling = False
        raise SignalException(f"terminating on {sig.name}", sig)


_SIGNALS = _SignalHandlers()


# --------------------------------------------------------------------------------------------
# the scheduler
# --------------------------------------------------------------------------------------------


class LocalScheduler(Scheduler[PopenRequest]):
    """Schedules apps as processes on this host (see the module docstring).

    Args:
        session_name: the session apps are submitted under
        image_provider_class: makes the :class:`ImageProvider` from the cfg
        cache_size: how many finished apps launched by this instance are kept (in memory and in
            the state directory); beyond that the oldest finished ones are removed. Apps of
            other processes are left to them; any app finished longer than
            ``$SHIPYARD_LOCAL_RETENTION_DAYS`` (default 7) days ago is removed by any instance.
        extra_paths: directories prepended to the replicas' ``PATH``
        backend: the registered scheduler name (``local_cwd`` or ``local_dir``)
        grace: seconds between SIGTERM and SIGKILL when terminating replicas
    """

    def __init__(
        self,
        session_name: str,
        image_provider_class: Callable[[LocalOpts], ImageProvider],
        cache_size: int = 100,
        extra_paths: list[str] | None = None,
        backend: str = "local_cwd",
        grace: float = DEFAULT_GRACE,
    ) -> None:
        super().__init__(backend, session_name)
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size <= 0:
            raise ValueError(f"cache_size: expected a positive integer, got {cache_size!r}")
        if extra_paths is not None and (
            not isinstance(extra_paths, list) or not all(isinstance(p, str) for p in extra_paths)
        ):
            raise ValueError(f"extra_paths: expected a list of directories, got {extra_paths!r}")
        self._image_provider_class = image_provider_class
        self._cache_size = cache_size
        self._extra_paths = list(extra_paths or [])
        self._grace = float(grace)
        # re-entrant: the signal handler runs in the main thread, maybe while it holds the lock
        self._lock = threading.RLock()
        self._summaries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._finished: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # apps launched by this instance and not yet seen terminal: app_id -> app_dir
        self._launched: dict[str, str] = {}
        # apps launched by this instance and not evicted yet (cache_size bounds the finished)
        self._own: OrderedDict[str, str] = OrderedDict()
        self._done_at: dict[str, float] = {}  # of _own's apps: when they ended (DONE's mtime)
        self._pid = os.getpid()
        self._inflight: dict[str, list[tuple[int, float]]] = {}
        # re-entrant for the same reason as _lock
        self._cancel_locks: dict[str, threading.RLock] = {}
        self._fd_lock = threading.RLock()
        self._pidfds: dict[tuple[str, int], int] = {}
        self._exited: set[tuple[str, int]] = set()  # wrappers known to have ended
        self._devnull = -1
        self._closed = False
        self._wref = weakref.ref(self)  # how the background thread refers to it
        _SIGNALS.register(self)

    # -- options -----------------------------------------------------------------------------

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("log_dir", type_=str, help="dir to write stdout/stderr log files of replicas")
        opts.add(
            "prepend_cwd",
            type_=bool,
            default=False,
            help="if set, prepends CWD to replica's PATH env var making any binaries in CWD"
            " take precedence over those in PATH",
        )
        opts.add(
            "auto_set_cuda_visible_devices",
            type_=bool,
            default=False,
            help="sets the `CUDA_AVAILABLE_DEVICES` for roles that request GPU resources. Each"
            " role replica will be assigned one GPU. Does nothing if the device count is less"
            " than replicas.",
        )
        return opts

    # -- dry run -----------------------------------------------------------------------------

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        log_dir = cfg.get("log_dir")
        if log_dir is not None and (not isinstance(log_dir, str) or not log_dir.strip()):
            raise ValueError(f"cfg.log_dir: expected a directory path, got {log_dir!r}")

    def _new_app_id(self, name: str) -> str:
        # one call for the whole suffix (what secrets.token_bytes does; importing secrets
        # costs ~10 ms of hmac/hashlib/random imports per CLI start)
        suffix = os.urandom(10).translate(_SUFFIX_TABLE).decode("ascii")
        return f"{name}-{suffix}"

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[PopenRequest]:
        app_id = self._new_app_id(app.name)
        app_dir = f"{rt.apps_root()}/{app_id}"  # (the root is absolute and normalised)
        log_root = cfg.get("log_dir")
        log_dir = (
            f"{os.path.abspath(os.path.expanduser(log_root))}/{app_id}"
            if isinstance(log_root, str)
            else app_dir
        )
        provider = self._image_provider_class(cfg)
        role_params: dict[str, list[ReplicaParam]] = {}
        role_log_dirs: dict[str, list[str]] = {}
        base_path = os.environ.get("PATH", os.defpath)
        flat: list[ReplicaParam] = []
        for i, role in enumerate(app.roles):
            img_root = provider.fetch_role(role)
            params: list[ReplicaParam] = []
            dirs: list[str] = []
            resolved: dict[tuple[str, str, str], str] = {}
            for k in range(role.num_replicas):
                replica_role = _apply_macros(role, img_root, app_id, k)
                replica_dir = log_dir
                base = f"{log_dir}/{role.name}.{k}"
                param = provider.get_replica_param(
                    img_root,
                    replica_role,
                    stdout=f"{base}.stdout.log",
                    stderr=f"{base}.stderr.log",
                    combined=f"{base}.combined.log",
                )
                cwd = param.cwd or os.getcwd()
                path = param.env.get("PATH", base_path)
                prefix = list(self._extra_paths)
                if cfg.get("prepend_cwd"):
                    prefix.insert(0, cwd)
                if prefix:
                    path = os.pathsep.join([*prefix, path]) if path else os.pathsep.join(prefix)
                    param.env["PATH"] = path
                param.env.update(
                    {
                        "SHIPYARD_APP_ID": app_id,
                        "SHIPYARD_APP_NAME": app.name,
                        "SHIPYARD_ROLE_NAME": role.name,
                        "SHIPYARD_REPLICA_ID": str(k),
                        "SHIPYARD_NUM_REPLICAS": str(role.num_replicas),
                        RANK0_ENV: _HOSTNAME,
                    }
                )
                where = (param.args[0], cwd, path)
                if where not in resolved:  # the same for every replica, mostly
                    resolved[where] = self._resolve_entrypoint(param.args[0], cwd, path, i)
                param.args[0] = resolved[where]
                param.env[rt.MARKER_ENV] = f"{app_id}:{len(flat)}"
                flat.append(param)
                params.append(param)
                dirs.append(replica_dir)
            role_params[role.name] = params
            role_log_dirs[role.name] = dirs
        if cfg.get("auto_set_cuda_visible_devices"):
            self._auto_set_cuda_visible_devices(role_params, app)
        request = PopenRequest(
            app_id=app_id,
            log_dir=log_dir,
            role_params=role_params,
            role_log_dirs=role_log_dirs,
            app_name=app.name,
            roles=list(app.roles),
            metadata=dict(app.metadata),
            backend=self.backend,
            session_name=self.session_name,
        )
        return AppDryRunInfo(request, _format_request)

    @staticmethod
    def _resolve_entrypoint(entrypoint: str, cwd: str, path: str, i: int) -> str:
        """An absolute path for a command found on PATH (so the shell wrapper never runs a
        shell builtin of the same name); checks that the entrypoint exists."""
        if os.sep in entrypoint:
            full = entrypoint if os.path.isabs(entrypoint) else os.path.join(cwd, entrypoint)
            if not os.path.isfile(full):
                raise ValueError(f"roles[{i}].entrypoint: {entrypoint!r} does not exist")
            if not os.access(full, os.X_OK):
                raise ValueError(f"roles[{i}].entrypoint: {entrypoint!r} is not executable")
            return entrypoint
        key = (entrypoint, path, cwd)
        cached = _WHICH.get(key)
        if cached is not None and os.access(cached, os.X_OK):  # still there: no PATH search
            return cached
        found = shutil.which(entrypoint, path=path)
        if found is None:
            raise ValueError(f"roles[{i}].entrypoint: {entrypoint!r} was not found on PATH")
        found = os.path.abspath(found)
        if len(_WHICH) >= 256:
            _WHICH.clear()
        _WHICH[key] = found
        return found

    def _get_gpu_device_count(self) -> int:
        """Number of GPUs on this host (``nvidia-smi -L``), 0 if none can be found."""
        smi = shutil.which("nvidia-smi")
        if not smi:
            return 0
        import subprocess

        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return 0
        if out.returncode != 0:
            return 0
        return sum(1 for line in out.stdout.splitlines() if line.strip().startswith("GPU"))

    def _auto_set_cuda_visible_devices(
        self, role_params: dict[str, list[ReplicaParam]], app: AppDef
    ) -> None:
        """One GPU per replica of every role that asks for GPUs, if there are enough."""
        gpu_roles = [r for r in app.roles if r.resource.gpu > 0]
        needed = sum(r.num_replicas for r in gpu_roles)
        if not needed:
            return
        count = self._get_gpu_device_count()
        if count < needed:
            log.warning(
                "auto_set_cuda_visible_devices: %d replicas ask for GPUs but %d GPUs were found;"
                " CUDA_VISIBLE_DEVICES is not set",
                needed,
                count,
            )
            return
        device = 0
        for role in gpu_roles:
            for param in role_params[role.name]:
                param.env["CUDA_VISIBLE_DEVICES"] = str(device)
                device += 1

    # -- schedule ----------------------------------------------------------------------------

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        """Starts every replica and returns the app id (the processes run when it returns)."""
        request = dryrun_info.request
        app_id = request.app_id
        _check_app_id(app_id)
        app_dir = f"{rt.apps_root()}/{app_id}"
        try:
            try:
                os.mkdir(app_dir, 0o700)
            except FileNotFoundError:
                os.makedirs(rt.apps_root(), exist_ok=True)
                os.mkdir(app_dir, 0o700)
        except FileExistsError:
            raise ValueError(f"app_id: {app_id} was already submitted") from None
        except OSError as e:
            raise ValueError(f"state directory: cannot create {app_dir}: {e.strerror or e}") from e
        base_env = rt.environ_bytes()
        if self._devnull < 0:
            self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        replicas: list[dict[str, Any]] = []
        started: list[tuple[int, float]] = []
        here = os.getcwd()
        with self._lock:
            self._inflight[app_id] = started
        exits = f"{app_dir}/{rt.EXITS}"
        try:
            # every log file's directory must be usable before anything starts
            paths: list[tuple[str, str, str]] = []
            cwds_ok = {here}
            # (the state directory was just made: it is writable and its file system not full)
            checked = {app_dir}
            for i, (role_name, params) in enumerate(request.role_params.items()):
                for k, param in enumerate(params):
                    if param.cwd and param.cwd not in cwds_ok:
                        if not os.path.isdir(param.cwd):
                            raise ValueError(
                                f"roles[{i}]: working directory {param.cwd!r} does not exist"
                            )
                        cwds_ok.add(param.cwd)
                    out, err, comb = param.stdout, param.stderr, param.combined
                    if not (out and err and comb):
                        base = os.path.join(request.role_log_dirs[role_name][k], f"{role_name}.{k}")
                        out = out or f"{base}.stdout.log"
                        err = err or f"{base}.stderr.log"
                        comb = comb or f"{base}.combined.log"
                    paths.append((out, err, comb))
                    for log_file in (out, err, comb):
                        d = os.path.dirname(log_file)
                        if d not in checked:
                            _check_log_dir(d)
                            checked.add(d)
            g = 0
            gate_r, gate_w = _open_gate()  # fd 3 of the replicas (see _WRAPPER)
            dup2, null = os.POSIX_SPAWN_DUP2, self._devnull
            actions = [(dup2, null, 0), (dup2, null, 1), (dup2, null, 2), (dup2, gate_r, 3)]
            try:
                for role_index, (role_name, params) in enumerate(request.role_params.items()):
                    for k, param in enumerate(params):
                        out, err, comb = paths[g]
                        cwd = param.cwd if param.cwd and param.cwd != here else ""
                        spawned = time.time()
                        # its own process group (not session: setsid(2) is slow where the
                        # kernel's autogroups are on); what leaves the group is found by
                        # MARKER_ENV. posix_spawn: cheaper than Popen; close-on-exec keeps our
                        # fds out of it.
                        pid = os.posix_spawn(
                            _SH,
                            [_SH, "-c", _WRAPPER, exits, out, err, str(g), cwd, *param.args],
                            _replica_env(base_env, param.env),
                            file_actions=actions,
                            setpgroup=0,
                            setsigdef=_SIGDEF,
                            setsigmask=(),
                        )
                        started.append((pid, spawned))
                        replicas.append(
                            {
                                "role": role_name,
                                "ri": role_index,
                                "k": k,
                                "pid": pid,
                                "t": spawned,
                                "out": out,
                                "err": err,
                                "comb": comb,
                            }
                        )
                        g += 1
                summary = {
                    "v": 1,
                    "app_id": app_id,
                    "name": request.app_name or app_id.rsplit("-", 1)[0],
                    "backend": request.backend,
                    "session": request.session_name,
                    "submit_time": time.time(),
                    "key": request.metadata.get(IDEMPOTENCY_KEY),
                    "host": _HOSTNAME,
                    "log_dir": request.log_dir,
                    "roles": [_role_to_json(r) for r in request.roles]
                    or [
                        {"name": name, "num_replicas": len(params)}
                        for name, params in request.role_params.items()
                    ],
                    "replicas": replicas,
                }
                # recorded before the replicas go on (one exclusive create: readers take a
                # half-written file for a missing one), so that no user command runs unrecorded
                try:
                    created = rt.create_exclusive(f"{app_dir}/{rt.APP_FILE}", _encode_json(summary))
                except OSError as e:
                    raise ValueError(
                        f"state directory: cannot write {app_dir}: {e.strerror or e}"
                    ) from e
                if not created:
                    raise ValueError(f"app_id: {app_id} was already submitted")
            except BaseException:
                for pid, _ in started:  # still at the gate: none ran its command yet
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                raise
            finally:
                _release_gate(gate_r, gate_w)
        except BaseException:
            # a failure half-way (or a signal): nothing that was started may be left behind
            partial = {"replicas": [{"pid": p, "t": t} for p, t in started]}
            rt.terminate(app_dir, partial, grace=self._grace)
            for pid, _ in started:
                _BG.watch(pid)
            with self._lock:
                self._inflight.pop(app_id, None)
            shutil.rmtree(app_dir, ignore_errors=True)
            raise
        try:
            key = request.metadata.get(IDEMPOTENCY_KEY)
            if key:
                _write_key(key, app_id)
        finally:  # the app runs: it is tracked, even if its key could not be written
            with self._lock:
                self._inflight.pop(app_id, None)
                self._launched[app_id] = app_dir
                self._own[app_id] = app_dir
                self._remember(app_id, summary)
            _BG.submitted(app_dir, [pid for pid, _ in started], self._grace, self._wref)
        return app_id

    # -- state -------------------------------------------------------------------------------

    def _remember(self, app_id: str, summary: dict[str, Any]) -> None:
        self._summaries[app_id] = summary
        self._summaries.move_to_end(app_id)
        while len(self._summaries) > self._cache_size:
            old_id, _ = self._summaries.popitem(last=False)
            self._forget_pidfds(old_id)

    def _summary(self, app_id: str) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(app_id, str) or not _APP_ID_RE.match(app_id):
            return None
        app_dir = os.path.join(rt.apps_root(), app_id)
        with self._lock:
            summary = self._summaries.get(app_id)
        if summary is None:
            summary = rt.load_summary(app_dir)
            if summary is None:
                return None
            with self._lock:
                self._remember(app_id, summary)
        return app_dir, summary

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's state and every replica's status; None if there is no such app."""
        with self._lock:
            final = self._finished.get(app_id)
        found = self._summary(app_id)
        if found is None:
            return None
        app_dir, summary = found
        if final is not None:
            if os.path.isdir(app_dir):
                return _response(app_id, summary, final)
            with self._lock:
                self._finished.pop(app_id, None)
            return None
        obs = rt.observe(app_dir, summary, self._liveness(app_id, summary))
        if obs is None:
            with self._lock:
                self._summaries.pop(app_id, None)
            return None
        if obs.done is not None:
            final = obs.done
        else:
            rt.enforce(app_dir, summary, obs, self._grace)
            final = _final_state(summary, obs)
            if final is None:
                return _response(app_id, summary, _running_state(summary, obs))
            if app_id not in self._launched and rt.LOGS_DONE not in obs.names:
                # launched elsewhere and its collector may be gone (e.g. the submitting process
                # was killed): finish its work, including ending what the replicas left behind
                rt.collect(app_dir, self._grace, follow=False)
            rt.write_atomic(os.path.join(app_dir, rt.DONE), json.dumps(final))
        self._forget_pidfds(app_id)
        with self._lock:
            self._finished[app_id] = final
            self._finished.move_to_end(app_id)
            while len(self._finished) > self._cache_size:
                self._finished.popitem(last=False)
            self._launched.pop(app_id, None)
        return _response(app_id, summary, final)

    def _liveness(self, app_id: str, summary: dict[str, Any]) -> Callable[[list[int]], list[bool]]:
        """Liveness of replica wrappers through cached pidfds: one ``poll`` per describe instead
        of reading /proc for every replica (falls back to /proc beyond the fd budget)."""

        def alive(replicas: list[int]) -> list[bool]:
            import select

            reps = summary["replicas"]
            out: dict[int, bool] = {}
            with self._fd_lock:
                fds: dict[int, int] = {}
                for g in replicas:
                    key = (app_id, g)
                    if key in self._exited:
                        out[g] = False
                        continue
                    fd = self._pidfds.get(key)
                    if fd is None:
                        pid, spawned = int(reps[g]["pid"]), float(reps[g].get("t") or 0)
                        if len(self._pidfds) >= _MAX_PIDFDS or not hasattr(os, "pidfd_open"):
                            out[g] = rt.is_alive(pid, spawned)
                            continue
                        try:
                            fd = os.pidfd_open(pid)
                        except ProcessLookupError:
                            out[g] = False
                            self._exited.add(key)
                            continue
                        except OSError:
                            out[g] = rt.is_alive(pid, spawned)
                            continue
                        if not rt.is_alive(pid, spawned):
                            os.close(fd)
                            out[g] = False
                            self._exited.add(key)
                            continue
                        self._pidfds[key] = fd
                    fds[fd] = g
                    out[g] = True
                if fds:
                    poller = select.poll()
                    for fd in fds:
                        poller.register(fd, select.POLLIN)
                    for fd, _ in poller.poll(0):
                        g = fds[fd]
                        out[g] = False  # exited
                        del self._pidfds[(app_id, g)]
                        self._exited.add((app_id, g))
                        os.close(fd)
            return [out[g] for g in replicas]

        return alive

    def _forget_pidfds(self, app_id: str) -> None:
        with self._fd_lock:
            for key in [k for k in self._pidfds if k[0] == app_id]:
                os.close(self._pidfds.pop(key))
            self._exited = {k for k in self._exited if k[0] != app_id}

    def exists(self, app_id: str) -> bool:
        """True if an app with this id is in the state directory."""
        if not isinstance(app_id, str) or not _APP_ID_RE.match(app_id):
            return False
        return os.path.exists(os.path.join(rt.apps_root(), app_id, rt.APP_FILE))

    def list(self) -> list[ListAppResponse]:
        """The local apps of this backend in the state directory, newest first."""
        root = rt.apps_root()
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        found: list[tuple[float, str]] = []
        for name in names:
            if not _APP_ID_RE.match(name):
                continue
            summary = rt.load_summary(os.path.join(root, name))
            if summary is None or summary.get("backend", self.backend) != self.backend:
                continue
            found.append((float(summary.get("submit_time") or 0), name))
        found.sort(reverse=True)
        out = []
        for _, app_id in found:
            desc = self.describe(app_id)
            if desc is not None:
                out.append(ListAppResponse(app_id=app_id, state=desc.state))
        return out

    def find_by_idempotency_key(
        self, key: str, cfg: Mapping[str, CfgVal] | None = None
    ) -> str | None:
        """The newest app submitted with ``key`` (any process), or None."""
        app_id = rt.read_text(_key_path(key))
        if app_id is None:
            return None
        app_id = app_id.strip()
        found = self._summary(app_id)
        if found is None or found[1].get("key") != key:
            return None
        return app_id

    # -- logs --------------------------------------------------------------------------------

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Log lines of replica ``k`` of ``role_name`` (default stream: combined).

        ``since``/``until`` select lines by the time the collector saw them (to within a few
        tens of milliseconds). With ``should_tail`` the iterator follows the output until the app
        is terminal and every line was read. A partial last line is held back until its
        newline arrives or the replica ended (then it is returned without ``\\n``).

        Raises:
            ValueError: unknown app, role or replica, or an unsupported stream.
        """
        stream = check_stream(streams, list(Stream))
        found = self._summary(app_id)
        if found is None:
            raise ValueError(f"app_id: no local app {app_id!r} in {rt.apps_root()}")
        app_dir, summary = found
        g = _replica_index(summary, role_name, k)
        if g is None:
            roles = [r["name"] for r in summary["roles"]]
            raise ValueError(
                f"role/replica: app {app_id} has no replica {k} of role {role_name!r}"
                f" (roles: {roles})"
            )
        rep = summary["replicas"][g]
        path = rep[{Stream.STDOUT: "out", Stream.STDERR: "err", Stream.COMBINED: "comb"}[stream]]
        return LogIterator(
            app_id,
            regex or "",
            path,
            self,
            should_tail=should_tail,
            since=since,
            until=until,
            stream=stream,
            replica=g,
            app_dir=app_dir,
        )

    def _app_terminal(self, app_id: str) -> bool:
        desc = self.describe(app_id)
        return desc is None or is_terminal(desc.state)

    # -- cancel ------------------------------------------------------------------------------

    def _cancel_existing(self, app_id: str) -> None:
        found = self._summary(app_id)
        if found is None:
            return
        app_dir, summary = found
        with self._lock:
            lock = self._cancel_locks.setdefault(app_id, threading.RLock())
        with lock:
            desc = self.describe(app_id)
            if desc is None or is_terminal(desc.state):
                return
            rt.create_exclusive(os.path.join(app_dir, rt.CANCELLED), json.dumps(time.time()))
            # a live collector looks for what left the process groups when the wrappers end
            rt.terminate(app_dir, summary, grace=self._grace, scan=not rt.collector_alive(app_dir))
            self.describe(app_id)
        with self._lock:
            self._cancel_locks.pop(app_id, None)

    def _terminate_launched(self) -> None:
        """Terminates every app this instance launched that still runs (signal handler), and
        waits for their log collectors."""
        if os.getpid() != self._pid:
            return  # a forked child: the apps belong to the parent
        with self._lock:
            launched = dict(self._launched)
            inflight = {a: list(s) for a, s in self._inflight.items()}
        for app_id, started in inflight.items():
            app_dir = os.path.join(rt.apps_root(), app_id)
            rt.terminate(app_dir, {"replicas": [{"pid": p, "t": t} for p, t in started]})
        for app_id, app_dir in launched.items():
            try:
                self.cancel(app_id)
                _finish_collector(app_dir, timeout=2.0)
            except Exception:
                log.warning("could not terminate %s", app_id, exc_info=True)

    # -- housekeeping ------------------------------------------------------------------------

    def _housekeeping(self) -> bool:
        """Removes the oldest finished apps beyond ``cache_size``; True if some must wait."""
        if self._closed:
            return False
        try:
            return self._evict()
        except Exception:
            log.debug("local scheduler housekeeping failed", exc_info=True)
            return False

    def _evict(self) -> bool:
        """Keeps at most ``cache_size`` finished apps of those this instance launched (other
        processes' apps are theirs to bound), removing the oldest finished first; and, at most
        hourly, removes any app that finished more than the retention period ago
        (``$SHIPYARD_LOCAL_RETENTION_DAYS``, default 7). True if some app must wait."""
        now = time.time()
        if now - _SWEEP["last"] >= _SWEEP_EVERY:
            _SWEEP["last"] = now
            _sweep_old_apps(now)
        with self._lock:
            own = list(self._own.items())
        if len(own) <= self._cache_size:  # nothing can be in excess
            return False
        # an app's end time is looked up once: this pass runs after every submit, and a stat of
        # every kept app each time would compete with the next submit
        done_at = self._done_at
        finished: list[tuple[float, str, str]] = []
        for app_id, app_dir in own:
            ended = done_at.get(app_id)
            if ended is None:
                try:
                    ended = done_at[app_id] = os.stat(os.path.join(app_dir, rt.DONE)).st_mtime
                except FileNotFoundError:
                    if not os.path.isdir(app_dir):
                        with self._lock:
                            self._own.pop(app_id, None)
                    elif os.path.exists(os.path.join(app_dir, rt.LOGS_DONE)):
                        desc = self.describe(app_id)  # ended, not described yet: records it
                        if desc is not None and is_terminal(desc.state):
                            finished.append((now, app_id, app_dir))
                    continue
            finished.append((ended, app_id, app_dir))
        waiting = False
        excess = len(finished) - self._cache_size
        if excess > 0:
            finished.sort()
            for _, app_id, app_dir in finished[:excess]:
                if _remove_app(app_dir) is None:
                    waiting = True  # its collector is still writing
                    continue
                with self._lock:
                    self._own.pop(app_id, None)
                    self._summaries.pop(app_id, None)
                    self._finished.pop(app_id, None)
                done_at.pop(app_id, None)
        return waiting

    def close(self) -> None:
        """Releases what this instance holds (caches, signal handlers). Apps keep running."""
        if self._closed:
            return
        self._closed = True
        try:
            _SIGNALS.unregister(self)
        except Exception:
            pass
        with self._lock:
            self._summaries.clear()
            self._finished.clear()
            self._launched.clear()
            self._done_at.clear()
        with self._fd_lock:
            for fd in self._pidfds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._pidfds.clear()
        if self._devnull >= 0:
            try:
                os.close(self._devnull)
            except OSError:
                pass
            self._devnull = -1


# --------------------------------------------------------------------------------------------
# describe helpers
# --------------------------------------------------------------------------------------------


def _apply_macros(role: Role, img_root: str, app_id: str, k: int) -> Role:
    """What ``macros.Values(...).apply(role)`` gives, without deep-copying the role for every
    replica: a shallow copy with the macros substituted (by ``Values.substitute`` itself) in
    args and env."""
    # a shallow copy (not dataclasses.replace: no __init__ checks again per replica)
    replica = object.__new__(type(role))
    replica.__dict__.update(role.__dict__)
    if "$" not in "".join(role.args) and "$" not in "".join(role.env.values()):
        replica.args = list(role.args)  # (most roles: no macro anywhere)
        replica.env = dict(role.env)
        return replica
    values = macros.Values(img_root, app_id, str(k), RANK0_ENV)

    def sub(text: str) -> str:
        return values.substitute(text) if "$" in text else text

    replica.args = [sub(a) for a in role.args]
    replica.env = {key: sub(v) for key, v in role.env.items()}
    return replica


def _check_log_dir(path: str) -> None:
    """Creates ``path`` if needed and checks that log files can be written there."""
    try:
        os.makedirs(path, exist_ok=True)
        st = os.statvfs(path)
    except OSError as e:
        raise ValueError(f"cfg.log_dir: cannot create {path}: {e.strerror or e}") from e
    if st.f_flag & os.ST_RDONLY or not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"cfg.log_dir: {path} is not writable")
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    if free == 0 or (st.f_files and st.f_ffree == 0):
        raise ValueError(f"cfg.log_dir: no space left on the file system of {path}")


_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()


def _replica_env(base: Mapping[bytes, bytes], extra: Mapping[str, str]) -> dict[bytes, bytes]:
    env = dict(base)
    for key, value in extra.items():  # (what os.fsencode does, without its checks per call)
        env[key.encode(_FS_ENCODING, _FS_ERRORS)] = value.encode(_FS_ENCODING, _FS_ERRORS)
    return env


def _check_app_id(app_id: str) -> None:
    if not isinstance(app_id, str) or not _APP_ID_RE.match(app_id):
        raise ValueError(f"app_id: expected letters, digits, '_', '.', '-', got {app_id!r}")


def _key_path(key: str) -> str:
    import hashlib

    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return os.path.join(rt.apps_root(), ".keys", digest)


def _write_key(key: str, app_id: str) -> None:
    path = _key_path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rt.write_atomic(path, app_id)


_SWEEP: dict[str, float] = {"last": 0.0}
_SWEEP_EVERY = 3600.0


def _retention() -> float:
    try:
        return float(os.environ.get("SHIPYARD_LOCAL_RETENTION_DAYS", "7")) * 86400
    except ValueError:
        return 7 * 86400.0


def _remove_app(app_dir: str) -> bool | None:
    """Removes a finished app's state (and idempotency key); None if its collector still runs."""
    if not os.path.exists(os.path.join(app_dir, rt.LOGS_DONE)) and rt.collector_alive(app_dir):
        return None
    key = (rt.load_summary(app_dir) or {}).get("key")
    shutil.rmtree(app_dir, ignore_errors=True)
    if key:
        _remove_key(key, os.path.basename(app_dir))
    return True


def _sweep_old_apps(now: float) -> None:
    """Removes apps of any process that finished longer than the retention period ago."""
    root = rt.apps_root()
    cutoff = now - _retention()
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        if not _APP_ID_RE.match(name):
            continue
        app_dir = os.path.join(root, name)
        for marker in (rt.DONE, rt.LOGS_DONE):
            try:
                if os.stat(os.path.join(app_dir, marker)).st_mtime < cutoff:
                    _remove_app(app_dir)
                break
            except FileNotFoundError:
                continue


def _remove_key(key: str, app_id: str) -> None:
    path = _key_path(key)
    if (rt.read_text(path) or "").strip() == app_id:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _role_to_json(role: Role) -> dict[str, Any]:
    return {
        "name": role.name,
        "image": role.image,
        "entrypoint": role.entrypoint,
        "args": list(role.args),
        "env": dict(role.env),
        "num_replicas": role.num_replicas,
        "resource": [role.resource.cpu, role.resource.gpu, role.resource.memMB],
    }


def _replica_index(summary: dict[str, Any], role_name: str, k: int) -> int | None:
    for g, rep in enumerate(summary["replicas"]):
        if rep["role"] == role_name and rep["k"] == k:
            return g
    return None


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _describe_code(code: int | str | None) -> str:
    if code == rt.LOST:
        return "ended without recording an exit code (its wrapper was killed)"
    if isinstance(code, int) and code < 0:
        return f"was killed by signal {-code} ({_signal_name(-code)})"
    return f"exited with code {code}"


def _replica_state(code: int | str | None, terminated: bool) -> AppState:
    if code is None:
        return AppState.RUNNING
    if code == 0:
        return AppState.SUCCEEDED
    return AppState.CANCELLED if terminated else AppState.FAILED


def _gang_info(summary: dict[str, Any], obs: rt.Observation) -> tuple[int | None, set[int]]:
    """The replica whose failure terminated the others, and the replicas terminated for it."""
    if not obs.gang:
        return None, set()
    text = rt.read_text(os.path.join(rt.apps_root(), summary["app_id"], rt.GANG))
    try:
        info = json.loads(text or "")
        first, signalled = int(info["replica"]), {int(g) for g in info.get("terminated", [])}
    except (ValueError, KeyError, TypeError):
        return None, set()
    # those that ended by a signal (ours); one that exited with a code of its own failed itself
    return first, {g for g in signalled if g != first and _ended_by_signal(obs.codes[g])}


def _ended_by_signal(code: int | str | None) -> bool:
    return code == rt.LOST or (isinstance(code, int) and code < 0)


def _states(summary: dict[str, Any], obs: rt.Observation) -> list[str]:
    first, terminated = _gang_info(summary, obs)
    return [
        _replica_state(c, obs.cancelled or g in terminated).name for g, c in enumerate(obs.codes)
    ]


def _running_state(summary: dict[str, Any], obs: rt.Observation) -> dict[str, Any]:
    return {
        "state": AppState.RUNNING.name,
        "codes": obs.codes,
        "states": _states(summary, obs),
        "msg": "",
    }


def _final_state(summary: dict[str, Any], obs: rt.Observation) -> dict[str, Any] | None:
    """The final state of an app whose replicas all ended, else None."""
    if obs.running:
        return None
    failed = obs.failed
    if obs.cancelled:
        state, msg = AppState.CANCELLED, "cancelled"
    elif failed:
        first, terminated = _gang_info(summary, obs)
        if first is None or first not in failed:
            first = failed[0]
        rep = summary["replicas"][first]
        state = AppState.FAILED
        msg = f"{rep['role']}/{rep['k']} {_describe_code(obs.codes[first])}"
        own = [g for g in failed if g != first and g not in terminated]
        if own:
            msg += f"; {len(own)} other replica(s) failed too"
        if terminated:
            msg += f"; the other replicas were terminated ({len(terminated)})"
    else:
        state, msg = AppState.SUCCEEDED, ""
    return {
        "state": state.name,
        "codes": obs.codes,
        "states": _states(summary, obs),
        "msg": msg,
        "time": time.time(),
    }


def _response(app_id: str, summary: dict[str, Any], st: dict[str, Any]) -> DescribeAppResponse:
    statuses: dict[str, RoleStatus] = {}
    for rj in summary["roles"]:
        statuses[rj["name"]] = RoleStatus(rj["name"], [])
    codes = st["codes"]
    states = st["states"]
    host = summary.get("host") or _HOSTNAME
    for g, rep in enumerate(summary["replicas"]):
        code = codes[g]
        rs = statuses.setdefault(rep["role"], RoleStatus(rep["role"], []))
        rs.replicas.append(
            ReplicaStatus(
                id=rep["k"],
                state=AppState[states[g]],
                role=rep["role"],
                hostname=host,
                exit_code=code if isinstance(code, int) else None,
                structured_error_msg=NONE
                if code in (None, 0)
                else f"{rep['role']}/{rep['k']} {_describe_code(code)}",
            )
        )
    roles = [
        Role(
            name=rj["name"],
            image=rj.get("image", ""),
            entrypoint=rj.get("entrypoint", ""),
            args=list(rj.get("args", ())),
            env=dict(rj.get("env", ())),
            num_replicas=rj.get("num_replicas", 1),
            resource=Resource(*rj.get("resource", (-1, -1, -1))),
        )
        for rj in summary["roles"]
    ]
    return DescribeAppResponse(
        app_id=app_id,
        state=AppState[st["state"]],
        num_restarts=0,
        msg=st.get("msg") or NONE,
        roles_statuses=list(statuses.values()),
        roles=roles,
    )


# --------------------------------------------------------------------------------------------
# log iteration
# --------------------------------------------------------------------------------------------

# Besides \n, str.splitlines also splits on these (UTF-8 encoded); log lines end only at \n.
_OTHER_LINE_BREAKS = (
    b"\r",
    b"\x0b",
    b"\x0c",
    b"\x1c",
    b"\x1d",
    b"\x1e",
    b"\xc2\x85",
    b"\xe2\x80\xa8",
    b"\xe2\x80\xa9",
)


def _split(data: bytes) -> list[str]:
    """Lines of ``data`` (which ends with ``\\n``), decoded, each keeping its ``\\n``; only
    ``\\n`` ends a line (``\\r`` and other separators stay inside)."""
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
        scheduler: the scheduler (used to learn when the app is terminal)
        should_tail: follow the file until the app is terminal
    """

    def __init__(
        self,
        app_id: str,
        regex: str,
        log_file: str,
        scheduler: Scheduler[Any],
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
        self._app_dir = app_dir or os.path.join(rt.apps_root(), app_id)
        self._it: Iterator[str] | None = None
        self._spawned = False
        self._index_path = os.path.join(self._app_dir, f"{rt.INDEX_PREFIX}{replica}")
        self._index_off = 0
        self._committed_end = 0

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self._blocks())

    def __next__(self) -> str:
        if self._it is None:
            self._it = iter(self)
        return next(self._it)

    # -- completion ----------------------------------------------------------------------------

    def _app_ended(self) -> bool:
        sched = self._scheduler
        if isinstance(sched, LocalScheduler):
            return sched._app_terminal(self._app_id)
        desc = sched.describe(self._app_id)
        return desc is None or is_terminal(desc.state)

    def _collected(self) -> bool:
        """True once the collector consumed everything (taking over if it is gone)."""
        done = os.path.join(self._app_dir, rt.LOGS_DONE)
        if os.path.exists(done):
            return True
        if not self._app_ended():
            self._ensure_collector()
            return False
        # the app ended: if no collector runs, finish its work here
        rt.collect(self._app_dir, follow=False)
        return os.path.exists(done) or not os.path.isdir(self._app_dir)

    def _ensure_collector(self) -> None:
        """Starts a collector for a running app whose collector is gone (e.g. the submitting
        process was killed before it could start one). Once per iterator."""
        if self._spawned:
            return
        try:
            age = time.time() - os.stat(os.path.join(self._app_dir, rt.APP_FILE)).st_mtime
        except FileNotFoundError:
            return
        if age < 2.0 or rt.collector_alive(self._app_dir):
            return  # the submitting process starts the collector right after submit
        self._spawned = True
        spawn_collector(self._app_dir)

    def _complete(self) -> bool:
        """True when no more bytes will be appended to the file being read."""
        if self._replica is None:  # a plain file (made directly, not by log_iter)
            return self._app_ended()
        if self._stream is Stream.COMBINED or self._since is not None or self._until is not None:
            return self._collected()
        return self._app_ended()

    # -- reading -------------------------------------------------------------------------------

    def _blocks(self) -> Iterator[list[str]]:
        if self._replica is None or (self._since is None and self._until is None):
            if (
                self._stream is Stream.COMBINED
                and not self._should_tail
                and self._replica is not None
            ):
                # a finished app's combined log is complete only once the collector is done
                self._wait_collected()
            yield from self._read_range(0, None, self._should_tail)
        else:
            yield from self._read_windowed()

    def _wait_collected(self) -> None:
        if not self._app_ended():
            return
        deadline = time.monotonic() + 30.0
        delay = 0.001
        while not self._collected() and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _filter(self, lines: list[str]) -> list[str]:
        if self._pattern is None:
            return lines
        return list(filter(self._pattern.search, lines))

    def _read_range(self, start: int, end: int | None, follow: bool) -> Iterator[list[str]]:
        """Lines of bytes [start, end) of the file; with ``follow`` (and no end) waits for more
        until :meth:`_complete`."""
        try:
            f = open(self._log_file, "rb", buffering=0)
        except FileNotFoundError:
            if not follow:
                return
            f = None
        # combined.log is written by the collector: only bytes its index committed are final
        # (a collector that dies may leave bytes its successor rewrites)
        committed = (
            self._committed
            if end is None and self._stream is Stream.COMBINED and self._replica is not None
            else None
        )
        try:
            pos = start
            pending = b""
            delay = 0.002
            finishing = False
            while True:
                if f is None:
                    try:
                        f = open(self._log_file, "rb", buffering=0)
                    except FileNotFoundError:
                        f = None
                chunk = b""
                if f is not None:
                    limit = end if committed is None else committed()
                    size = _CHUNK if limit is None else min(_CHUNK, limit - pos)
                    if size > 0:
                        f.seek(pos)
                        chunk = f.read(size)
                if chunk:
                    pos += len(chunk)
                    data = pending + chunk if pending else chunk
                    cut = data.rfind(b"\n") + 1
                    if cut:
                        pending = data[cut:]
                        lines = self._filter(_split(data[:cut]))
                        if lines:
                            yield lines
                    else:
                        pending = data
                    delay = 0.002
                    continue
                if not follow or end is not None or finishing:
                    break
                if self._complete():
                    finishing = True  # one more read: bytes may have landed meanwhile
                    continue
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            if pending:
                lines = self._filter([pending.decode("utf-8", "replace")])
                if lines:
                    yield lines
        finally:
            if f is not None:
                f.close()

    def _committed(self) -> int:
        """The end of combined.log as committed by the collector's index."""
        entries, self._index_off = rt.read_index(self._index_path, self._index_off)
        if entries:
            self._committed_end = entries[-1][3]
        return self._committed_end

    def _read_windowed(self) -> Iterator[list[str]]:
        """Lines whose arrival time (from the collector's index) is within [since, until]."""
        col = {Stream.STDOUT: 1, Stream.STDERR: 2, Stream.COMBINED: 3}[self._stream]
        index_path = os.path.join(self._app_dir, f"{rt.INDEX_PREFIX}{self._replica}")
        since = self._since if self._since is not None else float("-inf")
        until = self._until if self._until is not None else float("inf")
        offset = 0
        prev = 0
        start: int | None = None  # start of the selected range not yet read
        delay = 0.002
        finishing = False
        while True:
            entries, offset = rt.read_index(index_path, offset)
            for entry in entries:
                t, off = entry[0], int(entry[col])
                if t > until:
                    if start is not None and prev > start:
                        yield from self._read_range(start, prev, False)
                    return
                if t >= since:
                    if start is None:
                        start = prev
                else:
                    start = None
                prev = off
            if start is not None and prev > start:
                yield from self._read_range(start, prev, False)
                start = prev
            if entries:
                delay = 0.002
                continue
            if finishing:
                break
            complete = self._collected()
            if complete:
                finishing = True
                continue
            if not self._should_tail:
                # still running: lines not indexed yet arrived just now
                if until == float("inf") and time.time() >= since:
                    yield from self._read_range(prev, None, False)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


# --------------------------------------------------------------------------------------------
# factories
# --------------------------------------------------------------------------------------------


def create_cwd_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_cwd`` scheduler: replicas run in the current working directory."""
    return LocalScheduler(
        session_name=session_name,
        image_provider_class=CWDImageProvider,
        backend="local_cwd",
        **kwargs,
    )


def create_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_dir`` scheduler: each role's image is the directory its replicas run in."""
    return LocalScheduler(
        session_name=session_name,
        image_provider_class=LocalDirectoryImageProvider,
        backend="local_dir",
        **kwargs,
    )
