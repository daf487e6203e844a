"""Cost curves (issue 31): how list, status_many, log reads and following grow with their size.

Each curve is measured at 1x, 10x and 100x of a base size (a row per size, Shipyard beside the
raw mechanism at that size), then a row of its slope: the exponent k of cost ~ size^k between
the smallest and the largest size (1 is linear; a fixed cost per call makes it smaller). Its
target is 1.1: no curve may grow worse than linearly. Where the backend is called, a row also
counts the calls per poll at each size: they must stay at one.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench.common import Ctx, check_lines, make_lines, raw_read_split
from bench.harness import Row, Section, SkipRow, Target, interleave, median, repeat_timed, wait_for

SLOPE = Target("abs", 1.1, "slope <= 1.1 (linear)")
LOCAL_LIST = (100, 1_000, 10_000)
DOCKER_LIST = (100, 1_000)
RUNNING = (10, 100, 1_000)
LOG = (20_000, 200_000, 2_000_000)
SESSION = "benchcurve"

#: one size's measurement: (shipyard, raw) in the row's unit, and a note
Point = tuple[float, float | None, str]


def slope(sizes: tuple[int, ...], values: list[float]) -> float:
    """The exponent k of value ~ size^k between the first and the last point."""
    return math.log(values[-1] / values[0]) / math.log(sizes[-1] / sizes[0])


def curve(
    sec: Section,
    name: str,
    sizes: tuple[int, ...],
    point: Callable[[int], Point],
    unit: str = "ms",
    raw_name: str = "",
) -> None:
    """A row per size (``point(size)``, sizes ascending), then the slope row."""
    got: list[Point] = []
    rows = [sec.row(f"{name}: {n:,}", None, unit, raw_name) for n in sizes]
    for n, row in zip(sizes, rows, strict=True):

        def measure(row: Row, n: int = n) -> None:
            row.shipyard, row.raw, row.note = point(n)
            got.append((row.shipyard, row.raw, row.note))

        if sec.measure(row, measure).status != "INFO":
            break
    srow = sec.row(f"{name}: slope over {sizes[0]:,}..{sizes[-1]:,}", SLOPE, "slope", raw_name)

    def fit(row: Row) -> None:
        if len(got) < len(sizes):
            raise RuntimeError("a size of the curve did not run")
        row.shipyard = round(slope(sizes, [g[0] for g in got]), 3)
        raws = [g[1] for g in got]
        if all(r for r in raws):
            row.raw = round(slope(sizes, [float(r or 0) for r in raws]), 3)
        row.note = " / ".join(_point_text(r, g) for r, g in zip(rows, got, strict=False))

    sec.measure(srow, fit)


def _point_text(row: Row, point: Point) -> str:
    raw = "" if point[1] is None else f" (raw {row.fmt(point[1])})"
    return f"{row.fmt(point[0])}{raw}"


def calls_row(
    sec: Section, name: str, sizes: tuple[int, ...], counts: dict[int, float], expected: int
) -> None:
    """Backend calls per poll at each size: ``expected``, whatever the size."""
    target = Target("eq", expected, f"= {expected} at every size")
    row = sec.row(f"{name}: backend calls per poll", target, "calls", f"{expected} queries")

    def measure(row: Row) -> None:
        if len(counts) < len(sizes):
            raise SkipRow("the curve did not reach every size")
        row.shipyard, row.raw = max(counts.values()), float(expected)
        row.note = ", ".join(f"{n:,}: {c:g}" for n, c in sorted(counts.items()))
        if len(set(counts.values())) != 1:
            row.status = "MISS"

    sec.measure(row, measure)


def _worker(ctx: Ctx, *args: str, timeout: float = 1200) -> dict[str, Any]:
    p = subprocess.run([ctx.python, "-m", "bench.curves_worker", *args], capture_output=True,
                       text=True, timeout=timeout, check=False)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"curves_worker {args[0]} failed: {p.stderr.strip()[-3000:]}")
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def run(ctx: Ctx) -> list[Row]:
    sec = Section("curves", ctx.runs, ctx.verbose)
    # local apps of their own: the counts are of this section's apps alone
    old = os.environ.get("SHIPYARD_STATE_DIR")
    os.environ["SHIPYARD_STATE_DIR"] = os.path.join(ctx.tmp, "curves-state")
    try:
        _local_list(ctx, sec)
        _local_running(ctx, sec)
        _logs(ctx, sec)
    finally:
        if old is None:
            os.environ.pop("SHIPYARD_STATE_DIR", None)
        else:
            os.environ["SHIPYARD_STATE_DIR"] = old
    from bench import curves_remote

    curves_remote.docker_curves(ctx, sec)
    curves_remote.slurm_curves(ctx, sec)
    return sec.rows


# -- local ------------------------------------------------------------------------------------


def _local_list(ctx: Ctx, sec: Section) -> None:
    """``list`` of 100 / 1,000 / 10,000 ended local apps by a fresh scheduler (as ``shipyard
    list`` does), beside listing the state directory and reading each app's record and end."""
    from core.schedulers.local_scheduler import create_cwd_scheduler, state_dir

    made = [0]
    root = state_dir()

    def raw_list() -> int:
        n = 0
        for name in os.listdir(root):
            try:
                with open(os.path.join(root, name, "app.json"), "rb") as f:
                    json.loads(f.read())
                with open(os.path.join(root, name, "done"), "rb") as f:
                    f.read()
            except (FileNotFoundError, NotADirectoryError):
                continue
            n += 1
        return n

    def point(n: int) -> Point:
        _worker(ctx, "make-local", str(n - made[0]), SESSION)
        made[0] = n

        def shipyard() -> float:
            sched = create_cwd_scheduler(SESSION)
            t0 = time.perf_counter()
            got = sched.list()
            dt = time.perf_counter() - t0
            sched.close()
            if len(got) != n:
                raise AssertionError(f"list gave {len(got)} apps, expected {n}")
            return dt

        def raw() -> float:
            t0 = time.perf_counter()
            raw_list()
            return time.perf_counter() - t0

        runs = max(3, ctx.runs * 100 // n) if n < 10_000 else 3
        s = interleave({"shipyard": shipyard, "raw": raw}, runs, warmup=1)
        return median(s["shipyard"]), median(s["raw"]), ""

    curve(sec, "local list, ended apps", LOCAL_LIST, point,
          raw_name="listdir + read each record and end")  # fmt: skip


def _local_running(ctx: Ctx, sec: Section) -> None:
    """``status_many`` of 10 / 100 / 1,000 running local apps from a process that did not submit
    them (a watcher), beside reading each record and probing each replica's pid."""
    from core.runner import get_runner
    from core.schedulers.local_scheduler import state_dir
    from core.specs import AppDef, AppState, Role

    app = AppDef("bcrun", [Role("r", entrypoint="sleep", args=["3600"])])
    submitter = get_runner(SESSION, cache_size=max(RUNNING) + 1)
    handles: list[str] = []
    root = state_dir()

    def raw_once(ids: list[str]) -> None:
        for app_id in ids:
            with open(os.path.join(root, app_id, "app.json"), "rb") as f:
                rec = json.loads(f.read())
            for rep in rec["replicas"]:
                os.kill(rep["pid"], 0)

    def point(n: int) -> Point:
        handles.extend(submitter.run(app, "local_cwd") for _ in range(n - len(handles)))
        ids = [h.rsplit("/", 1)[1] for h in handles]
        # each running app gets its log collector process a moment after its submit: measured
        # once they all run (idle), not while 1,000 Python processes start
        locks = [os.path.join(root, i, "collector.lock") for i in ids]
        wait_for(lambda: all(os.path.exists(p) for p in locks), 300, "every app's collector")
        watcher = get_runner(SESSION)

        def once() -> None:
            got = watcher.status_many(handles)
            if not all(s is not None and s.state == AppState.RUNNING for s in got.values()):
                raise AssertionError("an app is not RUNNING")

        idle = _collectors_cpu(root)
        inner = max(1, 1000 // n)
        s = interleave({"shipyard": lambda: repeat_timed(once, inner),
                        "raw": lambda: repeat_timed(lambda: raw_once(ids), inner)},
                       ctx.runs, warmup=1)  # fmt: skip
        watcher.close()
        return median(s["shipyard"]), median(s["raw"]), f"idle collectors {idle:.1%} of a core"

    try:
        curve(sec, "local status_many, running apps", RUNNING, point,
              raw_name="read each record + kill(pid, 0)")  # fmt: skip
        _follow_rows(ctx, sec, handles)
    finally:
        for h in handles:
            submitter.cancel(h)
        wait_for(lambda: all(s is not None and s.is_terminal()
                             for s in submitter.status_many(handles).values()),
                 120, "the running apps to end")  # fmt: skip
        done = [os.path.join(root, h.rsplit("/", 1)[1], "logs_done") for h in handles]
        wait_for(lambda: all(os.path.exists(p) for p in done), 300, "their collectors to end")
        submitter.close()


def _collectors_cpu(root: str, seconds: float = 3.0) -> float:
    """The CPU the log collectors of the apps under ``root`` take while idle, in cores."""

    def ticks() -> int:
        total = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                if b"local.collector" not in cmd or root.encode() not in cmd:
                    continue
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
        return total

    t0, c0 = time.monotonic(), ticks()
    time.sleep(seconds)  # (the window the CPU is averaged over)
    return (ticks() - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)


def _follow_rows(ctx: Ctx, sec: Section, handles: list[str]) -> None:
    """Memory of one process following 10 / 100 / 1,000 running apps (a watch each, one
    poller), beside as many bare asyncio tasks."""
    path = os.path.join(ctx.tmp, "follow-handles")

    def point(n: int) -> Point:
        with open(path, "w") as f:
            f.write("\n".join(handles[:n]))
        ship = _worker(ctx, "follow-mem", path, timeout=180)
        if ship["ended_early"]:
            raise AssertionError(f"{ship['ended_early']} watches ended while their apps ran")
        raw = _worker(ctx, "follow-mem-raw", str(n))
        grown = max(ship["after"] - ship["before"], 4096)
        return float(grown), float(max(raw["after"] - raw["before"], 4096)), ""

    curve(sec, "memory following running apps (RSS growth)", RUNNING, point, "MiB",
          "as many bare asyncio tasks")  # fmt: skip


def _logs(ctx: Ctx, sec: Section) -> None:
    """A whole read of a 20k / 200k / 2M-line local log, beside reading and splitting it."""
    from core.runner import get_runner
    from core.schedulers.local.appdir import AppDir
    from core.schedulers.local_scheduler import create_cwd_scheduler, state_dir
    from core.specs import AppDef, AppState, Role

    runner = get_runner(SESSION)
    sched = create_cwd_scheduler(SESSION)

    def point(n: int) -> Point:
        expected = make_lines(n)
        src = os.path.join(ctx.tmp, f"lines-{n}.txt")
        with open(src, "w", encoding="utf-8", newline="") as f:
            f.writelines(expected)
        h = runner.run(AppDef("bclog", [Role("r", entrypoint="cat", args=[src])]), "local_cwd")
        st = runner.wait(h, wait_interval=0.05, timeout=600)
        if st is None or st.state != AppState.SUCCEEDED:
            raise RuntimeError(f"log app {h} ended {st}")
        app_id = h.rsplit("/", 1)[1]
        record = AppDir(state_dir(), app_id).read_record()
        assert record is not None
        path = record.replicas[0].stdout
        got: dict[str, list[str]] = {}

        def shipyard() -> float:
            t0 = time.perf_counter()
            got["s"] = list(sched.log_iter(app_id, "r", 0))
            return time.perf_counter() - t0

        def raw() -> float:
            t0 = time.perf_counter()
            got["r"] = raw_read_split(path)
            return time.perf_counter() - t0

        s = interleave({"shipyard": shipyard, "raw": raw}, 3 if n > 200_000 else ctx.runs)
        check_lines(got["s"], expected, f"log of {n:,} lines")
        got.clear()
        os.unlink(src)
        return median(s["shipyard"]), median(s["raw"]), "every line whole"

    try:
        curve(sec, "local log read whole", LOG, point, raw_name="read + splitlines")
    finally:
        sched.close()
        runner.close()
