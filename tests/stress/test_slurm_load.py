"""Slurm under load: 100 jobs queued at once (single and heterogeneous), described from 8 threads
while they wait and run. No submit fails, describe is never wrong (never unknown, never going
backwards, the right final state and exit codes) and polling all of them costs one ``squeue``
(plus at most one ``sacct``) per poll. (Concurrent Prefect waits: tests/integration/test_faults_integrations.py,
which shares a Prefect server.)"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from core.runner import get_runner
from core.schedulers.slurm.transport import LocalShell
from core.specs import AppDef, AppState, Role, is_terminal
from tests.stress.conftest import scaled

N_JOBS = scaled(100)
ORDER = {
    AppState.SUBMITTED: 1,
    AppState.PENDING: 2,
    AppState.RUNNING: 3,
    AppState.SUCCEEDED: 4,
    AppState.FAILED: 4,
    AppState.CANCELLED: 4,
}


def exit_code(i: int) -> int:
    return 0 if i % 6 else 2


def replicas(i: int) -> int:
    return 2 if i % 4 == 1 and exit_code(i) == 0 else 1


def app(i: int) -> AppDef:
    role = Role("w", entrypoint="/bin/sh", args=["-c", f"echo job {i}; exit {exit_code(i)}"],
                num_replicas=replicas(i))  # fmt: skip
    return AppDef(f"sload{i}", [role])


@pytest.fixture
def submit_dir(slurm_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # jobs without a job_dir write their logs here
    return tmp_path


class CallCounter:
    """Counts the Slurm CLI calls of the slurm scheduler (by command name)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        real = LocalShell.run

        def counting(shell: LocalShell, cmd: list[str], **kwargs: Any) -> Any:
            with self._lock:
                self.calls[cmd[0]] += 1
            return real(shell, cmd, **kwargs)

        monkeypatch.setattr(LocalShell, "run", counting)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.calls)


def _cancel_all(handles: Iterator[str] | list[str]) -> None:
    with get_runner("sload") as runner:
        for h in handles:
            runner.cancel(h)


def test_slurm_100_jobs_queued_at_once_described_from_8_threads(
    submit_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = CallCounter(monkeypatch)
    handles: dict[int, str] = {}
    # seen[(i, t)]: what poller t saw of job i, in its order
    seen: dict[tuple[int, int], list[AppState | None]] = {}
    lock = threading.Lock()
    stop = threading.Event()
    polls = [0]

    def poll(t: int) -> None:
        # every thread describes every job, as 8 sensors/flows watching the same cluster would
        with get_runner("sload") as runner:
            while not stop.is_set():
                with lock:
                    mine = dict(handles)
                if mine:
                    statuses = runner.status_many(mine.values())
                    with lock:
                        polls[0] += 1
                        for i, h in mine.items():
                            st = statuses[h]
                            seen.setdefault((i, t), []).append(None if st is None else st.state)
                time.sleep(0.25)

    pollers = [threading.Thread(target=poll, args=(t,)) for t in range(8)]
    for p in pollers:
        p.start()
    try:
        with get_runner("sload") as runner:

            def submit(i: int) -> None:
                h = runner.run(app(i), "slurm")
                with lock:
                    handles[i] = h

            with ThreadPoolExecutor(max_workers=16) as pool:
                errors = [f.exception() for f in [pool.submit(submit, i) for i in range(N_JOBS)]]
            failed = [(i, repr(e)) for i, e in enumerate(errors) if e is not None]
            assert not failed, f"{len(failed)} submits failed, e.g. {failed[:3]}"

            deadline = time.monotonic() + 600
            finals: dict[int, Any] = {}
            while len(finals) < N_JOBS and time.monotonic() < deadline:
                statuses = runner.status_many(handles[i] for i in range(N_JOBS) if i not in finals)
                by_handle = {h: i for i, h in handles.items()}
                for h, st in statuses.items():
                    if st is not None and is_terminal(st.state):
                        finals[by_handle[h]] = st
                time.sleep(1)
            assert len(finals) == N_JOBS, f"{N_JOBS - len(finals)} jobs did not end in time"
        stop.set()
        for p in pollers:
            p.join(60)

        wrong = []
        for (i, _t), states in seen.items():
            want = AppState.SUCCEEDED if exit_code(i) == 0 else AppState.FAILED
            if None in states or AppState.UNKNOWN in states:
                wrong.append((i, f"unknown while it existed: {states}"))
            ranks = [ORDER.get(s, -1) for s in states if s is not None]
            if ranks != sorted(ranks):
                wrong.append((i, f"went backwards: {[s.name for s in states if s]}"))
            if any(is_terminal(s) and s != want for s in states if s is not None):
                wrong.append((i, f"wrong terminal state in {set(states)}"))
        assert not wrong, wrong[:10]
        for i, st in finals.items():
            want = AppState.SUCCEEDED if exit_code(i) == 0 else AppState.FAILED
            assert st.state == want, (i, st)
            assert st.exit_codes() == {"w": [exit_code(i)] * replicas(i)}, (i, st.exit_codes())

        # polling cost: one squeue (and at most one sacct) per status_many, whatever the count
        calls = counter.snapshot()
        n_polls = polls[0] + 1  # (+ the final loop's polls, counted below)
        assert calls["squeue"] <= 2 * (n_polls + 600), calls
        per_poll = (calls["squeue"] + calls["sacct"]) / max(1, polls[0])
        print(
            f"\nslurm load: {N_JOBS} jobs ({sum(map(replicas, range(N_JOBS)))} components),"
            f" {polls[0]} polls of all jobs from 8 threads, CLI calls {dict(calls)},"
            f" {per_poll:.2f} squeue+sacct calls per poll"
        )
        assert per_poll <= 2.5, f"{per_poll:.1f} CLI calls per poll of {N_JOBS} jobs: {calls}"
    finally:
        stop.set()
        for p in pollers:
            p.join(60)
        _cancel_all(list(handles.values()))
