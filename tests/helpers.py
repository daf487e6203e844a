"""Helpers every tier of the tests shares: waiting for a condition, and the processes of a test."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PROCESS_TREE", "ROOT", "live_processes", "pid_alive", "proc_state", "wait_until"]

#: the repository's top directory
ROOT = Path(__file__).resolve().parents[1]


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 90.0,
    what: str = "condition",
    max_delay: float = 0.2,
) -> Any:
    """Calls ``predicate`` until it returns something truthy, and returns that; fails the test
    naming ``what`` after ``timeout`` seconds. Asks often at first (2 ms, doubling up to
    ``max_delay``): a condition met at once costs no sleep."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, max_delay)


def proc_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``Z``...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie nobody reaped yet counts as gone)."""
    return proc_state(pid) not in (None, "Z", "X")


def live_processes(marker: str) -> list[tuple[int, str]]:
    """Processes (not zombies) whose command line contains ``marker``: ``(pid, command line)``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or not pid_alive(int(name)):
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd:
            found.append((int(name), cmd.strip()))
    return found


#: A replica that starts three processes tagged with its first argument (a marker) and writes
#: their pids to its second argument, then sleeps: one stays in its process group, one leaves it,
#: one ignores SIGTERM (so ending the tree takes the grace and a SIGKILL).
PROCESS_TREE = """
import os, subprocess, sys, time
marker = sys.argv[1]
sleeper = [sys.executable, "-c", "import time; time.sleep(1000)", marker]
kids = [
    subprocess.Popen(sleeper),
    subprocess.Popen(sleeper, process_group=0),
    subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done", marker]),
]
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(" ".join(str(k.pid) for k in kids))
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(1000)
"""


#: steps of :data:`TRAINING` (at most 25 an attempt: three attempts, however loaded the host)
TRAINING_STEPS = 60
#: a training-like replica for the time-limit requeue tests (Docker, local processes): one line
#: per step, its counter saved to $SHIPYARD_CHECKPOINT_DIR at the checkpoint signal (USR1), then
#: no more work until the limit's SIGTERM; the next attempt resumes from the counter
TRAINING = f"""
d="$SHIPYARD_CHECKPOINT_DIR"; n=$(cat "$d/counter" 2>/dev/null || echo 0); done=0
echo "start $SHIPYARD_ATTEMPT $n"
save=0; trap 'save=1' USR1; trap 'echo "term $SHIPYARD_ATTEMPT $(date +%s)"; exit 143' TERM
while [ "$n" -lt {TRAINING_STEPS} ]; do
  if [ "$save" = 1 ]; then
    echo "$n" >"$d/counter"; echo "usr1 $SHIPYARD_ATTEMPT $(date +%s)"
    while :; do sleep 0.1; done
  fi
  if [ "$done" -lt 25 ]; then
    sleep 0.05; echo "step $n"; n=$((n+1)); done=$((done+1))
  else
    sleep 0.1
  fi
done
echo "$n" >"$d/counter"; echo finished
"""
