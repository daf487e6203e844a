"""Measurements that must run in a fresh process; prints JSON samples on stdout.

python -m bench._worker local-describe APP_ID RUNS cold|warm
python -m bench._worker mem-shipyard N
python -m bench._worker mem-raw N
python -m bench._worker airflow-triggers HANDLES_FILE SECONDS
python -m bench._worker trigger-load HANDLES_FILE INTERVAL SECONDS
python -m bench._worker line-latency HANDLE deferrable|blocking
python -m bench._worker array-follow HANDLE RUNS
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _rss() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":", 1)
                out[key] = int(val.split()[0]) * 1024
    return out


def local_describe(app_id: str, runs: int, mode: str) -> dict[str, list[float]]:
    from bench.harness import interleave, repeat_timed
    from core.schedulers.local_scheduler import create_cwd_scheduler, state_dir
    from core.specs import AppState

    app_file = os.path.join(state_dir(), app_id, "app.json")
    inner = 20

    def raw_once() -> None:
        with open(app_file, "rb") as f:
            summary = json.loads(f.read())
        for rep in summary["replicas"]:
            os.kill(rep["pid"], 0)

    def raw() -> float:
        return repeat_timed(raw_once, inner)

    if mode == "cold":

        def shipyard() -> float:
            total = 0.0
            for _ in range(inner):
                sched = create_cwd_scheduler("bench")
                t0 = time.perf_counter()
                desc = sched.describe(app_id)
                total += time.perf_counter() - t0
                sched.close()
                assert desc is not None and desc.state == AppState.RUNNING, desc
            return total / inner

    else:
        sched = create_cwd_scheduler("bench")

        def once() -> None:
            desc = sched.describe(app_id)
            assert desc is not None and desc.state == AppState.RUNNING, desc

        def shipyard() -> float:
            return repeat_timed(once, inner)

    return interleave({"shipyard": shipyard, "raw": raw}, runs, warmup=2)


def mem_shipyard(n: int) -> dict[str, int]:
    from core.runner import get_runner
    from core.specs import AppDef, Role

    app = AppDef("bmem", [Role("r", entrypoint="true")])
    with get_runner("benchmem", cache_size=n) as runner:
        handles = [runner.run(app, "local_cwd") for _ in range(n)]
        deadline = time.monotonic() + 300
        while True:
            statuses = runner.status_many(handles)
            if all(s is not None and s.is_terminal() for s in statuses.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("apps did not finish")
            time.sleep(0.05)
        bad = [h for h, s in statuses.items() if s is None or s.state.name != "SUCCEEDED"]
        if bad:
            raise AssertionError(f"{len(bad)} apps did not succeed, e.g. {bad[0]}")
        # tracking: every app described again, from this process's scheduler
        statuses = runner.status_many(handles)
        assert len(statuses) == n
        return _rss()


def mem_raw(n: int) -> dict[str, int]:
    import subprocess

    import core.runner  # noqa: F401  (the same imports as the shipyard side)

    procs = [subprocess.Popen(["true"]) for _ in range(n)]
    for p in procs:
        p.wait()
    return _rss()


def _airflow_home() -> None:
    import tempfile

    home = tempfile.mkdtemp(prefix="shipyard-bench-airflow-")
    os.environ.update(
        {
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        }
    )


def airflow_triggers(handles_file: str, seconds: float) -> dict[str, int]:
    """One ShipyardJobTrigger per handle in one event loop (as in a triggerer), for ``seconds``;
    returns how many batched status polls they made."""
    import asyncio

    _airflow_home()
    from airflow_provider.triggers import ShipyardJobTrigger
    from core.watch import status_poller

    with open(handles_file) as f:
        handles = f.read().split()

    async def run() -> dict[str, int]:
        triggers = [ShipyardJobTrigger(h, poll_interval=0.5) for h in handles]

        async def drive(t: ShipyardJobTrigger) -> object:
            async for event in t.run():
                return event
            return None

        tasks = [asyncio.create_task(drive(t)) for t in triggers]
        await asyncio.sleep(seconds)
        poller = status_poller()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        events = [r for r in results if not isinstance(r, BaseException)]
        await asyncio.sleep(0.5)  # a poll still in its thread ends
        return {"triggers": len(triggers), "polls": poller.rounds, "events": len(events)}

    return asyncio.run(run())


def trigger_load(handles_file: str, interval: float, seconds: float) -> dict[str, float]:
    """One ShipyardJobTrigger per handle in one event loop, polling every ``interval`` s: after
    a first full round, the process's CPU seconds over ``seconds``, its peak memory, and the
    backend calls (``status_many``) made meanwhile."""
    import asyncio
    import resource

    _airflow_home()
    from airflow_provider.triggers import ShipyardJobTrigger
    from core.runner import Runner
    from core.watch import status_poller

    with open(handles_file) as f:
        handles = f.read().split()
    calls = [0]
    real = Runner.status_many

    def counting(self: Runner, hs: object) -> object:
        calls[0] += 1
        return real(self, hs)  # type: ignore[arg-type]

    Runner.status_many = counting  # type: ignore[assignment,method-assign]

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    async def drive(t: ShipyardJobTrigger) -> object:
        async for event in t.run():
            return event
        return None

    async def run() -> dict[str, float]:
        rss_before = _rss()["VmRSS"]
        tasks = [
            asyncio.create_task(drive(ShipyardJobTrigger(h, poll_interval=interval)))
            for h in handles
        ]
        while status_poller().rounds < 3:
            await asyncio.sleep(0.1)
        await asyncio.sleep(2 * interval)  # every watch's fast first polls are over
        # the window: whole intervals from the middle of one (the poller polls on the ticks,
        # the multiples of the interval on the monotonic clock), so it holds exactly
        # seconds / interval ticks
        now = time.monotonic()
        await asyncio.sleep((now // interval + 1.5) * interval - now)
        c0, n0, t0 = cpu(), calls[0], time.monotonic()
        await asyncio.sleep(round(seconds / interval) * interval)
        c1, n1, t1 = cpu(), calls[0], time.monotonic()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        events = sum(not isinstance(r, BaseException) for r in results)
        return {
            "triggers": len(tasks),
            "cpu_fraction": (c1 - c0) / (t1 - t0),
            "calls": n1 - n0,
            "ticks": int(t1 // interval - t0 // interval),  # the poller polls on these
            "rss_before": rss_before,
            "rounds": status_poller().rounds,
            "events": events,
            **_rss(),
        }

    return asyncio.run(run())


def line_latency(handle: str, mode: str) -> dict[str, list[float]]:
    """Seconds from a replica printing ``<time.time()>`` to the line being logged: by a
    deferred task's trigger (``deferrable``) or the blocking operator's follower."""
    import asyncio

    _airflow_home()
    delays: list[float] = []

    class Recorder:
        def info(self, msg: str, *args: object) -> None:
            text = str(args[0]) if args else msg
            stamp = text.rsplit(" ", 1)[-1]
            if stamp.replace(".", "", 1).isdigit():
                delays.append(time.time() - float(stamp))

        def warning(self, msg: str, *args: object) -> None:
            print(msg % args if args else msg, file=sys.stderr)

    if mode == "deferrable":
        from airflow_provider.triggers import ShipyardJobTrigger

        trigger = ShipyardJobTrigger(handle, poll_interval=5.0, stream_logs=True)
        trigger._log = Recorder()  # type: ignore[assignment]  # (the task log, in a triggerer)

        async def drive() -> None:
            async for _ in trigger.run():
                return

        asyncio.run(drive())
    else:
        from core.runner import get_runner
        from core.watch import JobWatch

        recorder = Recorder()
        with get_runner() as runner:  # (as the blocking operator follows it)
            JobWatch(
                runner, handle, logs=True, on_line=lambda line: recorder.info("%s", line)
            ).run()
    return {"delays": delays}


#: the scheduler methods that reach the backend (counted by ``array-follow``)
BACKEND_METHODS = (
    "submit", "schedule", "submit_dryrun", "describe", "describe_many", "list", "exists",
    "find_by_idempotency_key", "log_iter", "cancel", "read_results",
)  # fmt: skip


def array_follow(handle: str, runs: int) -> dict[str, Any]:
    """Follows the array ``handle`` from a fresh process, as a watcher does: ``runs`` rounds of
    timed ``runner.status(handle)`` beside reading and parsing the array's ``state.json``, then
    ``runner.wait(handle)`` to its end; counts the status reads of the array and every call
    into a scheduler meanwhile (outermost calls only: ``describe_many`` is one), and gives the
    process's RSS before following and at its peak."""
    from collections import Counter

    from bench.harness import interleave, repeat_timed
    from core import arrays
    from core.runner import Runner, get_runner
    from core.schedulers.local.scheduler import LocalScheduler
    from core.specs import parse_app_handle

    runner = get_runner("bench")
    p = parse_app_handle(handle)
    deadline = time.monotonic() + 60
    while (adir := arrays.open_array(p.scheduler_backend, p.session_name, p.app_id)) is None or (
        adir.state() is None
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{handle}: no state.json after 60 s")
        time.sleep(0.01)
    state_file = os.path.join(adir.path, "state.json")
    rss_before = _rss()["VmRSS"]

    calls: Counter[str] = Counter()
    depth = [0]

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                calls[name] += 1
            depth[0] += 1
            try:
                return real(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for name in BACKEND_METHODS:
        setattr(LocalScheduler, name, counted(name, getattr(LocalScheduler, name)))
    reads = [0]
    real_status = Runner.status

    def status(self: Runner, h: str) -> Any:
        if h == handle:
            reads[0] += 1
        return real_status(self, h)

    Runner.status = status  # type: ignore[assignment,method-assign]

    first = runner.status(handle)
    if first is None or first.elements is None or first.is_terminal():
        raise RuntimeError(f"{handle}: not a running array ({first and first.state})")
    inner = 10

    def raw_once() -> None:
        with open(state_file, "rb") as f:
            json.loads(f.read())

    samples = interleave(
        {
            "shipyard": lambda: repeat_timed(lambda: runner.status(handle), inner),
            "raw": lambda: repeat_timed(raw_once, inner),
        },
        runs,
        warmup=1,
    )
    last = runner.status(handle)
    timed_reads, timed_calls = reads[0], sum(calls.values())
    t0 = time.monotonic()
    end = runner.wait(handle, timeout=600)
    waited = time.monotonic() - t0
    if end is None:
        raise RuntimeError(f"{handle}: unknown at its end")
    return {
        **samples,
        "elements": len(first.elements),
        "state_bytes": os.path.getsize(state_file),
        "counts_first": first.counts(),
        "counts_last": None if last is None else last.counts(),
        "timed_reads": timed_reads,
        "timed_calls": timed_calls,
        "reads": reads[0],
        "calls": dict(calls),
        "wait_seconds": waited,
        "end_state": end.state.name,
        "end_counts": end.counts(),
        "rss_before": rss_before,
        **_rss(),
    }


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "local-describe":
        res: object = local_describe(argv[1], int(argv[2]), argv[3])
    elif cmd == "mem-shipyard":
        res = mem_shipyard(int(argv[1]))
    elif cmd == "mem-raw":
        res = mem_raw(int(argv[1]))
    elif cmd == "airflow-triggers":
        res = airflow_triggers(argv[1], float(argv[2]))
    elif cmd == "trigger-load":
        res = trigger_load(argv[1], float(argv[2]), float(argv[3]))
    elif cmd == "line-latency":
        res = line_latency(argv[1], argv[2])
    elif cmd == "array-follow":
        res = array_follow(argv[1], int(argv[2]))
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
