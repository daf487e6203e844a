"""What several sections share: the run context, the 200,000-line log file, raw reading."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: lines of the big log file
LOG_LINES = 200_000
#: keeps every 10th line (numbers ending in 7)
LOG_REGEX = r"^\d{5}7 "

_WORDS = ["alpha", "beta", "gamma", "delta", "épsilon", "λambda", "✓ ok", "step", "loss=0.125"]


@dataclass
class Ctx:
    """What every section gets: where to put files, how many runs, the python to use."""

    tmp: str
    runs: int
    python: str = sys.executable
    verbose: bool = True
    _lines: list[str] | None = field(default=None, repr=False)

    def log_lines(self) -> list[str]:
        """The expected lines of the big log file (each ends with ``\\n``)."""
        if self._lines is None:
            self._lines = make_lines(LOG_LINES)
        return self._lines

    def log_file(self) -> str:
        """A file holding :meth:`log_lines` (apps ``cat`` it into their logs)."""
        path = os.path.join(self.tmp, "lines.txt")
        if not os.path.exists(path):
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.writelines(self.log_lines())
        return path


def make_lines(n: int) -> list[str]:
    """``n`` deterministic lines of 7 to ~200 characters, some with multi-byte UTF-8, so that
    read-buffer boundaries fall inside lines and inside characters."""
    out = []
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range((i * 7919) % 23)]
        out.append(f"{i:06d} {' '.join(words)}\n")
    return out


def raw_read_split(path: str, regex: str | None = None) -> list[str]:
    """The plain-Python baseline: read the whole file, decode, split into lines."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    lines = text.splitlines(keepends=True)
    if regex:
        pat = re.compile(regex)
        lines = [line for line in lines if pat.search(line)]
    return lines


def check_lines(got: list[str], expected: list[str], what: str) -> None:
    """Raises if ``got`` is not exactly ``expected`` (names the first differing line)."""
    if got == expected:
        return
    for i, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            raise AssertionError(f"{what}: line {i} differs: {a[:60]!r} != {b[:60]!r}")
    raise AssertionError(f"{what}: {len(got)} lines, expected {len(expected)}")


def measure_lines(
    row: Any,
    ship: Callable[[], Iterable[str]],
    raw: Callable[[], list[str]],
    expected: list[str],
    runs: int,
    warmup: int = 1,
) -> None:
    """Times ``ship`` (collecting every line) beside ``raw``, then checks that both gave exactly
    ``expected`` (the lines of their last timed run); a shipyard side that split or lost lines
    makes the row a MISS."""
    from bench.harness import fill, interleave

    got: dict[str, list[str]] = {}

    def time_ship() -> float:
        t0 = time.perf_counter()
        lines = list(ship())
        dt = time.perf_counter() - t0
        got["shipyard"] = lines
        return dt

    def time_raw() -> float:
        t0 = time.perf_counter()
        lines = raw()
        dt = time.perf_counter() - t0
        got["raw"] = lines
        return dt

    fill(row, interleave({"shipyard": time_ship, "raw": time_raw}, runs, warmup=warmup))
    check_lines(got["raw"], expected, "raw " + row.name)
    try:
        check_lines(got["shipyard"], expected, row.name)
    except AssertionError as e:
        row.status = "MISS"
        row.note = f"lines not whole: {e}"
        return
    row.note = f"{len(expected):,} lines, every line whole"


def raw_popen(cmd: list[str], n: int, log_dir: str) -> list[subprocess.Popen[bytes]]:
    """``n`` processes with their stdout/stderr appended to per-replica log files, each in its
    own process group: what the local scheduler must do at the least."""
    os.makedirs(log_dir, exist_ok=True)
    procs = []
    for k in range(n):
        with (
            open(os.path.join(log_dir, f"{k}.stdout.log"), "ab") as out,
            open(os.path.join(log_dir, f"{k}.stderr.log"), "ab") as err,
        ):
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    process_group=0,  # cancelled with killpg, as shipyard's replicas
                )
            )
    return procs


def kill_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kills each process's group (SIGKILL) and reaps the processes."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()
