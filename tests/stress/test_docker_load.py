"""Docker under load: 50 apps x 2 replicas submitted at once and polled from 8 threads while they
run. No submit fails, describe is never wrong (no app unknown, no state going backwards, no
terminal state other than the real one), every exit code and log line is right, and nothing is
left behind once the apps are purged; polling many apps costs one engine call per poll."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from core.runner import get_runner
from core.schedulers.api import Stream
from core.specs import AppDef, AppState, Role, is_terminal, parse_app_handle
from tests.stress.conftest import scaled

N_APPS = scaled(50)
IMAGE = "shipyard-test/busybox:latest"
ORDER = {
    AppState.UNSUBMITTED: 0,
    AppState.SUBMITTED: 1,
    AppState.PENDING: 2,
    AppState.RUNNING: 3,
    AppState.SUCCEEDED: 4,
    AppState.FAILED: 4,
    AppState.CANCELLED: 4,
}


def exit_code(i: int) -> int:
    return 0 if i % 5 else 3


def lines(i: int, k: int) -> int:
    return 50 + 13 * i + k


def app(i: int) -> AppDef:
    # both replicas print their lines, wait a moment so that polls see them run, and exit
    script = 'seq 1 $(( $0 + $1 )); sleep 1; exit "$2"'
    role = Role(
        "w", image=IMAGE, entrypoint="sh", num_replicas=2,
        args=["-c", script, str(lines(i, 0)), "${replica_id}", str(exit_code(i))],
    )  # fmt: skip
    return AppDef(f"dload{i}", [role])


def _engine_objects(client: Any, app_ids: set[str]) -> list[str]:
    """Containers, networks and volumes of these apps still on the engine."""
    left = []
    for c in client.containers.list(all=True, filters={"label": "shipyard.app_id"}):
        if c.labels.get("shipyard.app_id") in app_ids:
            left.append(f"container {c.name}")
    for n in client.networks.list(filters={"label": "shipyard.app_id"}):
        if n.attrs.get("Labels", {}).get("shipyard.app_id") in app_ids:
            left.append(f"network {n.name}")
    for v in client.volumes.list(filters={"label": "shipyard.app_id"}):
        if (v.attrs.get("Labels") or {}).get("shipyard.app_id") in app_ids:
            left.append(f"volume {v.name}")
    return left


def test_docker_load_50_apps_of_2_replicas(docker_client: Any) -> None:
    handles: dict[int, str] = {}
    # seen[(i, t)]: what poller t saw of job i, in its order
    seen: dict[tuple[int, int], list[AppState | None]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def poll(t: int) -> None:
        with get_runner("dload") as runner:
            while not stop.is_set():
                with lock:
                    mine = {i: h for i, h in handles.items() if i % 8 == t}
                if mine:
                    statuses = runner.status_many(mine.values())
                    with lock:
                        for i, h in mine.items():
                            st = statuses[h]
                            seen.setdefault((i, t), []).append(None if st is None else st.state)
                time.sleep(0.1)

    pollers = [threading.Thread(target=poll, args=(t,)) for t in range(8)]
    for p in pollers:
        p.start()
    try:
        with get_runner("dload") as runner:

            def submit(i: int) -> None:
                h = runner.run(app(i), "local_docker")
                with lock:
                    handles[i] = h

            with ThreadPoolExecutor(max_workers=16) as pool:
                errors = [f.exception() for f in [pool.submit(submit, i) for i in range(N_APPS)]]
            failed = [(i, repr(e)) for i, e in enumerate(errors) if e is not None]
            assert not failed, f"{len(failed)} submits failed, e.g. {failed[:3]}"

            finals: dict[int, Any] = {}
            deadline = time.monotonic() + 300
            while len(finals) < N_APPS and time.monotonic() < deadline:
                statuses = runner.status_many(handles[i] for i in range(N_APPS) if i not in finals)
                for h, st in statuses.items():
                    # (an app is FAILED as soon as one replica fails; the other replica still
                    # runs to its end: wait for every replica's exit code too)
                    if (
                        st is not None
                        and is_terminal(st.state)
                        and None not in st.exit_codes().get("w", [None])
                    ):
                        finals[int(parse_app_handle(h).app_id.split("-")[0][5:])] = st
                time.sleep(0.5)
            assert len(finals) == N_APPS, f"{N_APPS - len(finals)} apps did not end in time"
            stop.set()
            for p in pollers:
                p.join(30)

            # describe was never wrong while polled
            wrong = []
            for (i, _t), states in seen.items():
                want = AppState.SUCCEEDED if exit_code(i) == 0 else AppState.FAILED
                if None in states or AppState.UNKNOWN in states:
                    wrong.append((i, "unknown while it existed"))
                ranks = [ORDER.get(s, -1) for s in states if s is not None]
                if ranks != sorted(ranks):
                    wrong.append((i, f"went backwards: {[s.name for s in states if s]}"))
                if any(is_terminal(s) and s != want for s in states if s is not None):
                    wrong.append((i, f"wrong terminal state in {set(states)}"))
            assert not wrong, wrong[:10]
            assert {i for i, _ in seen} == set(range(N_APPS))

            # exit codes and logs
            for i, st in finals.items():
                want = AppState.SUCCEEDED if exit_code(i) == 0 else AppState.FAILED
                assert st.state == want and st.exit_codes() == {"w": [exit_code(i)] * 2}, (i, st)
                for k in (0, 1):
                    out = list(runner.log_lines(handles[i], "w", k, streams=Stream.STDOUT))
                    assert out == [f"{j}\n" for j in range(1, lines(i, k) + 1)], (i, k, len(out))
    finally:
        stop.set()
        for p in pollers:
            p.join(30)
        from core.schedulers.docker_scheduler import create_scheduler

        sched = create_scheduler("dload")
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda h: sched.purge(parse_app_handle(h).app_id), handles.values()))
    app_ids = {parse_app_handle(h).app_id for h in handles.values()}
    assert not _engine_objects(docker_client, app_ids), "left behind after purge"
    print(f"\ndocker load: {N_APPS} apps x 2 replicas, {sum(map(len, seen.values()))} describes")


def test_docker_describe_many_is_one_engine_call_per_poll(
    docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status_many of 20 ended apps asks the engine's container list once per poll (plus, at
    most once in the three polls, the retire sweep's network and volume lists), not once per
    app. (Ended apps: a running container is also sampled for its usage, one stats call each.)"""
    import docker.api.client

    with get_runner("dpoll") as runner:
        handles = [
            runner.run(AppDef(f"dpoll{i}", [Role("w", image=IMAGE, entrypoint="true")]), "local_docker")
            for i in range(scaled(20))
        ]  # fmt: skip
        try:
            for h in handles:
                runner.wait(h, wait_interval=0.1)
            calls: list[str] = []
            real_get = docker.api.client.APIClient._get

            def counting_get(self: Any, url: str, **kw: Any) -> Any:
                calls.append(url.split("/v1.", 1)[-1])
                return real_get(self, url, **kw)

            monkeypatch.setattr(docker.api.client.APIClient, "_get", counting_get)
            for _ in range(3):
                statuses = runner.status_many(handles)
                assert all(st is not None for st in statuses.values())
            monkeypatch.undo()
            per_poll = len(calls) / 3
            print(
                f"\ndocker polling: {per_poll:.1f} engine GETs per status_many of {len(handles)} apps"
            )
            assert per_poll <= 2, f"{per_poll} engine GETs per poll of {len(handles)} apps: {calls}"
        finally:
            from core.schedulers.docker_scheduler import create_scheduler

            sched = create_scheduler("dpoll")
            for h in handles:
                sched.purge(parse_app_handle(h).app_id)
