"""A submitting process signalled (SIGINT or SIGTERM) at any moment, while CPU burners load the
machine: it cancels what it started and exits promptly, every time (issue 32).

Each run starts a submitter that submits a two-replica local app whose replicas start process
trees (``tests.helpers.PROCESS_TREE``: one process leaves its group, one ignores SIGTERM, so the
cancel needs its grace and a SIGKILL) and then sleeps, or waits on it through ``Runner.wait``; it
is signalled at one of these moments:

* ``start``: at a random instant of its first second (imports, submit, the background thread
  and the log collector starting);
* ``sleeping``: once its replicas run, while it sleeps;
* ``waiting``: once its replicas run, while it waits in ``Runner.wait`` (the watch).

It must exit within the grace period plus a second (scaled by the load factor below: the burners
take 3 of the machine's CPUs' time), leave no replica behind, and its app, if it was submitted,
must be CANCELLED. A run that hangs has every thread's stack dumped (``faulthandler`` on
SIGUSR1) in the failure. ``SHIPYARD_STRESS_SCALE`` multiplies the runs (``docs/reliability.md``
has a 200-run count).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.schedulers.local_scheduler import create_cwd_scheduler
from core.specs import AppState
from tests.helpers import ROOT, live_processes, wait_until
from tests.stress.conftest import scaled

GRACE = 1.0
#: how much longer than on a quiet machine an exit may take with the burners on
LOAD_FACTOR = 4.0
RUNS_PER_MOMENT = scaled(3)

VICTIM = r"""
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
from core.runner import get_runner
from core.specs import AppDef, Role
from tests.helpers import PROCESS_TREE
marker, mode, pids = sys.argv[1], sys.argv[2], sys.argv[3]
args = ["-c", PROCESS_TREE, marker, pids + ".${replica_id}"]
app = AppDef("victim", [Role("r", entrypoint=sys.executable, args=args, num_replicas=2)])
with get_runner("victim", grace=float(sys.argv[4])) as runner:
    handle = runner.run(app, "local_cwd")
    print(handle, flush=True)
    if mode == "waiting":
        runner.wait(handle, wait_interval=0.2)
    time.sleep(120)
"""


@pytest.fixture(scope="module")
def burners() -> Iterator[None]:
    """Three CPU-bound processes for the whole module (2 cores here: a loaded machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _signal_at(proc: subprocess.Popen[str], moment: str, pids: Path, rng: random.Random) -> None:
    if moment == "start":
        time.sleep(rng.uniform(0.0, 1.0))
        return
    files = [Path(f"{pids}.{k}") for k in range(2)]
    started = lambda: all(f.exists() for f in files) or proc.poll() is not None  # noqa: E731
    wait_until(started, 60, "the replicas' processes")
    if moment == "waiting":
        time.sleep(rng.uniform(0.0, 0.5))


def _one_run(moment: str, sig: signal.Signals, rng: random.Random, tmp: Path) -> float:
    """One signalled submitter; returns the seconds it took to exit."""
    marker = f"victim-{os.getpid()}-{time.time_ns()}"
    pids = tmp / marker
    mode = "waiting" if moment == "waiting" else "sleeping"
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, marker, mode, str(pids), str(GRACE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        _signal_at(proc, moment, pids, rng)
        sent = time.monotonic()
        proc.send_signal(sig)
        limit = (GRACE + 1.0) * LOAD_FACTOR
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # every thread's stack to its stderr
            time.sleep(1.0)
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"{moment}/{sig.name}: no exit {limit}s after the signal:\n{err[-6000:]}")
        took = time.monotonic() - sent
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, (moment, sig.name, err[-2000:])
    wait_until(lambda: not live_processes(marker), 10, f"the replicas of {marker} to be gone")
    handle = out.strip().splitlines()[0] if out.strip() else None
    if handle is not None:
        s = create_cwd_scheduler("check")
        try:
            desc = s.describe(handle.rsplit("/", 1)[1])
            assert desc is not None and desc.state == AppState.CANCELLED, (moment, sig.name, desc)
        finally:
            s.close()
    return took


@pytest.mark.parametrize("moment", ["start", "sleeping", "waiting"])
def test_a_signalled_submitter_always_cancels_and_exits(
    moment: str, burners: None, tmp_path: Path
) -> None:
    rng = random.Random(f"{moment}-{os.getpid()}")
    took = [
        _one_run(moment, sig, rng, tmp_path)
        for _ in range(RUNS_PER_MOMENT)
        for sig in (signal.SIGINT, signal.SIGTERM)
    ]
    print(f"{moment}: {len(took)} runs, exit after the signal: max {max(took):.2f}s")
