"""Airflow rows: 1,000 deferred tasks' triggers in one triggerer event loop, and the latency
of a job's line reaching the task log (deferred and blocking), on local apps."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import Ctx
from bench.harness import MIB, Row, Section, SkipRow, Target, at_most_mib, exactly, repeat_timed

N_TRIGGERS = 1000
INTERVAL = 5.0  # the operator's default poll interval
WINDOW = 30.0  # seconds of steady state measured
LATENCY_LINES = 100


def _worker(ctx: Ctx, *args: str, timeout: float = 600) -> dict[str, Any]:
    p = subprocess.run(
        [ctx.python, "-m", "bench._worker", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"{args[0]} worker failed: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def _app(name: str, entrypoint: str, args: list[str]) -> Any:
    from core.specs import AppDef, Role

    return AppDef(name, [Role("r", entrypoint=entrypoint, args=args)])


def _load_rows(ctx: Ctx, sec: Section, runner: Any) -> None:
    sleeper = _app("btrig", "sleep", ["600"])
    handles = [runner.run(sleeper, "local_cwd") for _ in range(N_TRIGGERS)]
    try:
        handles_file = os.path.join(ctx.tmp, "trigger-handles.txt")
        with open(handles_file, "w") as f:
            f.write("\n".join(handles))
        res: dict[str, Any] = {}

        def calls(row: Row) -> None:
            res.update(_worker(ctx, "trigger-load", handles_file, str(INTERVAL), str(WINDOW)))
            if res["events"] or res["triggers"] != N_TRIGGERS:
                raise RuntimeError(f"unexpected trigger run: {res}")
            res["raw_call"] = repeat_timed(lambda: runner.status_many(handles), 1)
            row.shipyard = res["calls"] / res["ticks"]
            row.raw = 1.0
            row.note = f"{res['calls']} status_many calls in {res['ticks']} ticks of {INTERVAL:g} s"

        def cpu(row: Row) -> None:
            row.shipyard = 100 * res["cpu_fraction"]
            row.raw = 100 * res["raw_call"] / INTERVAL
            row.note = f"over {WINDOW:g} s; raw: one status_many of the {N_TRIGGERS} apps per tick"

        def memory(row: Row) -> None:
            row.shipyard = float(res["VmHWM"])
            row.raw = float(res["rss_before"])
            row.note = (
                f"peak RSS; raw: the same process before its triggers ({row.raw / MIB:.0f} MiB)"
            )

        sec.measure(sec.row(f"{N_TRIGGERS} triggers, {INTERVAL:g} s poll: backend calls per poll",
                            exactly(1, "call"), "calls", raw_name="1 status_many"), calls)  # fmt: skip
        sec.measure(sec.row(f"{N_TRIGGERS} triggers, {INTERVAL:g} s poll: event loop CPU",
                            Target("abs", 10, "<= 10% of a core"), "%",
                            raw_name="the backend call alone"), cpu)  # fmt: skip
        sec.measure(sec.row(f"{N_TRIGGERS} triggers: triggerer process memory", at_most_mib(200),
                            "MiB", raw_name="before the triggers"), memory)  # fmt: skip
    finally:
        for h in handles:
            runner.cancel(h)


def _latency_rows(ctx: Ctx, sec: Section, runner: Any) -> None:
    # (the replica starts printing once the measuring process had time to start following)
    script = (
        "import time\n"
        "time.sleep(8)\n"
        f"for _ in range({LATENCY_LINES}):\n"
        "    print(time.time(), flush=True); time.sleep(0.05)\n"
    )
    for mode in ("deferrable", "blocking"):

        def latency(row: Row, mode: str = mode) -> None:
            handle = runner.run(_app("blat", sys.executable, ["-c", script]), "local_cwd")
            delays = _worker(ctx, "line-latency", handle, mode)["delays"]
            if len(delays) != LATENCY_LINES:
                raise RuntimeError(f"{len(delays)} of {LATENCY_LINES} lines logged")
            p99 = sorted(delays)[int(0.99 * len(delays)) - 1]
            row.shipyard = statistics.median(delays)
            row.raw = 0.0
            row.note = (
                f"p99 {p99 * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms; {len(delays)} lines"
            )
            if p99 > INTERVAL:
                row.status, row.note = "MISS", row.note + f"; p99 over {INTERVAL:g} s"

        sec.measure(sec.row(f"line printed -> in the task log ({mode}): median",
                            Target("abs", INTERVAL, f"<= 1 poll ({INTERVAL:g} s), p99 too"),
                            raw_name="printed"), latency)  # fmt: skip


def run(ctx: Ctx) -> list[Row]:
    sec = Section("airflow", ctx.runs, ctx.verbose)
    if importlib.util.find_spec("airflow") is None:
        sec.skip_all("apache-airflow is not installed", [("all rows", None, "")])
        return sec.rows
    from core.runner import get_runner

    with get_runner("bench-airflow") as runner:
        t0 = time.monotonic()
        try:
            _load_rows(ctx, sec, runner)
        except SkipRow as e:
            sec.skip_all(str(e), [("trigger load", None, "")])
        _latency_rows(ctx, sec, runner)
        if ctx.verbose:
            print(f"  airflow section: {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return sec.rows
