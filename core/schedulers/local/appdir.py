"""The state of local apps on disk: where it lives (:func:`apps_root`), one app's directory
(:class:`AppDir`, the only code that reads or writes it) and idempotency-key claims
(:class:`KeyClaims`).

Layout of one app's directory (``<state root>/local/<app_id>/``, mode 0700)::

    app.json          the AppRecord, created once before any replica's command may run
    exits             "<index> <code>" lines, appended by the replicas' wrappers (or by whoever
                      saw a wrapper killed)
    cancelled         marker: a cancel was requested
    gang              marker: a replica failed and the others were told to terminate (JSON)
    done              the FinalState, written by whoever first sees the app end
    collector.lock    flock'ed by the live log collector
    collector.log     what a collector process had to say (errors only)
    idx.<index>       the time index of one replica's logs
    logs_done         the collector consumed every byte of every replica's output
    usage             "<index> <json>" lines: what a replica used (wait4 rusage, recorded by
                      the process that reaped its wrapper)
    times.<index>     what a replica's command used, written by its wrapper as it ends (the
                      shell's ``times``; for the replicas no ``usage`` line comes for)
    result.<role>.<k>.json   what replica k of role wrote to $SHIPYARD_RESULT_FILE
    <role>.<k>.{stdout,stderr,combined}.log   logs (unless cfg log_dir puts them elsewhere)

A state root or app directory that another user owns, or that others can write, is refused:
a swapped directory must never make ``cancel`` signal processes it names.

Standard library only: the log collector process imports this module too.
"""

from __future__ import annotations

import fcntl
import functools
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import ShipyardError
from core.paths import state_root
from core.schedulers.local.records import LOST, AppRecord, ExitCode, FinalState

__all__ = ["AppDir", "KeyClaims", "UnsafeStateError", "apps_root"]


class UnsafeStateError(ShipyardError, ValueError):
    """A state directory that another user owns or others can write."""


def apps_root() -> str:
    """The directory holding one directory per local app."""
    return _apps_root(state_root())


@functools.lru_cache(maxsize=16)
def _apps_root(root: str) -> str:
    return os.path.join(root, "local")


def check_private(path: str, what: str, st: os.stat_result | None = None) -> None:
    """Raises :class:`UnsafeStateError` if ``path`` is not owned by this user or others can
    write it (mode bits ``g+w``/``o+w``)."""
    if st is None:
        st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise UnsafeStateError(
            f"{what} {path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}):"
            " refusing to use it"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStateError(
            f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}):"
            " refusing to use it"
        )


def ensure_apps_root() -> str:
    """The apps root, created (mode 0700) if needed and checked to be this user's alone.

    Raises:
        ValueError: it cannot be created, or it is not private (naming it).
    """
    root = apps_root()
    try:
        st = os.stat(root)
    except FileNotFoundError:
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            st = os.stat(root)
        except OSError as e:
            raise ValueError(f"state directory: cannot create {root}: {e.strerror or e}") from e
    check_private(root, "state directory", st)
    return root


class AppDir:
    """One app's directory. Every read and write of an app's state goes through here."""

    RECORD = "app.json"
    EXITS = "exits"
    CANCELLED = "cancelled"
    GANG = "gang"
    #: the app reached its time limit (its replicas were ended), and was sent its checkpoint
    #: signal before (see :mod:`core.limits`)
    TIMEOUT = "timeout"
    CHECKPOINT = "checkpoint_signal"
    #: ``attempts.<g>``: the attempts replica ``g``'s limit script started again (see
    #: :func:`core.limits.limit_command`)
    ATTEMPTS = "attempts"
    DONE = "done"
    LOGS_DONE = "logs_done"
    LOCK = "collector.lock"
    #: a FIFO the collector sleeps on: a reader or a cancel writes to it to wake it at once
    WAKE = "collector.wake"
    COLLECTOR_LOG = "collector.log"
    INDEX_PREFIX = "idx."
    #: the per-replica files (the logs, unless ``log_dir`` puts them elsewhere, and the time
    #: indexes): kept out of the app's own directory, whose every look lists it
    LOGS = "logs"
    USAGE = "usage"
    TIMES_PREFIX = "times."

    def __init__(self, root: str, app_id: str) -> None:
        self.app_id = app_id
        self.path = os.path.join(root, app_id)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def index_file(self, g: int) -> str:
        return os.path.join(self.logs_dir, f"{self.INDEX_PREFIX}{g}")

    # -- the directory --------------------------------------------------------------------

    def create(self) -> None:
        """Makes the directory (mode 0700), its ``checkpoint`` directory
        (``$SHIPYARD_CHECKPOINT_DIR``) and its ``logs`` directory. FileExistsError if the app
        id is taken."""
        os.mkdir(self.path, 0o700)
        os.mkdir(self.checkpoint_dir, 0o700)
        os.mkdir(self.logs_dir, 0o700)

    @property
    def logs_dir(self) -> str:
        """Where the replicas' logs go by default, and where the time indexes are."""
        return self.file(self.LOGS)

    @property
    def checkpoint_dir(self) -> str:
        """The app's checkpoint directory (``$SHIPYARD_CHECKPOINT_DIR``), kept with the app."""
        return self.file("checkpoint")

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def check_private(self) -> None:
        """Refuses (:class:`UnsafeStateError`) a directory swapped for one of another user's or
        made writable by others, before anything acts on what it says."""
        st = os.lstat(self.path)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeStateError(f"app directory {self.path} is not a directory")
        check_private(self.path, "app directory", st)

    def names(self) -> set[str] | None:
        """The files in the directory; None if it is gone."""
        try:
            return set(os.listdir(self.path))
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        import shutil  # (lazily: start-up)

        shutil.rmtree(self.path, ignore_errors=True)

    def remove_ended(self) -> bool:
        """Removes a finished app's state (and its key claim); False if its collector still
        runs."""
        if self.LOGS_DONE not in (self.names() or set()) and self.collector_alive():
            return False
        record = self.read_record()
        self.remove()
        if record is not None and record.key:
            KeyClaims(os.path.dirname(self.path)).release(record.key, self.app_id)
        return True

    # -- the record -------------------------------------------------------------------------

    def write_record(self, record: AppRecord) -> bool:
        """Creates ``app.json`` (one exclusive create: readers take a half-written file for a
        missing one); False if it exists."""
        return _create_exclusive(self.file(self.RECORD), record.to_json())

    def read_record(self) -> AppRecord | None:
        text = _read_text(self.file(self.RECORD))
        return None if text is None else AppRecord.from_json(text)

    def has_record(self) -> bool:
        return os.path.exists(self.file(self.RECORD))

    def record_mtime(self) -> float | None:
        try:
            return os.stat(self.file(self.RECORD)).st_mtime
        except FileNotFoundError:
            return None

    # -- exit codes -------------------------------------------------------------------------

    def exits(self) -> dict[int, ExitCode]:
        """The recorded exit codes by replica index (the first record of a replica wins)."""
        text = _read_text(self.file(self.EXITS))
        codes: dict[int, ExitCode] = {}
        for line in (text or "").split("\n"):
            g, _, value = line.partition(" ")
            if not value or not g.isdigit() or int(g) in codes:
                continue  # (a partial last line is not complete yet)
            code = parse_exit(value)
            if code is not None:
                codes[int(g)] = code
        return codes

    def record_exit(self, g: int, value: int | str) -> None:
        """Records an exit code for replica ``g`` unless its wrapper already did (one
        ``write`` of one line in append mode, as the wrappers write theirs)."""
        if g in self.exits():
            return
        try:
            fd = os.open(
                self.file(self.EXITS), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except FileNotFoundError:  # the app was removed meanwhile
            return
        try:
            os.write(fd, f"{g} {value}\n".encode())
        except OSError as e:  # (a full disk): the replica then shows no exit code
            import logging

            logging.getLogger(__name__).warning(
                "could not record exit code %s of replica %d in %s: %s", value, g, self.path, e
            )
        finally:
            os.close(fd)

    # -- results and usage ------------------------------------------------------------------

    def result_file(self, role: str, k: int) -> str:
        """Where replica ``k`` of ``role`` writes its result (``$SHIPYARD_RESULT_FILE``)."""
        return self.file(f"result.{role}.{k}.json")

    def record_usage(self, g: int, text: str) -> None:
        """Appends what replica ``g`` used (one line of JSON, one ``write``)."""
        try:
            fd = os.open(
                self.file(self.USAGE), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except FileNotFoundError:  # the app was removed meanwhile
            return
        try:
            os.write(fd, f"{g} {text}\n".encode())
        except OSError:
            pass  # (a full disk): the replica then shows no usage
        finally:
            os.close(fd)

    def usages(self) -> dict[int, str]:
        """The recorded usage lines by replica index (the first of a replica wins)."""
        out: dict[int, str] = {}
        for line in (_read_text(self.file(self.USAGE)) or "").split("\n"):
            g, _, text = line.partition(" ")
            if text and g.isdigit():
                out.setdefault(int(g), text)
        return out

    def wrapper_times(self, g: int) -> tuple[float, float] | None:
        """What replica ``g``'s wrapper recorded as it ended (``times.<g>``): its command's CPU
        seconds (to the shell's 10 ms) and its end (the file's time). None if there is no such
        file, or not a whole one yet."""
        try:
            with open(self.file(f"{self.TIMES_PREFIX}{g}"), "rb") as f:
                text = f.read().decode("ascii", errors="replace")
                end = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        lines = text.split("\n")
        cpu = _cpu_seconds(lines[1]) if len(lines) == 3 and not lines[2] else None
        return None if cpu is None else (cpu, end)

    # -- markers and the final state ------------------------------------------------------

    def mark(self, name: str, text: str) -> bool:
        """Creates marker ``name``; False if it was there (only the first marker counts)."""
        return _create_exclusive(self.file(name), text)

    def read(self, name: str) -> str | None:
        return _read_text(self.file(name))

    def age(self, name: str) -> float:
        """Seconds since marker ``name`` was made (0 if there is none)."""
        try:
            return time.time() - os.stat(self.file(name)).st_mtime
        except FileNotFoundError:
            return 0.0

    def mtime(self, name: str) -> float | None:
        try:
            return os.stat(self.file(name)).st_mtime
        except FileNotFoundError:
            return None

    def read_final(self) -> FinalState | None:
        text = _read_text(self.file(self.DONE))
        return None if not text else FinalState.from_json(text)

    def write_final(self, final: FinalState) -> FinalState:
        """Records ``final`` unless another observer recorded a final state first; returns the
        one on record (it never changes once written)."""
        path = self.file(self.DONE)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, final.to_json().encode())
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # (whole, and only if there is none)
        except FileExistsError:
            return self.read_final() or final
        finally:
            os.unlink(tmp)
        return final

    # -- the log collector's lock -----------------------------------------------------------

    def lock_collector(self) -> int | None:
        """Takes the collector lock; its fd, or None if another collector holds it."""
        try:
            fd = os.open(self.file(self.LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def open_wake(self) -> int:
        """The collector's end of its wake FIFO (made if missing), or -1 if it cannot be made.
        Opened for writing too, so that it never reads as closed between two wakers."""
        path = self.file(self.WAKE)
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        except OSError:
            return -1
        try:
            return os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return -1

    def wake_collector(self) -> None:
        """Wakes the app's collector if one sleeps on its FIFO (else nothing: no collector runs,
        or it does not sleep long)."""
        try:
            fd = os.open(self.file(self.WAKE), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # (ENOENT: no FIFO; ENXIO: no collector has it open)
            return
        try:
            os.write(fd, b"w")
        except BlockingIOError:
            pass  # (full: it has plenty of wakes waiting)
        finally:
            os.close(fd)

    def collector_alive(self) -> bool:
        """True if a collector holds the lock now."""
        fd = self.lock_collector()
        if fd is None:
            return os.path.exists(self.file(self.LOCK))
        os.close(fd)
        return False


def _cpu_seconds(line: str) -> float | None:
    """The sum of the two times of a line of the shell's ``times`` ("0m1.250000s 0m0.030000s"
    in dash, "0m1.250s 0m0.030s" in bash); None if it is not one."""
    words = line.split()
    try:
        pairs = [w.removesuffix("s").split("m") for w in words if w.endswith("s")]
        total = sum(int(m) * 60 + float(sec) for m, sec in pairs)
    except ValueError:
        return None
    return round(total, 6) if len(pairs) == len(words) == 2 else None


def parse_exit(text: str) -> ExitCode:
    """A recorded exit code: None (not complete), :data:`LOST`, or a code. The wrapper records
    ``$?`` of ``/bin/sh``: ``128+N`` means "killed by signal N" and is reported as ``-N``; a
    negative value is already a signal (written by whoever reaped the wrapper)."""
    s = text.strip()
    if not s:
        return None
    if s == LOST:
        return LOST
    try:
        code = int(s)
    except ValueError:
        return LOST
    return -(code - 128) if 128 < code <= 128 + 64 else code


class KeyClaims:
    """Idempotency keys claimed by local apps: one file per key under ``<apps root>/.keys``,
    created exclusively before anything of the app starts, naming the app and its submitter.

    A claim is *valid* once its app's record exists; a claim whose app has no record and whose
    submitter is gone (killed mid-submit) is *stale*: the next submitter with that key takes it
    over. A claim whose submitter is still submitting is waited for.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.dir = os.path.join(root, ".keys")

    def _path(self, key: str) -> str:
        import hashlib  # (only here: OpenSSL takes ~3 ms to load)

        return os.path.join(self.dir, hashlib.sha256(key.encode()).hexdigest()[:40])

    def claim(self, key: str, app_id: str, submitter: str, timeout: float = 30.0) -> str | None:
        """Claims ``key`` for ``app_id`` (``submitter``: this process's identity, see
        :func:`processes.identity`). None if this call claimed it, else the id of the app that
        holds it."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        path = self._path(key)
        deadline = time.monotonic() + timeout
        while True:
            if _create_exclusive(path, f"{app_id} {submitter}\n"):
                return None
            text = _read_text(path)
            if text is None:
                continue  # removed in between: try again
            holder, _, who = text.strip().partition(" ")
            if AppDir(self.root, holder).has_record():
                return holder
            if not _submitter_alive(who):
                self._drop_stale(path, text)
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"idempotency key {key!r}: app {holder} is still being submitted"
                )
            time.sleep(0.005)

    def _drop_stale(self, path: str, text: str) -> None:
        with self._lock():
            if _read_text(path) == text:  # (nobody took it over meanwhile)
                os.unlink(path)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.dir, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def holder(self, key: str) -> str | None:
        """The app holding ``key`` (only a valid claim counts)."""
        text = _read_text(self._path(key))
        if not text:
            return None
        holder = text.split(" ", 1)[0].strip()
        return holder if AppDir(self.root, holder).has_record() else None

    def release(self, key: str, app_id: str) -> None:
        """Drops the claim of ``key`` if ``app_id`` holds it."""
        path = self._path(key)
        text = _read_text(path)
        if text is not None and text.split(" ", 1)[0] == app_id:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _submitter_alive(who: str) -> bool:
    from core.schedulers.local.processes import Identity

    ident = Identity.parse(who)
    return ident is None or ident.alive()  # (unreadable: assume alive, never steal)


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    # (os calls, not open(): every describe reads the exit codes; bench row "local status of
    # 8 running replicas, submitting process")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _create_exclusive(path: str, data: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, data.encode())
    except BaseException:
        os.close(fd)
        os.unlink(path)  # (never leave half a file where readers take it for whole)
        raise
    os.close(fd)
    return True
