"""Measuring helpers: rows with targets, interleaved timing, the table and the JSON file.

Every row measures Shipyard and the raw mechanism it stands on *in the same run*, interleaved
(``shipyard, raw, raw, shipyard, ...``) so that load from other processes hits both sides alike,
and reports medians. A row's target is checked on the medians.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

MS = 1e3
MIB = 1 << 20


@dataclass(frozen=True)
class Target:
    """What a row must meet.

    kind:
        ``ratio``  shipyard / raw <= limit
        ``abs``    shipyard <= limit (seconds, bytes or a count)
        ``over``   shipyard - raw <= limit (seconds)
        ``eq``     shipyard == limit (a count)
        ``peer``   shipyard / peer <= limit (the same workload through the peer library)
    """

    kind: str
    limit: float
    text: str

    def met(self, shipyard: float, raw: float | None, peer: float | None = None) -> bool:
        if self.kind == "ratio":
            assert raw is not None
            return raw > 0 and shipyard / raw <= self.limit
        if self.kind == "abs":
            return shipyard <= self.limit
        if self.kind == "over":
            assert raw is not None
            return shipyard - raw <= self.limit
        if self.kind == "eq":
            return shipyard == self.limit
        if self.kind == "peer":
            return peer is not None and peer > 0 and shipyard / peer <= self.limit
        raise ValueError(f"unknown target kind {self.kind!r}")


def ratio(limit: float) -> Target:
    return Target("ratio", limit, f"<= {limit:g}x raw")


def at_most_ms(limit_ms: float) -> Target:
    return Target("abs", limit_ms / MS, f"<= {limit_ms:g} ms")


def over_ms(limit_ms: float) -> Target:
    return Target("over", limit_ms / MS, f"<= raw + {limit_ms:g} ms")


def at_most_mib(limit: float) -> Target:
    return Target("abs", limit * MIB, f"<= {limit:g} MiB")


def vs_peer(limit: float, peer: str) -> Target:
    return Target("peer", limit, f"<= {limit:g}x {peer}")


def exactly(n: int, what: str) -> Target:
    return Target("eq", n, f"= {n} {what}")


@dataclass
class Row:
    """One line of the table."""

    section: str
    name: str
    target: Target | None = None
    unit: str = "ms"  # ms (values in seconds), MiB (values in bytes), calls
    shipyard: float | None = None
    raw: float | None = None
    raw_name: str = ""
    status: str = "PENDING"  # PASS, MISS, SKIP, ERROR, INFO
    note: str = ""
    load: float | None = None  # 1-minute load average when the row started
    samples: dict[str, list[float]] = field(default_factory=dict)
    # the same workload through another library (``--peer``); rows without one print as before
    peer: float | None = None
    peer_name: str = ""

    @property
    def ratio(self) -> float | None:
        if self.shipyard is None or not self.raw:
            return None
        return self.shipyard / self.raw

    @property
    def peer_ratio(self) -> float | None:
        """shipyard / peer"""
        if self.shipyard is None or not self.peer:
            return None
        return self.shipyard / self.peer

    def finish(self) -> Row:
        """Sets the status from the values and the target."""
        if self.status != "PENDING":  # decided by the measurement (skip, error, wrong output)
            return self
        if self.shipyard is None:
            self.status = "ERROR"
            self.note = self.note or "no measurement"
        elif self.target is None:
            self.status = "INFO"
        else:
            met = self.target.met(self.shipyard, self.raw, self.peer)
            self.status = "PASS" if met else "MISS"
        return self

    def fmt(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.unit == "ms":
            v = value * MS
            return f"{v:.3f} ms" if v < 1 else f"{v:.2f} ms" if v < 100 else f"{v:.0f} ms"
        if self.unit == "MiB":
            return f"{value / MIB:.1f} MiB"
        return f"{value:g} {self.unit}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = self.target.text if self.target else None
        d["ratio"] = self.ratio
        if self.peer_name:
            d["peer_ratio"] = self.peer_ratio
        else:
            del d["peer"], d["peer_name"]
        return d


class Section:
    """The rows of one backend; a section whose service is missing skips all its rows."""

    def __init__(self, name: str, runs: int, verbose: bool = True) -> None:
        self.name = name
        self.runs = runs
        self.rows: list[Row] = []
        self.verbose = verbose

    def row(self, name: str, target: Target | None, unit: str = "ms", raw_name: str = "") -> Row:
        r = Row(self.name, name, target, unit, raw_name=raw_name)
        self.rows.append(r)
        return r

    def measure(self, row: Row, fn: Callable[[Row], None]) -> Row:
        """Runs ``fn(row)`` (which fills the row); a crash marks the row ERROR, not the run."""
        t0 = time.monotonic()
        row.load = round(os.getloadavg()[0], 2)
        try:
            fn(row)
        except SkipRow as e:
            row.status, row.note = "SKIP", f"skipped: {e}"
        except Exception as e:
            row.status = "ERROR"
            row.note = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            if self.verbose:
                traceback.print_exc(file=sys.stderr)
        row.finish()
        if self.verbose:
            took = time.monotonic() - t0
            peer = f", {row.peer_name} {row.fmt(row.peer)}" if row.peer_name else ""
            print(
                f"  [{row.status:5}] {row.name}: {row.fmt(row.shipyard)} vs {row.fmt(row.raw)}"
                f"{peer} ({took:.1f}s, load {row.load}){'  ' + row.note if row.note else ''}",
                file=sys.stderr,
                flush=True,
            )
        return row

    def skip_all(self, reason: str, names: Iterable[tuple[str, Target | None, str]]) -> None:
        for name, target, unit in names:
            r = self.row(name, target, unit)
            r.status, r.note = "SKIP", f"skipped: {reason}"


class SkipRow(Exception):
    """Raised by a row's measurement when it cannot run here (e.g. a service is missing)."""


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def interleave(
    sides: dict[str, Callable[[], float]], runs: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Runs each side ``warmup`` times (discarded), then ``runs`` times, alternating the order
    every round (ABBA...), and returns the samples. A side returns the duration it measured
    (so set-up and clean-up stay outside the timed region)."""
    names = list(sides)
    for _ in range(warmup):
        for n in names:
            sides[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(runs):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            out[n].append(sides[n]())
    return out


def repeat_timed(fn: Callable[[], Any], inner: int) -> float:
    """Mean duration of ``inner`` back-to-back calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def fill(
    row: Row, samples: dict[str, list[float]], shipyard: str = "shipyard", raw: str = "raw"
) -> None:
    """Puts the medians of ``samples`` into ``row``."""
    row.samples = samples
    row.shipyard = median(samples[shipyard])
    if raw in samples:
        row.raw = median(samples[raw])


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """Polls ``cond`` until it returns something truthy; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _peer_label(rows: list[Row]) -> str | None:
    """The peer's name for the table's columns; None when no row has a peer."""
    names = {r.peer_name for r in rows if r.peer_name}
    return None if not names else names.pop() if len(names) == 1 else "peer"


def _peer_cells(r: Row) -> list[str]:
    if r.status == "SKIP":
        return ["-", "-"]
    rat = r.peer_ratio
    return [r.fmt(r.peer), "-" if rat is None else f"{rat:.2f}x"]


def table(rows: list[Row]) -> str:
    head = ["section", "path", "shipyard", "raw", "ratio", "target", "result"]
    peer = _peer_label(rows)
    if peer:  # (shipyard / peer)
        head[5:5] = [peer, f"vs {peer}"]
    body = []
    for r in rows:
        rat = r.ratio
        result = r.status if not r.note or r.status in ("PASS", "INFO") else f"{r.status}"
        body.append(
            [
                r.section,
                r.name,
                r.fmt(r.shipyard) if r.status != "SKIP" else "-",
                r.fmt(r.raw) if r.status != "SKIP" else "-",
                "-" if rat is None or r.status == "SKIP" else f"{rat:.2f}x",
                r.target.text if r.target else "-",
                result,
            ]
        )
        if peer:
            body[-1][5:5] = _peer_cells(r)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    lines = [
        "  ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=False)),
        "  ".join("-" * w for w in widths),
    ]
    for r, cells in zip(rows, body, strict=False):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)))
        if r.note and r.status not in ("PASS",):
            lines.append(" " * (widths[0] + 2) + "  " + r.note)
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    peer = _peer_label(rows)
    out = [
        "| section | path | shipyard | raw | ratio | "
        + (f"{peer} | vs {peer} | " if peer else "")
        + "target | result |",
        "|---|---|---|---|---|" + ("---|---|" if peer else "") + "---|---|",
    ]
    for r in rows:
        rat = r.ratio
        cells = " | ".join(_peer_cells(r)) + " | " if peer else ""
        out.append(
            f"| {r.section} | {r.name} | {r.fmt(r.shipyard)} | {r.fmt(r.raw)} | "
            f"{'-' if rat is None else f'{rat:.2f}x'} | {cells}{r.target.text if r.target else '-'} | "
            f"{r.status}{' (' + r.note + ')' if r.note and r.status != 'PASS' else ''} |"
        )
    return "\n".join(out)


def write_json(path: str, info: dict[str, Any], rows: list[Row]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = {"machine": info, "rows": [r.to_json() for r in rows]}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=_json_default)
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)
