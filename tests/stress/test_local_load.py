"""Local scheduler under load: hundreds of apps submitted at once from 16 threads of this process
and 4 other processes. Every app is tracked, every exit code and every log line is right, no
state file is corrupted and ``list`` agrees with ``describe`` afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from core.runner import get_runner
from core.schedulers.api import Stream
from core.specs import AppState, AppStatus, is_terminal, parse_app_handle
from tests.helpers import ROOT
from tests.stress import local_load as L
from tests.stress.conftest import scaled

N_APPS = scaled(500)
THREADS = 16
PROCESSES = 4


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of this test's own, so ``list`` sees exactly its apps."""
    d = tmp_path / "state"
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(d))
    return d


class Pollers:
    """8 threads that describe every known app until it is terminal, from the moment it is
    submitted (as an Airflow sensor or a Prefect wait would), each with its own runner."""

    def __init__(self, n: int = 8) -> None:
        self.handles: dict[int, str] = {}
        self.final: dict[int, AppStatus] = {}
        self.lost: dict[int, str] = {}
        self.polls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t, n)) for t in range(n)]
        for t in self._threads:
            t.start()

    def add(self, i: int, handle: str) -> None:
        with self._lock:
            self.handles[i] = handle

    def _run(self, t: int, n: int) -> None:
        with get_runner() as runner:
            while True:
                with self._lock:
                    mine = [
                        (i, h)
                        for i, h in self.handles.items()
                        if i % n == t and i not in self.final and i not in self.lost
                    ]
                if not mine and self._stop.is_set():
                    return
                for i, h in mine:
                    st = runner.status(h)
                    with self._lock:
                        self.polls += 1
                        if st is None:
                            self.lost[i] = h
                        elif is_terminal(st.state):
                            self.final[i] = st
                time.sleep(0.2)

    def join(self, timeout: float) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "apps not terminal in time"


def _submit_concurrently(tmp_path: Path, pollers: Pollers) -> dict[int, str]:
    share = [list(range(p, N_APPS, PROCESSES + 1)) for p in range(PROCESSES + 1)]
    mine, theirs = share[0], share[1:]
    go = tmp_path / "go"
    procs = []
    for p, indices in enumerate(theirs):
        out = tmp_path / f"handles.{p}.json"
        procs.append(
            (
                out,
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.stress.local_load",
                        str(go),
                        str(out),
                        ",".join(map(str, indices)),
                    ],
                    cwd=ROOT,
                    env=os.environ.copy(),
                    stderr=subprocess.PIPE,
                    text=True,
                ),  # fmt: skip
            )
        )
    go.touch()
    handles = L.submit_all(mine, threads=THREADS, on_submit=pollers.add)
    for out, proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        theirs_handles = {int(i): h for i, h in json.loads(out.read_text()).items()}
        for i, h in theirs_handles.items():
            pollers.add(i, h)
        handles.update(theirs_handles)
    return handles


def test_local_load_many_apps_from_threads_and_processes(state_dir: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    pollers = Pollers()
    try:
        handles = _submit_concurrently(tmp_path, pollers)
    finally:
        pollers.join(timeout=600)
    submitted = time.monotonic() - t0
    assert sorted(handles) == list(range(N_APPS))
    assert len(set(handles.values())) == N_APPS, "two submits got the same handle"
    assert not pollers.lost, (
        f"{len(pollers.lost)} apps disappeared while being polled, e.g."
        f" {sorted(pollers.lost.items())[:5]}"
    )
    final = pollers.final
    assert sorted(final) == list(range(N_APPS))

    # every state and exit code is right
    wrong = []
    for i, st in final.items():
        want_state = AppState.SUCCEEDED if L.exit_code(i) == 0 else AppState.FAILED
        want_codes = {"r": [L.exit_code(i)] * L.num_replicas(i)}
        if st.state != want_state or st.exit_codes() != want_codes:
            wrong.append((i, st.state, st.exit_codes()))
    assert not wrong, wrong[:10]

    # every app is still tracked once all ended (nothing evicted its state or its logs)
    with get_runner() as runner:
        gone = [(i, h) for i, h in sorted(handles.items()) if runner.status(h) is None]
    assert not gone, f"{len(gone)} finished apps are no longer known, e.g. {gone[:5]}"

    # every log is complete, line for line, from a fresh runner
    bad_logs = []
    with get_runner() as runner:
        for i, h in handles.items():
            for k in range(L.num_replicas(i)):
                n_out, n_err = L.out_lines(i, k), L.err_lines(i, k)
                out = list(runner.log_lines(h, "r", k, streams=Stream.STDOUT))
                err = list(runner.log_lines(h, "r", k, streams=Stream.STDERR))
                comb = list(runner.log_lines(h, "r", k))
                if out != [f"{j}\n" for j in range(1, n_out + 1)]:
                    bad_logs.append((i, k, "stdout", len(out), n_out))
                if err != [f"{j}\n" for j in range(1, n_err + 1)]:
                    bad_logs.append((i, k, "stderr", len(err), n_err))
                if Counter(comb) != Counter(out) + Counter(err):
                    bad_logs.append((i, k, "combined", len(comb), n_out + n_err))
    assert not bad_logs, f"{len(bad_logs)} incomplete logs, e.g. {bad_logs[:10]}"

    # no state file is corrupted
    apps_root = state_dir / "local"
    for h in handles.values():
        app_dir = apps_root / parse_app_handle(h).app_id
        summary = json.loads((app_dir / "app.json").read_text())
        assert summary["app_id"] == app_dir.name
        json.loads((app_dir / "done").read_text())
    assert not list(apps_root.rglob("*.tmp")), "left-over temporary state files"

    # list agrees with describe, from a fresh runner
    with get_runner() as runner:
        listed = {a.app_id: a.state for a in runner.list("local_cwd")}
    want = {parse_app_handle(h).app_id: final[i].state for i, h in handles.items()}
    assert listed == want

    print(
        f"\nlocal load: {N_APPS} apps, {sum(map(L.num_replicas, range(N_APPS)))} replicas,"
        f" all terminal after {submitted:.1f}s ({pollers.polls} describes from 8 threads),"
        f" all checked in {time.monotonic() - t0:.1f}s"
    )
