"""The fresh processes of the cost curves (``bench.curves_bench``); each prints JSON on stdout.

python -m bench.curves_worker make-local N SESSION   # N local apps of `true`, all ended
python -m bench.curves_worker follow-mem HANDLES_FILE  # a watch per handle, in one event loop
python -m bench.curves_worker follow-mem-raw N         # N bare asyncio tasks (the floor)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def make_local(n: int, session: str) -> dict[str, Any]:
    """Runs ``n`` local apps of ``true`` and waits until each has ended and its logs are
    collected (a state directory such as a long-used machine has)."""
    from core.runner import get_runner
    from core.specs import AppDef, AppState, Role

    app = AppDef("bcurve", [Role("r", entrypoint="true")])
    t0 = time.monotonic()
    with get_runner(session, cache_size=n + 1) as runner:
        handles = [runner.run(app, "local_cwd") for _ in range(n)]
        deadline = time.monotonic() + 30 + n * 0.05
        while True:
            statuses = runner.status_many(handles)
            if all(s is not None and s.is_terminal() for s in statuses.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} local apps did not all end")
            time.sleep(0.1)
        bad = [h for h, s in statuses.items() if s is None or s.state != AppState.SUCCEEDED]
        if bad:
            raise AssertionError(f"{len(bad)} apps did not succeed, e.g. {bad[0]}")
    return {"apps": n, "seconds": time.monotonic() - t0}


def follow_mem(handles_file: str) -> dict[str, Any]:
    """One :class:`~core.watch.JobWatch` per handle on one event loop (as a triggerer or the
    Prefect worker follows its jobs), through the process's one status poller: the RSS
    before and once every watch has been answered by three rounds of the poller."""
    import faulthandler

    from core.runner import get_runner
    from core.watch import JobWatch, status_poller

    # a worker that hangs shows where, before the section's 180 s timeout kills it
    faulthandler.dump_traceback_later(170, exit=True)
    with open(handles_file) as f:
        handles = f.read().split()
    runner = get_runner("benchfollow")
    runner.status(handles[0])  # (the scheduler made and imported before the first figure)

    async def run() -> dict[str, Any]:
        before = _rss()
        watches = [JobWatch(runner, h, poll_interval=0.5, first_delay=0.1) for h in handles]
        tasks = [asyncio.create_task(w.run_async()) for w in watches]
        start = status_poller().rounds
        while status_poller().rounds < start + 3:
            await asyncio.sleep(0.05)
        ended = [t for t in tasks if t.done()]
        after = _rss()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"watches": len(tasks), "ended_early": len(ended), "before": before, "after": after}

    return asyncio.run(run())


def follow_mem_raw(n: int) -> dict[str, Any]:
    """``n`` asyncio tasks each waiting on an event: what following costs at the least."""
    import core.runner  # noqa: F401  (the same imports as the shipyard side)

    async def run() -> dict[str, Any]:
        before = _rss()
        gate = asyncio.Event()
        tasks = [asyncio.create_task(gate.wait()) for _ in range(n)]
        await asyncio.sleep(0.2)
        after = _rss()
        gate.set()
        await asyncio.gather(*tasks)
        return {"watches": n, "before": before, "after": after}

    return asyncio.run(run())


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "make-local":
        res: object = make_local(int(argv[1]), argv[2])
    elif cmd == "follow-mem":
        res = follow_mem(argv[1])
    elif cmd == "follow-mem-raw":
        res = follow_mem_raw(int(argv[1]))
    else:
        print(f"unknown command {cmd!r}; see {__doc__}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    sys.stdout.flush()
    os._exit(0)  # (the watches' poller thread is not waited for)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
