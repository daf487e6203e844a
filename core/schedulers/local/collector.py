"""The log collector of one local app: it tails each replica's stdout and stderr files, writes
``<role>.<k>.combined.log`` (whole lines of both, in the order it saw them arrive) and a time
index (``idx.<g>``: "time stdout_offset stderr_offset combined_offset" lines) that
``log_iter``'s ``since``/``until`` use, ends what a replica left running once it ended, and
settles the app (see :mod:`.supervise`) while it watches it.

Replicas write their stdout and stderr straight into their files (no byte is lost, whoever
dies); the collector only derives. It runs as a process of its own for an app that outlives
submit by more than a few milliseconds (``python -m core.schedulers.local.collector APP_DIR``),
holding the app's ``collector.lock``; a reader finishes the work of a collector that is gone.
A collector that cannot write (a full disk) records why in ``collector.error`` (if it can) and
stops: readers then fall back to the stdout and stderr files.

Standard library only (its process imports no more than this package's runtime modules).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time
from collections.abc import Sequence

from core.errors import ShipyardError
from core.schedulers.local.appdir import AppDir
from core.schedulers.local.processes import DEFAULT_GRACE, end_leftovers
from core.schedulers.local.records import AppRecord, ReplicaRecord
from core.schedulers.local.supervise import identities, next_due, observe, settle

__all__ = ["ERROR_FILE", "LogDirFullError", "collect", "read_index"]

_READ_CAP = 4 << 20
_INDEX_EVERY = 0.02
_TICK_MIN = 0.002
# An idle app's collector that sleeps on its replicas' pidfds and its wake FIFO wakes every
# _IDLE_MAX seconds: a reader wakes it (AppDir.wake_collector) at most every _TICK_MAX while it
# waits for lines, a cancel at once, and it wakes itself when a grace or a time limit is due.
# The cost of an idle collector is its wakes (about 0.23 ms each on the 2-core rig, most of it
# the process switch): 100 idle apps took 9% of a core at 4 wakes a second.
_TICK_MAX = 0.25
_IDLE_MAX = 2.0
_OBSERVE_EVERY = 0.25  # (without pidfds: ends are seen by looking)
_REAP_BATCH = 0.25  # seconds a replica that ended waits for others before the leftover scan
ERROR_FILE = "collector.error"


def read_index(path: str, offset: int = 0) -> tuple[list[tuple[float, int, int, int]], int]:
    """Complete entries of an index file from byte ``offset``, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    cut = data.rfind(b"\n") + 1
    entries = []
    for line in data[:cut].split(b"\n")[:-1]:
        parts = line.split()
        if len(parts) == 4:
            try:
                entries.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])))
            except ValueError:
                continue
    return entries, offset + cut


class _Stream:
    """One of a replica's output files, read in whole lines from where the index says."""

    def __init__(self, path: str, off: int) -> None:
        self.path = path
        self.off = off  # end of the whole lines consumed so far
        self.buf = b""  # bytes read after ``off`` that do not end a line yet
        self.fd = -1

    def read(self) -> bytes:
        """Whole lines that arrived since the last call (the partial tail is kept)."""
        if self.fd < 0:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return b""
            os.lseek(self.fd, self.off + len(self.buf), os.SEEK_SET)
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
        """The final partial line (once the writer is gone)."""
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
    """Moves one replica's new lines into its combined log and indexes them."""

    def __init__(self, app: AppDir, rep: ReplicaRecord) -> None:
        self.g = rep.index
        self.idx_path = app.index_file(rep.index)
        entries, end = read_index(self.idx_path)
        out_off = err_off = comb_off = 0
        if entries:
            _, out_off, err_off, comb_off = entries[-1]
        # resume after a collector that died: drop what it wrote after its last index entry
        self.comb_fd = os.open(rep.combined, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.ftruncate(self.comb_fd, comb_off)
        os.lseek(self.comb_fd, comb_off, os.SEEK_SET)
        self.idx_fd = os.open(self.idx_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.ftruncate(self.idx_fd, end)
        os.lseek(self.idx_fd, end, os.SEEK_SET)
        self.comb_off = comb_off
        self.out = _Stream(rep.stdout, out_off)
        self.err = _Stream(rep.stderr, err_off)
        self.pending = False
        self.last_index = 0.0
        self.exited = False
        self.finished = False

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.comb_fd, view) :]
        self.comb_off += len(data)

    def poll(self, now: float, final: bool = False) -> bool:
        """Moves new whole lines into the combined log; True if anything arrived. With
        ``final`` (the replica ended) it drains both files and adds their partial last
        lines, each on a line of its own."""
        moved = self._move(self.out.read(), self.err.read())
        if final:
            while self._move(self.out.read(), self.err.read()):
                pass
            o_rest, e_rest = self.out.rest(), self.err.rest()
            if o_rest and e_rest:
                o_rest += b"\n"
            moved = self._move(o_rest, e_rest) or moved
        if self.pending and (final or now - self.last_index >= _INDEX_EVERY):
            line = f"{now:.6f} {self.out.off} {self.err.off} {self.comb_off}\n".encode()
            os.write(self.idx_fd, line)
            self.pending = False
            self.last_index = now
        return moved

    def _move(self, out: bytes, err: bytes) -> bool:
        if not out and not err:
            return False
        # both arrived since the last look: the stream written last goes last
        first, second = (
            (err, out) if out and err and self.err.mtime() < self.out.mtime() else (out, err)
        )
        for data in (first, second):
            if data:
                self._write(data)
        self.pending = True
        return True

    def close(self) -> None:
        self.out.close()
        self.err.close()
        for fd in (self.comb_fd, self.idx_fd):
            if fd >= 0:
                os.close(fd)
        self.comb_fd = self.idx_fd = -1


def collect(app_dir: str, grace: float = DEFAULT_GRACE, follow: bool = True) -> bool:
    """Collects one app's logs until every replica ended and its output was consumed. With
    ``follow=False`` it catches up once (a reader finishing the work of a collector that is
    gone). False if another collector holds the lock. A full disk is recorded, not raised."""
    root, app_id = os.path.split(app_dir.rstrip("/"))
    app = AppDir(root, app_id)
    lock = app.lock_collector()
    if lock is None and follow:
        # held by a probe (collector_alive) for an instant, or by another collector for good
        deadline = time.monotonic() + 2.0
        while lock is None and time.monotonic() < deadline:
            time.sleep(0.01)
            lock = app.lock_collector()
    if lock is None:
        return False
    try:
        names = app.names() or set()
        record = app.read_record()
        if AppDir.LOGS_DONE in names or ERROR_FILE in names or record is None:
            return True
        try:
            _collect(app, record, grace, follow)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
                raise
            raise _record_error(app, record, e) from e
        return True
    finally:
        os.close(lock)


class LogDirFullError(ShipyardError, OSError):
    """The collector could not write the combined log or its index (a full disk, a read-only
    file system); the message names the log directory in one line."""


def _record_error(app: AppDir, record: AppRecord, e: OSError) -> LogDirFullError:
    where = os.path.dirname(record.replicas[0].combined) if record.replicas else app.path
    message = f"log directory {where}: cannot be written ({e.strerror}); combined logs stop there"
    try:
        app.mark(ERROR_FILE, message + "\n")
    except OSError:
        pass  # the state directory is on the full disk too: readers get the exception
    return LogDirFullError(e.errno, message)


def _collect(app: AppDir, record: AppRecord, grace: float, follow: bool) -> None:
    logs = [_ReplicaLogs(app, rep) for rep in record.replicas]
    idents = identities(record)
    pidfds = {}
    if follow:
        for g, ident in idents.items():
            fd = ident.pidfd()
            if fd is not None:
                pidfds[fd] = g
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    watched = set(pidfds.values())  # the replicas whose end wakes this collector
    wake_fd = app.open_wake() if pidfds else -1
    if wake_fd >= 0:
        poller.register(wake_fd, select.POLLIN)
    tick = _TICK_MIN
    next_observe = 0.0
    wake = True
    ending: list[_ReplicaLogs] = []  # ended, not yet drained
    first_end = 0.0
    try:
        while True:
            now = time.time()
            active = any([not rl.finished and rl.poll(now) for rl in logs])
            if wake or not pidfds or now >= next_observe:
                wake = False
                obs = observe(app, record)
                if obs is None:  # the app was removed
                    return
                if obs.done is None and follow:
                    settle(app, record, obs, grace)
                if wake_fd >= 0 and obs.done is None and watched.issuperset(obs.running):
                    next_observe = now + min(_IDLE_MAX, next_due(app, record, obs, grace))
                else:  # (an end that no pidfd announces is seen by looking)
                    next_observe = now + _OBSERVE_EVERY
                ended = (
                    set(range(len(logs)))
                    if obs.done
                    else {g for g, c in enumerate(obs.codes) if c is not None}
                )
                for rl in logs:
                    if rl.g in ended and not rl.exited:
                        rl.exited = True
                        first_end = first_end if ending else now
                        ending.append(rl)
            if ending and (
                all(rl.exited for rl in logs) or now - first_end >= _REAP_BATCH or not follow
            ):
                _finish(record, ending, grace)
                ending = []
                if all(rl.finished for rl in logs):
                    app.mark(AppDir.LOGS_DONE, f"{time.time()}\n")
                    return
            if not follow:
                return  # caught up for a reader: the replicas still run
            sleepy = wake_fd >= 0 and pidfds  # (else ends are seen by looking)
            tick = _TICK_MIN if active else min(tick * 2, _IDLE_MAX if sleepy else _TICK_MAX)
            timeout = min(tick, max(0.0, next_observe - time.time()))
            for fd, _ in poller.poll(timeout * 1000) if pidfds else ():
                wake = True  # a replica ended, or a reader or a cancel woke it: look at once
                if fd == wake_fd:
                    _drain(wake_fd)
                    tick = min(tick, _TICK_MAX)
                    continue
                poller.unregister(fd)
                os.close(fd)
                pidfds.pop(fd, None)
            if not pidfds and follow:
                time.sleep(tick)
    finally:
        for fd in [*pidfds, wake_fd] if wake_fd >= 0 else pidfds:
            os.close(fd)
        for rl in logs:
            rl.close()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _finish(record: AppRecord, ending: list[_ReplicaLogs], grace: float) -> None:
    """Ends what the replicas that ended (about together) left running, with one look at every
    process, then drains their logs."""
    since = min((record.replicas[rl.g].pid for rl in ending), default=0)
    end_leftovers(record.app_id, [rl.g for rl in ending], grace, since)
    for rl in ending:
        rl.poll(time.time(), final=True)
        rl.finished = True
        rl.close()


def _raise_fd_limit() -> None:
    """A collector holds a few fds per replica: allow as many as the hard limit does."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv: Sequence[str]) -> int:
    """``collector APP_DIR [GRACE]``: the collector process of one app."""
    if not argv:
        sys.stderr.write("usage: python -m core.schedulers.local.collector APP_DIR [GRACE]\n")
        return 2
    # keep running when the terminal or the submitter is interrupted
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _raise_fd_limit()
    grace = float(argv[1]) if len(argv) > 1 else DEFAULT_GRACE
    try:
        collect(argv[0], grace)
    except LogDirFullError as e:
        sys.stderr.write(f"shipyard collector: {e.strerror}\n")
        return 1
    except Exception as e:  # a collector crash must not look like an app failure
        sys.stderr.write(f"shipyard collector {argv[0]}: {e!r}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
