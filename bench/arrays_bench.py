"""Array rows (``Runner.run_array`` on ``local_cwd``): submitting 1,000 elements beside a raw
``Popen`` of each, and following a running 1,000-element array from a fresh process (time per
status read beside parsing its ``state.json``, scheduler calls per read, the watcher's memory),
and the whole array's run beside a raw pool of processes under the same cap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import Ctx
from bench.harness import (
    MIB,
    Row,
    Section,
    Target,
    at_most_mib,
    fill,
    interleave,
    over_ms,
    ratio,
)

TRUE = shutil.which("true") or "/bin/true"
N_ELEMENTS = 1000
SUBMIT_PARALLEL = 8  # (the submit row cancels its arrays at once: few elements start)
FOLLOW_PARALLEL = 16
POLL = 0.0005  # seconds between two looks at the raw pool's processes
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driverhook")


def _app() -> Any:
    from core.specs import AppDef, Role

    return AppDef("barray", [Role("r", entrypoint=TRUE)])


def _array_dir(handle: str) -> Any:
    from core import arrays
    from core.specs import parse_app_handle

    p = parse_app_handle(handle)
    adir = arrays.open_array(p.scheduler_backend, p.session_name, p.app_id)
    if adir is None:
        raise RuntimeError(f"{handle}: no array directory")
    return adir


def _until_driver_gone(handle: str, timeout: float = 60) -> None:
    """Waits until the array's driver exited (it writes its last state, then exits)."""
    adir = _array_dir(handle)
    deadline = time.monotonic() + timeout
    while adir.driver_alive():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{handle}: its driver still runs after {timeout:g} s")
        time.sleep(0.01)


@contextmanager
def _driver_counted(out: str) -> Iterator[None]:
    """A driver started inside the block counts its backend calls into ``out`` (see
    :mod:`bench.driverhook.sitecustomize`): it inherits this process's environment."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "SHIPYARD_BENCH_DRIVER_COUNTS")}
    os.environ["SHIPYARD_BENCH_DRIVER_COUNTS"] = out
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HOOK_DIR, saved["PYTHONPATH"]]))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _raw_spawn(n: int) -> float:
    """Seconds to start ``n`` processes of ``true`` (then waited for, untimed)."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [TRUE], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(n)
    ]
    dt = time.perf_counter() - t0
    for p in procs:
        p.wait()
    return dt


def _raw_pool(n: int, cap: int) -> float:
    """Seconds to run ``n`` processes of ``true``, at most ``cap`` at once, each started as soon
    as a slot frees: what an array's run costs at the least."""
    t0 = time.perf_counter()
    started = 0
    live: list[subprocess.Popen[bytes]] = []
    while started < n or live:
        live = [p for p in live if p.poll() is None]
        while started < n and len(live) < cap:
            live.append(subprocess.Popen([TRUE], stdin=subprocess.DEVNULL))
            started += 1
        if live:
            time.sleep(POLL)
    return time.perf_counter() - t0


def _submit_row(ctx: Ctx, sec: Section, runner: Any) -> None:
    app = _app()

    def shipyard() -> float:
        t0 = time.perf_counter()
        h = runner.run_array(app, "local_cwd", size=N_ELEMENTS, max_parallel=SUBMIT_PARALLEL)
        dt = time.perf_counter() - t0
        runner.cancel(h)
        end = runner.wait(h, wait_interval=0.05, timeout=60)
        if end is None or not end.is_terminal() or len(end.elements or []) != N_ELEMENTS:
            raise AssertionError(f"{h}: ended {end and end.state} with the wrong elements")
        _until_driver_gone(h)  # (its work does not overlap the next trial)
        return dt / N_ELEMENTS

    def raw() -> float:
        return _raw_spawn(N_ELEMENTS) / N_ELEMENTS

    def measure(row: Row) -> None:
        fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs, warmup=1))
        whole, raw_whole = (N_ELEMENTS * 1e3 * (v or 0.0) for v in (row.shipyard, row.raw))
        row.note = (
            f"per element of {N_ELEMENTS:,}: validation, record, driver start ({whole:.0f} ms"
            f" whole; raw {raw_whole:.0f} ms); each array cancelled and ended before the next trial"
        )

    sec.measure(
        sec.row(
            f"array submit: run_array of {N_ELEMENTS:,} elements (local_cwd), per element",
            over_ms(2),
            raw_name="Popen(true) per element",
        ),
        measure,
    )


def _follow_rows(ctx: Ctx, sec: Section, runner: Any) -> None:
    n, cap = N_ELEMENTS, FOLLOW_PARALLEL
    res: dict[str, Any] = {}
    run: dict[str, float] = {}
    counts_file = os.path.join(ctx.tmp, "driver-counts.json")

    def follow(row: Row) -> None:
        run["raw"] = _raw_pool(n, cap)  # (the limit of the run row, measured first)
        submitted = time.time()
        with _driver_counted(counts_file):
            h = runner.run_array(_app(), "local_cwd", size=n, max_parallel=cap)
        try:
            p = subprocess.run(
                [ctx.python, "-m", "bench._worker", "array-follow", h, str(ctx.runs * 4)],
                capture_output=True, text=True, timeout=900, check=False,
            )  # fmt: skip
            if p.returncode != 0:
                raise RuntimeError(f"array-follow worker failed: {p.stderr.strip()[-300:]}")
            res.update(json.loads(p.stdout))
            _until_driver_gone(h)
            state_file = os.path.join(_array_dir(h).path, "state.json")
            run["shipyard"] = os.path.getmtime(state_file) - submitted  # (its driver's last write)
        except BaseException:
            runner.cancel(h)  # (nothing left running)
            _until_driver_gone(h)
            raise
        if res["end_state"] != "SUCCEEDED" or res["elements"] != n:
            raise AssertionError(f"{h} ended {res['end_state']} {res['end_counts']}")
        fill(row, {"shipyard": res["shipyard"], "raw": res["raw"]})
        pending = res["counts_last"].get("PENDING", 0)
        row.note = (
            f"{res['elements']:,} elements, state.json {res['state_bytes'] / 1024:.0f} KiB; read"
            f" while the array ran ({pending} elements still pending after the timed reads)"
        )

    def calls(row: Row) -> None:
        if not res:
            raise RuntimeError("no measurement (the status row failed)")
        total = sum(res["calls"].values())
        row.shipyard = total / res["reads"]
        row.raw = 0.0
        by_name = ", ".join(f"{k} {v}" for k, v in sorted(res["calls"].items())) or "none"
        row.note = (
            f"{total} scheduler calls ({by_name}) in {res['reads']} status reads of the array"
            f" ({res['timed_reads']} timed, {res['reads'] - res['timed_reads']} by runner.wait"
            f" over {res['wait_seconds']:.1f} s)"
        )

    def memory(row: Row) -> None:
        if not res:
            raise RuntimeError("no measurement (the status row failed)")
        row.shipyard = float(res["VmHWM"])
        row.raw = float(res["rss_before"])
        row.note = (
            f"peak RSS of the watcher process, {(row.shipyard - row.raw) / MIB:.1f} MiB over its"
            f" RSS before following ({row.raw / MIB:.1f} MiB, after imports)"
        )

    def whole_run(row: Row) -> None:
        if "shipyard" not in run:
            raise RuntimeError("no measurement (the status row failed)")
        row.shipyard, row.raw = run["shipyard"] / n, run["raw"] / n
        row.note = (
            f"{run['shipyard']:.1f} s submit -> last element recorded ended; raw"
            f" {run['raw']:.1f} s for the same {n:,} processes {cap} at a time (informational)"
        )

    sec.measure(
        sec.row(
            f"array follow: status of a running {n:,}-element array (fresh process)",
            ratio(3),
            raw_name="read + json.loads state.json",
        ),
        follow,
    )
    sec.measure(
        sec.row(
            f"array follow: scheduler calls per status read ({n:,} elements)",
            Target("abs", 1, "<= 1 call per poll"),
            "calls",
            raw_name="a file read: 0",
        ),
        calls,
    )
    sec.measure(
        sec.row(
            f"array follow: watcher memory, runner.wait of {n:,} elements to the end",
            at_most_mib(100),
            "MiB",
            raw_name="before following",
        ),
        memory,
    )

    def driver_calls(row: Row) -> None:
        if not os.path.exists(counts_file):
            raise RuntimeError("the driver wrote no counts (it did not end normally)")
        with open(counts_file) as f:
            counts = json.load(f)
        totals, per_look = counts["totals"], {int(k): v for k, v in counts["per_look"].items()}
        rounds, seconds = counts["rounds"], counts["seconds"]
        # a round is one status_many of every element it polls: a call per element (or a
        # look that asks the backend itself) shows as more calls than rounds
        row.shipyard, row.raw = totals.get("status_many", 0) / max(rounds, 1), 1.0
        looks = sum(per_look.values())
        row.note = (
            f"{totals.get('status_many', 0)} status_many in {rounds} poll rounds over"
            f" {seconds:.1f} s (each running element is polled soon after it starts, then every"
            f" 0.2 s); {looks} looks, by the status_many calls made while each ran: "
            + ", ".join(f"{v} with {k}" for k, v in sorted(per_look.items()))
            + f"; beneath them {totals.get('describe', 0)} local describes (each element"
            f" still running at a look); {totals.get('run', 0)} element submits, {totals.get('cancel', 0)} cancels"
        )
        if totals.get("run", 0) != n:
            row.status, row.note = "MISS", row.note + f"; expected {n} submits"

    sec.measure(
        sec.row(
            f"array run: driver's backend calls per poll round ({n:,} elements)",
            Target("abs", 1, "<= 1 call per poll"),
            "calls",
            raw_name="1 status_many",
        ),
        driver_calls,
    )
    sec.measure(
        sec.row(
            f"array run: {n:,} elements of true, max_parallel {cap}, submit -> ended, per element",
            None,
            raw_name=f"Popen pool of {cap}",
        ),
        whole_run,
    )


def run(ctx: Ctx) -> list[Row]:
    from core.runner import get_runner

    sec = Section("arrays", ctx.runs, ctx.verbose)
    with get_runner("bench") as runner:
        _submit_row(ctx, sec, runner)
        _follow_rows(ctx, sec, runner)
    return sec.rows


if __name__ == "__main__":
    sys.exit("run `python -m bench --only arrays`")
