"""What every load of the soak shares: the record of one job's outcome, retrying through a
restart, the soak's plan (counts and times)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers import ROOT, wait_until

T = TypeVar("T")
PYTHON = sys.executable


@dataclass
class Outcome:
    """One job of the soak as checked: what it is, the state wanted and seen, its lines."""

    kind: str
    name: str
    expected: str
    state: str = "?"
    handle: str = ""
    lines: int = 0
    tries: int = 1
    failures: list[str] = field(default_factory=list)
    #: what went wrong outside Shipyard (reported, not a failure of the soak)
    notes: list[str] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.failures.append(why)


@dataclass
class Plan:
    """The soak's counts and clock."""

    tag: str
    minutes: float
    scale: float
    every: float
    workdir: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def window(self) -> float:
        """Seconds during which new work is submitted (the last minute lets it end)."""
        return max(self.minutes * 60 - 60, self.minutes * 30)

    @property
    def end(self) -> float:
        return self.started + self.minutes * 60

    def count(self, full: int) -> int:
        return max(1, round(full * self.scale))

    def at(self, i: int, n: int) -> float:
        """The monotonic time of the ``i``-th of ``n`` submissions spread over the window."""
        return self.started + self.window * i / n

    def now(self) -> float:
        return time.monotonic() - self.started


def wait_for(when: float) -> None:
    """Waits until the monotonic clock reaches ``when`` (a schedule, not a condition)."""
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def retrying(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()``, called again (backing off to 2 s) while it raises, as a user retries through a
    restart; the last error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return fn()
        except Exception as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {type(e).__name__}: {e}") from e
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def shipyard(
    args: list[str], state_dir: Path, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs the ``shipyard`` command (``python -m core.cli``) as a user of ``state_dir``."""
    env = {**os.environ, "SHIPYARD_STATE_DIR": str(state_dir), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [PYTHON, "-m", "core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def local_apps(state_dir: Path, cwd: Path) -> list[dict[str, Any]]:
    """The local apps of ``state_dir`` (``shipyard list -s local_cwd --json``)."""
    proc = shipyard(["list", "-s", "local_cwd", "--json"], state_dir, cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"shipyard list: {proc.stderr}")
    return list(json.loads(proc.stdout))


def counted(lines: int, every: float) -> str:
    """A replica script printing ``line N of replica K`` for N in 1..lines, one every
    ``every`` seconds (``${replica_id}`` is Shipyard's macro)."""
    return (
        f'for i in $(seq 1 {lines}); do echo "line $i of replica ${{replica_id}}"; '
        f"sleep {every}; done"
    )


def final_state(
    state: Callable[[], str], finals: Collection[str], what: str, timeout: float
) -> str:
    """``state()`` once it is one of ``finals`` (an API that does not answer for a moment, as
    while its service restarts, is asked again)."""

    def ended() -> str | None:
        try:
            now = state()
        except Exception:
            return None
        return now if now in finals else None

    return str(wait_until(ended, timeout, f"{what} to end", max_delay=2.0))
