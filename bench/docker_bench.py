"""Docker rows: submit, describe/list, cancel and log_iter beside raw Docker SDK calls (the same
container requests, made with ``docker.APIClient`` directly) in the same run."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import LOG_REGEX, Ctx, measure_lines
from bench.harness import (
    Row,
    Section,
    Target,
    fill,
    interleave,
    ratio,
    repeat_timed,
    wait_for,
)

IMAGE = "shipyard-test/busybox:latest"
GRACE = 2  # stop_timeout of the cancel row, seconds
LABEL_APP_ID = "shipyard.app_id"
LABEL_SESSION = "shipyard.session"
SESSION = "benchdocker"


def problem() -> str | None:
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        try:
            client.images.get(IMAGE)
        except Exception:
            return f"image {IMAGE} is missing (scripts/build_test_images.sh)"
        finally:
            client.close()
    except Exception as e:
        return f"no Docker engine ({type(e).__name__}); start it with scripts/start_docker.sh"
    return None


def make_app(name: str, args: list[str], n: int = 1, mounts: list[Any] | None = None) -> Any:
    from core.specs import AppDef, Role

    return AppDef(
        name,
        [Role("r", image=IMAGE, entrypoint=args[0], args=args[1:], num_replicas=n,
              mounts=mounts or [])],
    )  # fmt: skip


def _state(desc: Any) -> Any:
    return None if desc is None else desc.state


def _cleanup(api: Any, app_id: str) -> None:
    """Removes every trace of an app at once (SIGKILL): clean-up is not what is measured."""
    flt = {"label": f"{LABEL_APP_ID}={app_id}"}
    for c in api.containers(all=True, filters=flt):
        try:
            api.remove_container(c["Id"], force=True)
        except Exception:
            pass
    for n in api.networks(filters=flt):
        try:
            api.remove_network(n["Id"])
        except Exception:
            pass
    for v in api.volumes(filters=flt).get("Volumes") or []:
        try:
            api.remove_volume(v["Name"], force=True)
        except Exception:
            pass


ROWS: list[tuple[str, Target | None, str]] = [
    ("submit 1 replica (all started)", ratio(1.1), "ms"),
    ("submit 8 replicas (all started)", ratio(0.7), "ms"),
    ("describe (8 replicas, running)", ratio(1.5), "ms"),
    ("list (session)", ratio(1.5), "ms"),
    (f"cancel 8 replicas ignoring SIGTERM (grace {GRACE}s)", None, "ms"),
    ("log_iter 200k lines", ratio(1.5), "ms"),
    ("log_iter 200k lines with regex", ratio(1.5), "ms"),
]


def run(ctx: Ctx) -> list[Row]:
    sec = Section("docker", ctx.runs, ctx.verbose)
    why = problem()
    if why:
        sec.skip_all(why, ROWS)
        return sec.rows

    import docker

    from core.runner import get_runner
    from core.schedulers import get_scheduler_factories
    from core.schedulers.docker.submit import create_args
    from core.specs import AppState, BindMount

    client = docker.from_env()
    api = client.api
    runner = get_runner(SESSION)
    sched: Any = get_scheduler_factories()["local_docker"](SESSION)
    cfg: dict[str, Any] = {"stop_timeout": GRACE}

    # -- submit ------------------------------------------------------------------------------
    for n, target in ((1, ratio(1.1)), (8, ratio(0.7))):

        def submit_row(row: Row, n: int = n) -> None:
            app = make_app("bdsub", ["sleep", "600"], n)

            def shipyard() -> float:
                t0 = time.perf_counter()
                h = runner.run(app, "local_docker", cfg)
                dt = time.perf_counter() - t0
                app_id = h.rsplit("/", 1)[1]
                running = api.containers(filters={"label": f"{LABEL_APP_ID}={app_id}"})
                assert len(running) == n, f"{len(running)} of {n} containers running"
                _cleanup(api, app_id)
                return dt

            def raw() -> float:
                # the very same container requests shipyard makes, through the SDK directly
                info = sched.submit_dryrun(app, cfg)
                req = info.request
                kwargs = [create_args(api, c) for c in req.containers]
                net = req.containers[0].kwargs.get("network")
                t0 = time.perf_counter()
                if net:
                    api.create_network(str(net), driver="bridge",
                                       labels={LABEL_APP_ID: req.app_id})  # fmt: skip
                for kw in kwargs:
                    api.start(api.create_container(**kw)["Id"])
                dt = time.perf_counter() - t0
                _cleanup(api, req.app_id)
                return dt

            fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs, warmup=1))

        name = "submit 1 replica (all started)" if n == 1 else f"submit {n} replicas (all started)"
        raw_name = "create+start" if n == 1 else "network + serial create+start"
        sec.measure(sec.row(name, target, raw_name=raw_name), submit_row)

    # -- describe / list -----------------------------------------------------------------------
    h = runner.run(make_app("bddesc", ["sleep", "600"], 8), "local_docker", cfg)
    app_id = h.rsplit("/", 1)[1]
    try:
        wait_for(lambda: _state(sched.describe(app_id)) == AppState.RUNNING, 30, "RUNNING")

        def describe_row(row: Row) -> None:
            def ship_once() -> None:
                d = sched.describe(app_id)
                assert d is not None and d.state == AppState.RUNNING

            def raw_once() -> None:
                cs = api.containers(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})
                assert len(cs) == 8

            fill(row, interleave({"shipyard": lambda: repeat_timed(ship_once, 5),
                                  "raw": lambda: repeat_timed(raw_once, 5)},
                                 ctx.runs * 2, warmup=2))  # fmt: skip

        sec.measure(
            sec.row("describe (8 replicas, running)", ratio(1.5),
                    raw_name="1 label-filtered container list"),
            describe_row,
        )  # fmt: skip

        def list_row(row: Row) -> None:
            def ship_once() -> None:
                apps = sched.list()
                assert any(a.app_id == app_id for a in apps)

            def raw_once() -> None:
                cs = api.containers(all=True, filters={"label": f"{LABEL_SESSION}={SESSION}"})
                assert cs

            fill(row, interleave({"shipyard": lambda: repeat_timed(ship_once, 5),
                                  "raw": lambda: repeat_timed(raw_once, 5)},
                                 ctx.runs * 2, warmup=2))  # fmt: skip

        sec.measure(
            sec.row("list (session)", ratio(1.5), raw_name="1 label-filtered container list"),
            list_row,
        )
    finally:
        _cleanup(api, app_id)

    # -- cancel --------------------------------------------------------------------------------
    def cancel_row(row: Row) -> None:
        # `trap '' TERM` also makes the sleeps ignore SIGTERM: only SIGKILL after the grace ends it
        app = make_app("bdcancel", ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"], 8)

        def shipyard() -> float:
            h = runner.run(app, "local_docker", cfg)
            a = h.rsplit("/", 1)[1]
            wait_for(lambda: _state(sched.describe(a)) == AppState.RUNNING, 30, "RUNNING")
            time.sleep(0.3)  # the trap is set
            t0 = time.perf_counter()
            runner.cancel(h)
            st = runner.status(h)
            dt = time.perf_counter() - t0
            assert st is not None and st.state == AppState.CANCELLED, st
            _cleanup(api, a)
            return dt

        def raw() -> float:
            # the same 8 containers, stopped (same grace) and removed in parallel with the SDK
            info = sched.submit_dryrun(app, cfg)
            req = info.request
            net = req.containers[0].kwargs.get("network")
            api.create_network(str(net), driver="bridge", labels={LABEL_APP_ID: req.app_id})
            cids = []
            for c in req.containers:
                cids.append(api.create_container(**create_args(api, c))["Id"])
                api.start(cids[-1])
            time.sleep(0.3)

            def stop_remove(cid: str) -> None:
                api.stop(cid, timeout=GRACE)
                api.remove_container(cid, force=True)

            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=len(cids)) as pool:
                list(pool.map(stop_remove, cids))
            api.remove_network(str(net))
            dt = time.perf_counter() - t0
            _cleanup(api, req.app_id)
            return dt

        fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs, warmup=0))

    sec.measure(
        sec.row(
            f"cancel 8 replicas ignoring SIGTERM (grace {GRACE}s) -> CANCELLED",
            Target("abs", GRACE + 1.0, f"<= grace + 1 s ({GRACE + 1:g} s)"),
            raw_name="parallel SDK stop+remove of the 8 + network",
        ),
        cancel_row,
    )

    # -- log_iter ------------------------------------------------------------------------------
    expected = ctx.log_lines()
    src = ctx.log_file()
    h = runner.run(
        make_app("bdlog", ["cat", "/data/lines.txt"],
             mounts=[BindMount(src_path=src, dst_path="/data/lines.txt", read_only=True)]),
        "local_docker", cfg,
    )  # fmt: skip
    app_id = h.rsplit("/", 1)[1]
    try:
        st = runner.wait(h, wait_interval=0.1, timeout=120)
        if st is None or st.state != AppState.SUCCEEDED:
            raise RuntimeError(f"log app ended {st}")
        cname = next(
            c["Names"][0].lstrip("/")
            for c in api.containers(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})
        )
        pat = re.compile(LOG_REGEX)
        for regex in (None, LOG_REGEX):

            def log_row(row: Row, regex: str | None = regex) -> None:
                want = expected if regex is None else [x for x in expected if pat.search(x)]

                def raw() -> list[str]:
                    data = api.logs(cname, stdout=True, stderr=True)
                    lines = data.decode("utf-8", "replace").splitlines(keepends=True)
                    return [x for x in lines if pat.search(x)] if regex else lines

                measure_lines(
                    row,
                    lambda: sched.log_iter(app_id, "r", 0, regex=regex),
                    raw,
                    want,
                    ctx.runs,
                    warmup=0,  # seconds per run: the engine's log decoding dominates
                )

            sec.measure(
                sec.row(f"log_iter 200k lines{' with regex' if regex else ''}", ratio(1.5),
                        raw_name="SDK logs() + splitlines" + (" + re" if regex else "")),
                log_row,
            )  # fmt: skip
    finally:
        _cleanup(api, app_id)
    runner.close()
    client.close()
    return sec.rows
