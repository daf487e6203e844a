"""Put first on ``PYTHONPATH`` by :mod:`bench.arrays_bench` for one array's driver (with
``$SHIPYARD_BENCH_DRIVER_COUNTS`` naming a file): counts what the driver asks of the backend in
each look (``Driver.step``): ``Runner.status_many``/``run``/``cancel`` calls and the local
scheduler's ``describe`` calls beneath them, and the rounds of the process's status poller (the
thread that makes the ``status_many`` calls); writes them as JSON to that file at exit.

Any other process that imports it (the variable is unset) is left alone; the driver drops the
variable and this directory from its environment, so what it starts is never counted."""

from __future__ import annotations

import os
from typing import Any


def _install(out: str) -> None:
    import atexit
    import json
    import time
    from collections import Counter

    from core.arrays.driver import Driver
    from core.runner import Runner
    from core.schedulers.local.scheduler import LocalScheduler
    from core.watch.polling import status_poller

    totals: Counter[str] = Counter()
    per_look: Counter[int] = Counter()  # status_many calls in one look -> looks

    def counted(cls: Any, name: str) -> None:
        real = getattr(cls, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            totals[name] += 1
            return real(*args, **kwargs)

        setattr(cls, name, call)

    for name in ("status_many", "run", "cancel"):
        counted(Runner, name)
    for name in ("describe", "describe_many"):
        counted(LocalScheduler, name)
    real_step = Driver.step
    first_look: list[float] = []

    def step(self: Driver) -> bool:
        if not first_look:
            first_look.append(time.monotonic())
        before = totals["status_many"]
        try:
            return real_step(self)
        finally:
            per_look[totals["status_many"] - before] += 1

    Driver.step = step  # type: ignore[method-assign]

    def write() -> None:
        with open(out, "w") as f:
            seconds = time.monotonic() - first_look[0] if first_look else 0.0
            rounds = status_poller().rounds
            json.dump({"totals": totals, "per_look": per_look, "rounds": rounds,
                       "seconds": seconds, "pid": os.getpid()}, f)  # fmt: skip

    atexit.register(write)


def _main() -> None:
    out = os.environ.pop("SHIPYARD_BENCH_DRIVER_COUNTS", None)
    if not out:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p and p != here)
    _install(out)


_main()
