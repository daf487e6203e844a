"""The cost curves of the Docker engine and the Slurm cluster (see :mod:`bench.curves_bench`):
``list`` of ended Docker apps, and ``status_many`` of running apps on each, with the backend
calls each poll makes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from bench import docker_bench, slurm_bench
from bench.common import Ctx
from bench.curves_bench import DOCKER_LIST, RUNNING, SESSION, Point, calls_row, curve
from bench.harness import Section, interleave, median, repeat_timed, wait_for

# the rig's engine gives the default bridge a /24 (scripts/start_docker.sh): 254 addresses, so
# running containers top out below 1,000 there; 1x/10x/100x of 2 instead
DOCKER_RUNNING = (2, 20, 200)


@contextmanager
def _docker_calls(counts: list[int]) -> Iterator[None]:
    """Counts the HTTP requests every Docker API client of this process sends meanwhile."""
    from docker import APIClient

    real = APIClient.send

    def send(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts[0] += 1
        return real(self, *args, **kwargs)

    APIClient.send = send  # type: ignore[method-assign]
    try:
        yield
    finally:
        APIClient.send = real  # type: ignore[method-assign]


def _counted(fn: Callable[[], object], polls: int) -> float:
    counts = [0]
    with _docker_calls(counts):
        for _ in range(polls):
            fn()
    return counts[0] / polls


def docker_curves(ctx: Ctx, sec: Section) -> None:
    problem = docker_bench.problem()
    if problem:
        for name in ("docker list, ended apps", "docker status_many, running apps"):
            row = sec.row(name, None)
            row.status, row.note = "SKIP", f"skipped: {problem}"
        return
    import docker

    from core.runner import get_runner
    from core.schedulers import get_scheduler_factories

    api = docker.from_env().api
    runner = get_runner(SESSION)
    sched: Any = get_scheduler_factories()["local_docker"](SESSION)
    try:
        _docker_list(ctx, sec, api, runner, sched)
        _cleanup(api)
        _docker_running(ctx, sec, api, runner)
    finally:
        _cleanup(api)
        sched.close()
        runner.close()


def _submit_many(runner: Any, app: Any, n: int) -> list[str]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda _: runner.run(app, "local_docker"), range(n)))


def _docker_list(ctx: Ctx, sec: Section, api: Any, runner: Any, sched: Any) -> None:
    """``list`` of the session's 100 / 1,000 ended apps beside the engine's list of their
    containers (one call)."""
    app = docker_bench.make_app("bclist", ["true"])
    handles: list[str] = []
    session = {"label": f"shipyard.session={SESSION}"}
    calls: dict[int, float] = {}

    def point(n: int) -> Point:
        handles.extend(_submit_many(runner, app, n - len(handles)))
        wait_for(lambda: all(s is not None and s.is_terminal()
                             for s in runner.status_many(handles).values()),
                 600, f"{n} Docker apps to end")  # fmt: skip

        def once() -> None:
            got = sched.list()
            if len(got) != n:
                raise AssertionError(f"list gave {len(got)} apps, expected {n}")

        s = interleave({"shipyard": lambda: repeat_timed(once, 1),
                        "raw": lambda: repeat_timed(lambda: api.containers(all=True,
                                                                           filters=session), 1)},
                       ctx.runs, warmup=1)  # fmt: skip
        calls[n] = _counted(once, 3)
        return median(s["shipyard"]), median(s["raw"]), f"{calls[n]:g} engine calls"

    curve(sec, "docker list, ended apps", DOCKER_LIST, point, raw_name="1 containers list")
    calls_row(sec, "docker list, ended apps", DOCKER_LIST, calls, 2)


def _docker_running(ctx: Ctx, sec: Section, api: Any, runner: Any) -> None:
    """``status_many`` of 10 / 100 / 1,000 running apps from a process that did not submit them,
    beside the engine's list of every Shipyard container (the one call it needs)."""
    from core.runner import get_runner
    from core.specs import AppState

    app = docker_bench.make_app("bcrun", ["sleep", "3600"])
    handles: list[str] = []
    calls: dict[int, float] = {}

    def point(n: int) -> Point:
        handles.extend(_submit_many(runner, app, n - len(handles)))
        watcher = get_runner(SESSION)

        def once() -> None:
            got = watcher.status_many(handles)
            if not all(s is not None and s.state == AppState.RUNNING for s in got.values()):
                raise AssertionError("an app is not RUNNING")

        def raw() -> object:
            return api.containers(all=True, filters={"label": docker_bench.LABEL_APP_ID})

        s = interleave({"shipyard": lambda: repeat_timed(once, 1),
                        "raw": lambda: repeat_timed(raw, 1)}, ctx.runs, warmup=1)  # fmt: skip
        calls[n] = _counted(once, 3)
        watcher.close()
        return median(s["shipyard"]), median(s["raw"]), f"{calls[n]:g} engine calls"

    curve(sec, "docker status_many, running apps", DOCKER_RUNNING, point,
          raw_name="1 containers list")  # fmt: skip
    calls_row(sec, "docker status_many, running apps", DOCKER_RUNNING, calls, 1)


def _cleanup(api: Any) -> None:
    """Removes the session's containers, networks and volumes (not what is measured)."""
    flt = {"label": f"shipyard.session={SESSION}"}
    ids = [c["Id"] for c in api.containers(all=True, filters=flt)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: _quietly(api.remove_container, i, force=True), ids))
    for net in api.networks(filters=flt):
        _quietly(api.remove_network, net["Id"])
    for vol in api.volumes(filters=flt).get("Volumes") or []:
        _quietly(api.remove_volume, vol["Name"], force=True)


def _quietly(fn: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:
        pass


def slurm_curves(ctx: Ctx, sec: Section) -> None:
    """``status_many`` of 10 / 100 / 1,000 held Slurm jobs (active for as long as the rows run,
    without taking the nodes) beside one squeue of the same query; the CLI calls per poll."""
    name = "slurm status_many, active jobs"
    problem = slurm_bench.problem()
    if problem:
        row = sec.row(name, None)
        row.status, row.note = "SKIP", f"skipped: {problem}"
        return
    from core.runner import get_runner
    from core.schedulers import get_scheduler_factories
    from core.schedulers.slurm.jobinfo import SQUEUE_FORMAT
    from core.specs import AppState

    workdir = os.path.join(ctx.tmp, "slurm-curves")
    os.makedirs(workdir, exist_ok=True)
    sched = get_scheduler_factories()["slurm"](SESSION)
    script = sched.submit_dryrun(slurm_bench.make_app("bcheld", ["sleep", "3600"]), {}).request
    text = script.materialize()
    counter = slurm_bench.CallCounter(ctx.tmp)
    jobs: list[str] = []
    calls: dict[int, float] = {}

    def point(n: int) -> Point:
        jobs.extend(slurm_bench.sbatch(text, "--hold", f"--chdir={workdir}")
                    for _ in range(n - len(jobs)))  # fmt: skip
        handles = [f"slurm://{SESSION}/{j}" for j in jobs]
        watcher = get_runner(SESSION)

        def once() -> None:
            got = watcher.status_many(handles)
            if not all(s is not None and s.state == AppState.PENDING for s in got.values()):
                raise AssertionError("a held job is not PENDING")

        def raw() -> None:
            subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(jobs),
                            "-O", SQUEUE_FORMAT], capture_output=True, check=True)  # fmt: skip

        s = interleave({"shipyard": lambda: repeat_timed(once, 1),
                        "raw": lambda: repeat_timed(raw, 1)}, ctx.runs, warmup=1)  # fmt: skip
        with counter.counting() as c:
            for _ in range(3):
                once()
        calls[n] = sum(c[k] for k in ("squeue", "sacct", "scontrol")) / 3
        watcher.close()
        return median(s["shipyard"]), median(s["raw"]), f"{calls[n]:g} CLI calls"

    try:
        curve(sec, name, RUNNING, point, raw_name="1 squeue of the same query")
        calls_row(sec, name, RUNNING, calls, 1)
    finally:
        for k in range(0, len(jobs), 500):
            slurm_bench.scancel(jobs[k : k + 500])
        sched.close()
