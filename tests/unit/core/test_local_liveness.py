"""The local scheduler's pidfd liveness (core.schedulers.local.liveness) on real processes: it
agrees with /proc on every look, tells a process that ended (or was never the recorded one),
and closes what it opened."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from core.schedulers.local.liveness import Liveness
from core.schedulers.local.processes import Identity
from core.schedulers.local.records import AppRecord, ReplicaRecord


def _record(procs: list[subprocess.Popen[bytes]], app_id: str = "a-1") -> AppRecord:
    reps = []
    for g, p in enumerate(procs):
        ident = Identity.of(p.pid)
        assert ident is not None
        reps.append(ReplicaRecord(g, "w", g, p.pid, ident.start_ticks, 0.0, "", "", ""))
    return AppRecord(app_id, "a", "local_cwd", "s", 0.0, "/tmp", [], reps)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_first_look_reads_proc_then_pidfds_follow_each_end(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    live, record = Liveness(), _record(sleepers)
    assert live.checker("a-1", record) is None  # a first look: /proc
    alive = live.checker("a-1", record)
    assert alive is not None
    assert alive([0, 1, 2]) == [True, True, True]
    sleepers[1].kill()
    sleepers[1].wait()  # (reaped: gone)
    sleepers[2].kill()  # a zombie until reaped: ended all the same
    os.waitid(os.P_PID, sleepers[2].pid, os.WEXITED | os.WNOWAIT)  # (dead, not reaped)
    assert alive([0, 1, 2]) == [True, False, False]
    assert alive([2, 0]) == [False, True]
    live.close()


def test_a_reused_pid_is_not_the_recorded_process(sleepers: list[subprocess.Popen[bytes]]) -> None:
    record = _record(sleepers)
    record.replicas[0].start_ticks -= 1  # another process than the one this pid runs now
    live = Liveness()
    live.checker("a-1", record)
    alive = live.checker("a-1", record)
    assert alive is not None and alive([0, 1]) == [False, True]
    live.close()


def test_forget_evict_and_close_release_every_pidfd(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    before = _open_fds()
    live = Liveness(max_fds=6)  # two apps of three replicas
    for app_id in ("a-1", "a-2", "a-3"):
        live.checker(app_id, _record(sleepers, app_id))
        live.checker(app_id, _record(sleepers, app_id))
    assert _open_fds() == before + 2 * 3  # a-1 evicted: two apps of three replicas
    live.forget("a-2")
    assert _open_fds() == before + 3
    handed_out = live.checker("a-3", _record(sleepers, "a-3"))
    live.close()
    assert _open_fds() == before
    assert handed_out is not None and handed_out([0]) == [True]  # (closed: /proc answers)


def test_threads_looking_at_once_share_one_set_of_pidfds(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    before = _open_fds()
    live, record = Liveness(), _record(sleepers)
    live.checker("a-1", record)
    answers: list[list[bool]] = []

    def look() -> None:
        for _ in range(200):
            alive = live.checker("a-1", record)
            assert alive is not None
            answers.append(alive([0, 1, 2]))

    threads = [threading.Thread(target=look) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [[True, True, True]] * 800
    assert _open_fds() == before + 3
    live.close()
