"""Runtime of the local scheduler: per-app state files, process liveness and termination, and
the per-app log collector.

This module imports only the standard library because it also runs as a standalone script
(``python -S -I _local_runtime.py collect APP_DIR``): the log collector of one app, started after
the app's replicas so that it never delays ``submit``.

Layout of one app's state directory (``<state>/local/<app_id>/``)::

    app.json          what was submitted: roles, replicas (pid, spawn time, log files), key,
                      time; written once, when every replica was started
    exits             "<g> <code>" lines: the exit code of replica g (global index), appended
                      by its /bin/sh wrapper (or by whoever saw the wrapper killed)
    cancelled         marker: cancel was requested (JSON with the time)
    gang              marker: a replica failed, the others were told to terminate
    done              the final state, written by whoever first sees the app terminal
    collector.lock    flock'ed by the live collector (released by the kernel when it dies)
    collector.log     what the collector process had to say (errors only)
    idx.<g>           time index of replica g's logs: "time out_off err_off comb_off" lines
    logs_done         the collector consumed every byte of every replica's output
    <role>.<k>.{stdout,stderr,combined}.log   logs (unless cfg log_dir puts them elsewhere)

Replica stdout/stderr go straight from the process into ``<role>.<k>.stdout.log`` and
``.stderr.log`` (so no byte is ever lost, whoever dies); the collector tails them and writes
``<role>.<k>.combined.log`` (whole lines, in the order it saw them arrive; output that arrived
before it first looked is ordered by the files' modification times) and the time index used
for ``since``/``until``. Readers of ``combined.log`` only read what an index entry committed.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

STATE_DIR_ENV = "SHIPYARD_STATE_DIR"

APP_FILE = "app.json"
CANCELLED = "cancelled"
GANG = "gang"
DONE = "done"
LOGS_DONE = "logs_done"
LOCK = "collector.lock"
COLLECTOR_LOG = "collector.log"
EXITS = "exits"
INDEX_PREFIX = "idx."

#: seconds between SIGTERM and SIGKILL when terminating replicas
DEFAULT_GRACE = 5.0

# Exit code recorded for a wrapper that died without recording one (e.g. SIGKILL of the wrapper).
LOST = "lost"

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_HAVE_PROC = os.path.isdir("/proc/self")


# --------------------------------------------------------------------------------------------
# paths and files
# --------------------------------------------------------------------------------------------


def _state_root_as_set() -> str:
    root = os.environ.get(STATE_DIR_ENV)
    if not root:
        xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(
            os.path.expanduser("~"), ".local", "state"
        )
        root = os.path.join(xdg, "shipyard")
    return root


def state_root() -> str:
    """``$SHIPYARD_STATE_DIR`` else ``$XDG_STATE_HOME/shipyard`` else ``~/.local/state/shipyard``."""
    return os.path.abspath(_state_root_as_set())


_BYTES_ENVIRON = os.name == "posix"  # (there os.environ keeps bytes keys and values)


def environ_bytes() -> Mapping[bytes, bytes]:
    """The environment as bytes, not to be changed: ``os.environ``'s own store on POSIX (what
    ``posix_spawn`` takes without re-encoding; a lookup in it skips ``os.environ``'s Python-level
    encode/decode), else an encoded copy."""
    data = getattr(os.environ, "_data", None)  # CPython's store behind os.environ (and environb)
    if _BYTES_ENVIRON and type(data) is dict:
        return data
    return {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}


_STATE_DIR_KEY = STATE_DIR_ENV.encode()

# the last apps_root() answer, for the environment it came from: (variables, answer)
_APPS_ROOT: dict[tuple[bytes | None, ...], str] = {}


def apps_root() -> str:
    """The directory holding one sub-directory per local app."""
    env = environ_bytes()  # (looked up on every submit and describe: keep the last answer)
    key = (env.get(_STATE_DIR_KEY), env.get(b"XDG_STATE_HOME"), env.get(b"HOME"))
    found = _APPS_ROOT.get(key)
    if found is not None:
        return found
    root = _state_root_as_set()
    answer = os.path.join(os.path.abspath(root), "local")
    _APPS_ROOT.clear()
    if os.path.isabs(root):  # (a relative one depends on the working directory)
        _APPS_ROOT[key] = answer
    return answer


def write_atomic(path: str, data: str | bytes) -> None:
    """Writes ``path`` via a temporary file and ``os.replace`` (readers never see half a file)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # unique per writer thread
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, raw)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_exclusive(path: str, data: str) -> bool:
    """Creates ``path`` with ``data`` unless it exists; True if this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)
    return True


def read_text(path: str) -> str | None:
    """The file's text, or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def load_summary(app_dir: str) -> dict[str, Any] | None:
    """The parsed ``app.json`` of an app, or None if there is none (or it is unreadable)."""
    text = read_text(os.path.join(app_dir, APP_FILE))
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_exit(text: str | None) -> int | str | None:
    """Decodes a recorded exit code: None (not written yet), :data:`LOST`, or an exit code.

    The wrapper records ``$?`` of ``/bin/sh``: ``128+N`` means "killed by signal N" and is
    reported as ``-N`` (as ``subprocess`` does). A negative value was written by whoever reaped
    or killed the wrapper itself and is already a signal number.
    """
    if text is None:
        return None
    s = text.strip()
    if not s:
        return None
    if s == LOST:
        return LOST
    try:
        code = int(s)
    except ValueError:
        return LOST
    if 128 < code <= 128 + 64:
        return -(code - 128)
    return code


def read_exits(app_dir: str) -> dict[int, int | str]:
    """The recorded exit codes of an app's replicas (the first record of a replica wins)."""
    text = read_text(os.path.join(app_dir, EXITS))
    codes: dict[int, int | str] = {}
    if not text:
        return codes
    for line in text.split("\n"):
        g, _, value = line.partition(" ")
        if not value or not g.isdigit() or int(g) in codes:
            continue  # (a partial last line is not complete yet)
        code = parse_exit(value)
        if code is not None:
            codes[int(g)] = code
    return codes


def record_exit(app_dir: str, g: int, value: int | str) -> None:
    """Records an exit code for replica ``g`` unless its wrapper already did.

    Each record is one ``write`` of one line in append mode, as the wrappers write theirs.
    """
    if g in read_exits(app_dir):
        return
    try:
        fd = os.open(
            os.path.join(app_dir, EXITS), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        )
    except FileNotFoundError:  # app dir removed meanwhile
        return
    try:
        os.write(fd, f"{g} {value}\n".encode())
    except OSError as e:  # (a full disk): the replica then shows no exit code
        import logging

        logging.getLogger(__name__).warning(
            "could not record exit code %s of replica %d in %s: %s", value, g, app_dir, e
        )
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """``(state, ppid, pgrp, session, starttime)`` of ``pid`` from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    try:
        rest = data[data.rindex(b")") + 2 :].split()
        return (
            rest[0].decode(),
            int(rest[1]),
            int(rest[2]),
            int(rest[3]),
            int(rest[19]),
        )
    except (ValueError, IndexError):
        return None


_BTIME: float | None = None


def _boot_time() -> float:
    global _BTIME
    if _BTIME is None:
        _BTIME = 0.0
        try:
            with open("/proc/stat", "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        _BTIME = float(line.split()[1])
                        break
        except OSError:
            pass
    return _BTIME


def _same_process(st: tuple[str, int, int, int, int], spawned: float) -> bool:
    """True if a process with this /proc stat could be the one spawned at ``spawned``.

    /proc gives start times relative to boot, and the boot time only to the second, hence the
    tolerance; a pid is not reused within seconds (the kernel allocates them cyclically).
    """
    if not spawned or not _boot_time():
        return True
    started = _boot_time() + st[4] / _CLK_TCK
    return spawned - 2.0 <= started <= spawned + 30.0


def is_alive(pid: int, spawned: float = 0.0) -> bool:
    """True if ``pid`` runs and is the process spawned at time ``spawned`` (guards pid reuse).

    Zombies count as dead.
    """
    if pid <= 0:
        return False
    if _HAVE_PROC:
        st = proc_stat(pid)
        if st is None or st[0] in ("Z", "X", "x"):
            return False
        return _same_process(st, spawned)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pid: int, sig: int) -> bool:
    """Signals the process group led by ``pid`` (or ``pid`` alone if it has no group)."""
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


def signal_groups(leaders: Iterable[tuple[int, float]], sig: int) -> list[tuple[int, float]]:
    """Sends ``sig`` to the process group of every live leader; returns the ones signalled."""
    return [
        (pid, start) for pid, start in leaders if is_alive(pid, start) and _signal_group(pid, sig)
    ]


#: environment variable every process of replica g of an app inherits: ``<app_id>:<g>``
MARKER_ENV = "SHIPYARD_REPLICA_KEY"


def _last_pid() -> int:
    """The pid the kernel handed out last (0 if unknown)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0


def replica_members(
    app_id: str, replicas: Iterable[int] | None = None, since_pid: int = 0
) -> list[int]:
    """Live processes that carry the marker of the app (or of the given replicas of it).

    Every process of a replica inherits :data:`MARKER_ENV`, also those that left its process
    group or session: this finds what a replica left behind after its wrapper ended. They were
    all started after their wrapper: with ``since_pid`` (the first wrapper's pid) only younger
    pids are read, unless the kernel's pids wrapped around since.
    """
    if not _HAVE_PROC:
        return []
    if since_pid and _last_pid() < since_pid:
        since_pid = 0  # wrapped around: any pid may be one of them
    prefix = f"{MARKER_ENV}={app_id}:".encode()
    wanted = None if replicas is None else {str(g).encode() for g in replicas}
    me = os.getpid()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me or pid < since_pid:
            continue
        try:
            fd = os.open(f"/proc/{name}/environ", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            chunks = []
            while True:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                chunks.append(data)
        except OSError:
            continue
        finally:
            os.close(fd)
        env = b"".join(chunks)  # empty for zombies and kernel threads
        i = env.find(prefix)
        while i > 0 and env[i - 1] != 0:  # must start a variable
            i = env.find(prefix, i + 1)
        if i < 0:
            continue
        j = env.find(b"\0", i)
        g = env[i + len(prefix) : j if j >= 0 else len(env)]
        if wanted is None or g in wanted:
            found.append(pid)
    return found


def groups_empty(leaders: Iterable[tuple[int, float]]) -> bool:
    """True if no process (zombies included) is left in the wrappers' process groups."""
    for pid, _ in leaders:
        try:
            os.killpg(pid, 0)
            return False
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
    return True


def kill_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def replica_leaders(summary: dict[str, Any]) -> list[tuple[int, float]]:
    """``(pid, spawn time)`` of every replica wrapper, in global replica order."""
    return [(int(r["pid"]), float(r.get("t") or 0)) for r in summary["replicas"]]


# --------------------------------------------------------------------------------------------
# observing and enforcing an app's state (shared by describe, cancel and the collector)
# --------------------------------------------------------------------------------------------


class Observation:
    """A snapshot of an app's replicas: exit codes (None while running) and markers."""

    __slots__ = ("codes", "running", "cancelled", "gang", "names", "done")

    def __init__(self) -> None:
        self.codes: list[int | str | None] = []
        self.running: list[int] = []
        self.cancelled = False
        self.gang = False
        self.names: set[str] = set()
        self.done: dict[str, Any] | None = None

    @property
    def failed(self) -> list[int]:
        return [g for g, c in enumerate(self.codes) if c is not None and c != 0]


def observe(
    app_dir: str,
    summary: dict[str, Any],
    alive: Callable[[list[int]], list[bool]] | None = None,
) -> Observation | None:
    """Looks at the app's state directory and processes; None if the app directory is gone.

    ``alive(replicas)`` tells which of the given replicas' wrappers still run (default: /proc).
    """
    try:
        names = set(os.listdir(app_dir))
    except FileNotFoundError:
        return None
    obs = Observation()
    obs.names = names
    if DONE in names:
        text = read_text(os.path.join(app_dir, DONE))
        if text:
            try:
                obs.done = json.loads(text)
                return obs
            except ValueError:
                pass
    obs.cancelled = CANCELLED in names
    obs.gang = GANG in names
    replicas = summary["replicas"]
    every = list(range(len(replicas)))
    # a running wrapper has not written its code: the codes are read once some wrapper ended
    if alive is None:
        states = [
            is_alive(int(replicas[g]["pid"]), float(replicas[g].get("t") or 0)) for g in every
        ]
    else:
        states = alive(every)
    codes: list[int | str | None] = []
    recorded: dict[int, int | str] | None = None
    for g, running in enumerate(states):
        if running:
            obs.running.append(g)
            codes.append(None)
            continue
        if recorded is None:
            recorded = read_exits(app_dir)  # one file for every replica
        code = recorded.get(g)
        if code is None:
            code = read_exits(app_dir).get(g)  # written since it was read?
        codes.append(LOST if code is None else code)
    obs.codes = codes
    return obs


def marker_age(app_dir: str, name: str) -> float:
    try:
        return time.time() - os.stat(os.path.join(app_dir, name)).st_mtime
    except FileNotFoundError:
        return 0.0


def enforce(app_dir: str, summary: dict[str, Any], obs: Observation, grace: float) -> None:
    """Applies the app's termination rules given a fresh observation.

    * gang semantics: once a replica failed (and the app was not cancelled), the other replicas
      are sent SIGTERM (the ``gang`` marker records the first failure; only one observer acts);
    * after ``grace`` seconds of a cancel or a gang termination, survivors get SIGKILL.
    """
    if not obs.running:
        return
    leaders = replica_leaders(summary)
    if not obs.cancelled and not obs.gang and obs.failed:
        g = obs.failed[0]
        rep = summary["replicas"][g]
        info = json.dumps(
            {
                "replica": g,
                "role": rep["role"],
                "k": rep["k"],
                "time": time.time(),
                "terminated": obs.running,
            }
        )
        if create_exclusive(os.path.join(app_dir, GANG), info):
            signal_groups([leaders[i] for i in obs.running], signal.SIGTERM)
        return
    for marker, active in ((CANCELLED, obs.cancelled), (GANG, obs.gang)):
        if active and marker_age(app_dir, marker) > grace:
            killed = signal_groups([leaders[i] for i in obs.running], signal.SIGKILL)
            _record_killed(app_dir, summary, killed)
            return


def _record_killed(
    app_dir: str, summary: dict[str, Any], killed: Sequence[tuple[int, float]]
) -> None:
    """After SIGKILL of wrappers, records ``-9`` for those that could not record a code."""
    if not killed:
        return
    pids = {pid for pid, _ in killed}
    leaders = replica_leaders(summary)
    wait_exits(leaders, [g for g, (pid, _) in enumerate(leaders) if pid in pids], 1.0, app_dir)
    for g, (pid, t) in enumerate(leaders):
        if pid in pids and not is_alive(pid, t):
            record_exit(app_dir, g, -signal.SIGKILL)


def open_pidfds(leaders: Iterable[tuple[int, float]]) -> dict[int, int] | None:
    """pidfds of the live processes among ``leaders`` (fd -> index): an fd becomes readable
    the moment its process exits. None where pidfds are not available."""
    if not hasattr(os, "pidfd_open"):
        return None
    fds: dict[int, int] = {}
    for i, (pid, spawned) in enumerate(leaders):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except OSError:
            for fd in fds:
                os.close(fd)
            return None
        if is_alive(pid, spawned):  # checked after opening: the fd is the right process
            fds[fd] = i
        else:
            os.close(fd)
    return fds


def _wait_fds(fds: dict[int, int], timeout: float, app_dir: str | None = None) -> list[int]:
    """Waits up to ``timeout`` s for the pidfds to become readable (their processes exited);
    returns the values of those still running. Closes every fd.

    With ``app_dir``, the values are replica indices: a wrapper this process reaps that was
    killed by a signal (so it could not record an exit code) gets it recorded."""
    import select

    try:
        waiting = dict(fds)
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + max(timeout, 0.0)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                g = waiting.pop(fd, None)
                killed_by = _reap_if_child(fd)
                if killed_by and app_dir is not None and g is not None:
                    record_exit(app_dir, g, -killed_by)
        return sorted(waiting.values())
    finally:
        for fd in fds:
            os.close(fd)


def _reap_if_child(pidfd: int) -> int:
    """Reaps the exited process of ``pidfd`` if it is a child of this process (the process that
    submitted an app): its zombie would keep its process group alive a while longer. Returns
    the signal that killed it (0: none, or not a child of this process)."""
    try:
        res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)  # type: ignore[attr-defined]
    except (ChildProcessError, OSError, AttributeError):
        return 0
    if res is not None and res.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return int(res.si_status)
    return 0


def wait_exits(
    leaders: Sequence[tuple[int, float]],
    indices: Iterable[int],
    timeout: float,
    app_dir: str | None = None,
) -> list[int]:
    """Waits up to ``timeout`` s for the given leaders to exit; returns those still running
    (``app_dir``: see :func:`_wait_fds`)."""
    chosen = list(indices)
    fds = open_pidfds([leaders[i] for i in chosen])
    if fds is not None:
        return _wait_fds({fd: chosen[j] for fd, j in fds.items()}, timeout, app_dir)
    pending = [i for i in chosen if is_alive(*leaders[i])]
    deadline = time.monotonic() + max(timeout, 0.0)
    delay = 0.0005
    while pending and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
        pending = [i for i in pending if is_alive(*leaders[i])]
    return pending


def terminate(
    app_dir: str,
    summary: dict[str, Any],
    grace: float = DEFAULT_GRACE,
    only: Sequence[int] | None = None,
    scan: bool = True,
) -> None:
    """Ends every replica's process tree: SIGTERM to all process groups at once, waits for the
    wrappers to exit, SIGKILL after ``grace`` seconds, then ends whatever the replicas left
    behind (see :func:`replica_members`).

    With ``scan=False`` the look for processes that left their process group is skipped when
    the groups are empty (a live collector does it when it sees the wrappers end).
    """
    leaders = replica_leaders(summary)
    chosen = list(only if only is not None else range(len(leaders)))
    targets = [leaders[g] for g in chosen]
    fds = open_pidfds(targets)  # each checked to be the right process, once
    if fds is None:
        signal_groups(targets, signal.SIGTERM)
        left = wait_exits(leaders, chosen, grace, app_dir)
    else:
        running = {fd: chosen[j] for fd, j in fds.items()}
        for g in running.values():  # all groups at once, then wait for all
            _signal_group(leaders[g][0], signal.SIGTERM)
        left = _wait_fds(running, grace, app_dir)
    if left:
        killed = signal_groups([leaders[g] for g in left], signal.SIGKILL)
        _record_killed(app_dir, summary, killed)
    if not scan:
        # the groups empty as their zombie wrappers are reaped; only members that linger
        # (or wrappers nobody reaps) call for a look at every process
        deadline = time.monotonic() + 0.05
        while not groups_empty(targets) and time.monotonic() < deadline:
            time.sleep(0.001)
        scan = not groups_empty(targets)
    if scan:
        app_id = summary.get("app_id") or os.path.basename(app_dir)
        reap_replicas(app_id, chosen, grace, min((pid for pid, _ in targets), default=0))


def reap_replicas(
    app_id: str, replicas: Iterable[int] | None, grace: float, since_pid: int = 0
) -> None:
    """Terminates what is left of the given replicas (TERM, then KILL after ``grace``)."""
    wanted = None if replicas is None else list(replicas)
    left = replica_members(app_id, wanted, since_pid)
    if not left:
        return
    kill_pids(left, signal.SIGTERM)
    deadline = time.monotonic() + max(grace, 0.0)
    delay = 0.001
    while left and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        left = [p for p in left if is_alive(p)]
    left = sorted(set(left) | set(replica_members(app_id, wanted, since_pid)))  # and new ones
    if not left:
        return
    kill_pids(left, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while left and time.monotonic() < deadline:
        time.sleep(0.005)
        left = [p for p in left if is_alive(p)]


# --------------------------------------------------------------------------------------------
# the time index
# --------------------------------------------------------------------------------------------


def read_index(path: str, offset: int = 0) -> tuple[list[tuple[float, int, int, int]], int]:
    """Complete entries of an index file from byte ``offset``, and the offset after them."""
    try:
        with open(path, "rb") as f:
            if offset:
                f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    cut = data.rfind(b"\n") + 1
    entries = []
    for line in data[:cut].split(b"\n")[:-1]:
        parts = line.split()
        if len(parts) != 4:
            continue
        try:
            entries.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])))
        except ValueError:
            continue
    return entries, offset + cut


# --------------------------------------------------------------------------------------------
# the collector
# --------------------------------------------------------------------------------------------

_READ_CAP = 4 << 20
_INDEX_EVERY = 0.02
_TICK_MIN = 0.002
_TICK_MAX = 0.05


class _Stream:
    __slots__ = ("path", "fd", "off", "buf")

    def __init__(self, path: str, off: int) -> None:
        self.path = path
        self.off = off  # end of the whole lines consumed so far
        self.buf = b""  # bytes read after ``off`` that do not end a line yet
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            os.lseek(fd, off, os.SEEK_SET)
        except FileNotFoundError:
            fd = -1
        self.fd = fd

    def read(self) -> bytes:
        """Whole lines that arrived since the last call (the partial tail is kept)."""
        if self.fd < 0:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                os.lseek(self.fd, self.off + len(self.buf), os.SEEK_SET)
            except FileNotFoundError:
                return b""
        chunks = []
        total = 0
        while total < _READ_CAP:
            data = os.read(self.fd, 1 << 20)
            if not data:
                break
            chunks.append(data)
            total += len(data)
        if not chunks:
            return b""
        buf = self.buf + b"".join(chunks)
        cut = buf.rfind(b"\n") + 1
        self.buf = buf[cut:]
        self.off += cut
        return buf[:cut]

    def rest(self) -> bytes:
        """The final partial line (called once the writer is gone)."""
        rest, self.buf = self.buf, b""
        self.off += len(rest)
        return rest

    def mtime(self) -> int:
        try:
            return os.fstat(self.fd).st_mtime_ns if self.fd >= 0 else 0
        except OSError:
            return 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _ReplicaLogs:
    def __init__(self, app_dir: str, g: int, rep: dict[str, Any]) -> None:
        self.g = g
        self.idx_path = os.path.join(app_dir, f"{INDEX_PREFIX}{g}")
        entries, end = read_index(self.idx_path)
        out_off = err_off = comb_off = 0
        if entries:
            _, out_off, err_off, comb_off = entries[-1]
        comb_path = rep["comb"]
        # resume after a collector that died: drop what it wrote after its last index entry
        self.comb_fd = os.open(comb_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.ftruncate(self.comb_fd, comb_off)
        os.lseek(self.comb_fd, comb_off, os.SEEK_SET)
        self.idx_fd = os.open(self.idx_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.ftruncate(self.idx_fd, end)
        os.lseek(self.idx_fd, end, os.SEEK_SET)
        self.comb_off = comb_off
        self.out = _Stream(rep["out"], out_off)
        self.err = _Stream(rep["err"], err_off)
        self.pending = False
        self.last_index = 0.0
        self.exited = False
        self.finished = False

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.comb_fd, view)
            view = view[n:]
        self.comb_off += len(data)

    def poll(self, now: float, final: bool = False) -> bool:
        """Moves new whole lines into combined.log; True if anything arrived.

        With ``final`` (the replica ended) it drains both files to their end and then adds the
        partial last lines, each on a line of its own.
        """
        moved = self._move(self.out.read(), self.err.read())
        if final:
            while self._move(self.out.read(), self.err.read()):
                pass
            o_rest, e_rest = self.out.rest(), self.err.rest()
            if o_rest and e_rest:
                o_rest += b"\n"
            moved = self._move(o_rest, e_rest) or moved
        if self.pending and (final or now - self.last_index >= _INDEX_EVERY):
            self.write_index(now)
        return moved

    def _move(self, out: bytes, err: bytes) -> bool:
        if not out and not err:
            return False
        # both arrived since the last look: the stream written last goes last
        if out and err and self.err.mtime() < self.out.mtime():
            self._write(err)
            self._write(out)
        else:
            if out:
                self._write(out)
            if err:
                self._write(err)
        self.pending = True
        return True

    def write_index(self, now: float) -> None:
        line = f"{now:.6f} {self.out.off} {self.err.off} {self.comb_off}\n".encode()
        os.write(self.idx_fd, line)
        self.pending = False
        self.last_index = now

    def close(self) -> None:
        self.out.close()
        self.err.close()
        for fd in (self.comb_fd, self.idx_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.comb_fd = self.idx_fd = -1


def acquire_collector_lock(app_dir: str) -> int | None:
    """Takes the app's collector lock; returns its fd, or None if another collector holds it."""
    import fcntl

    try:
        fd = os.open(os.path.join(app_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def collector_alive(app_dir: str) -> bool:
    """True if a collector currently holds the app's lock."""
    fd = acquire_collector_lock(app_dir)
    if fd is None:
        return os.path.exists(os.path.join(app_dir, LOCK))
    os.close(fd)
    return False


def collect(app_dir: str, grace: float = DEFAULT_GRACE, follow: bool = True) -> bool:
    """Runs the collector of one app until every replica ended and its output was consumed.

    With ``follow=False`` it only catches up once (used by a reader that finds the collector
    gone after the app ended). Returns False if another collector holds the lock.
    """
    lock_fd = acquire_collector_lock(app_dir)
    if lock_fd is None and follow:
        # held by a probe (collector_alive) for an instant, or by another collector for good
        deadline = time.monotonic() + 2.0
        while lock_fd is None and time.monotonic() < deadline:
            time.sleep(0.01)
            lock_fd = acquire_collector_lock(app_dir)
    if lock_fd is None:
        return False
    try:
        if os.path.exists(os.path.join(app_dir, LOGS_DONE)):
            return True
        summary = load_summary(app_dir)
        if summary is None:
            return True
        _collect(app_dir, summary, grace, follow)
        return True
    finally:
        os.close(lock_fd)


_OBSERVE_EVERY = 0.25
_REAP_BATCH = 0.25  # seconds a replica that ended waits for others before the leftover scan


def _collect(app_dir: str, summary: dict[str, Any], grace: float, follow: bool) -> None:
    import select

    replicas = summary["replicas"]
    leaders = replica_leaders(summary)
    logs = [_ReplicaLogs(app_dir, g, r) for g, r in enumerate(replicas)]
    pidfds = open_pidfds(leaders) if follow else None
    poller = select.poll()
    for fd in pidfds or ():
        poller.register(fd, select.POLLIN)
    tick = _TICK_MIN
    last_observe = 0.0
    wake = True
    ending: list[_ReplicaLogs] = []  # ended, not yet drained
    first_end = 0.0
    try:
        while True:
            now = time.time()
            active = False
            for rl in logs:
                if not rl.finished and rl.poll(now):
                    active = True
            if wake or pidfds is None or now - last_observe >= _OBSERVE_EVERY:
                wake = False
                last_observe = now
                obs = observe(app_dir, summary)
                if obs is None:  # app removed
                    return
                if obs.done is not None:
                    ended = set(range(len(logs)))
                else:
                    enforce(app_dir, summary, obs, grace)
                    ended = {g for g, c in enumerate(obs.codes) if c is not None}
                newly = [rl for rl in logs if rl.g in ended and not rl.exited]
                for rl in newly:
                    rl.exited = True
                    if not ending:
                        first_end = now
                    ending.append(rl)
            if ending and (
                all(rl.exited for rl in logs) or now - first_end >= _REAP_BATCH or not follow
            ):
                # whatever the ended replicas left running goes too (one look at every process
                # for the replicas that ended about together), then their logs are drained
                reap_replicas(
                    summary["app_id"],
                    [rl.g for rl in ending],
                    grace,
                    min((leaders[rl.g][0] for rl in ending), default=0),
                )
                for rl in ending:
                    rl.poll(time.time(), final=True)
                    rl.finished = True
                    rl.close()
                ending = []
                if all(rl.finished for rl in logs):
                    create_exclusive(os.path.join(app_dir, LOGS_DONE), f"{time.time()}\n")
                    return
            if not follow:
                # catching up for a reader: the replicas still run (their collector died)
                return
            tick = _TICK_MIN if active else min(tick * 2, _TICK_MAX)
            if pidfds:
                for fd, _ in poller.poll(tick * 1000):
                    # a replica ended: look at once (its exit code is already recorded)
                    wake = True
                    poller.unregister(fd)
                    os.close(fd)
                    pidfds.pop(fd, None)
            else:
                time.sleep(tick)
    finally:
        for fd in pidfds or ():
            os.close(fd)
        for rl in logs:
            rl.close()


def _raise_fd_limit() -> None:
    """A collector holds a few fds per replica: allow as many as the hard limit does."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _main(argv: Sequence[str]) -> int:
    if len(argv) >= 2 and argv[0] == "collect":
        # keep running when the terminal or the submitter is interrupted
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _raise_fd_limit()
        grace = float(argv[2]) if len(argv) > 2 else DEFAULT_GRACE
        try:
            collect(argv[1], grace)
        except Exception as e:  # a collector crash must not look like an app failure
            sys.stderr.write(f"shipyard collector {argv[1]}: {e!r}\n")
            return 1
        return 0
    sys.stderr.write("usage: _local_runtime.py collect APP_DIR [GRACE]\n")
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
