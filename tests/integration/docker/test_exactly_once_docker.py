"""Exactly once, nothing lost, on the Docker scheduler (the real engine): racing submitters with
one idempotency key in separate processes, a submitter SIGKILLed at any instant of its submit,
very long lines while following, ended apps retired (networks freed, containers removed after
their retention with their logs archived) and an engine with few address pools running many
more apps than it has pools. Each case failed before the Docker backend was rebuilt (see
docs/reliability.md)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.api import Stream
from core.schedulers.docker.model import LABEL_APP_ID, LABEL_IDEMPOTENCY_KEY, hash_key
from core.schedulers.docker_scheduler import LABEL_SESSION, DockerScheduler, create_scheduler
from core.specs import AppDef, AppState, Role, is_terminal
from tests.helpers import ROOT, wait_until
from tests.integration.docker.test_faults_docker import private_dockerd

pytestmark = pytest.mark.docker

IMAGE = "shipyard-test/busybox:latest"


@pytest.fixture
def sched(docker_client: Any) -> Iterator[DockerScheduler]:
    session = f"once-{uuid.uuid4().hex[:8]}"
    scheduler = create_scheduler(session)
    yield scheduler
    for app in scheduler.list():
        scheduler.purge(app.app_id)
    scheduler.close()


def sh(name: str, script: str, n: int = 1) -> Role:
    return Role(name, image=IMAGE, entrypoint="sh", args=["-c", script], num_replicas=n)


def key_containers(api: Any, key: str) -> list[dict[str, Any]]:
    return api.containers(all=True, filters={"label": f"{LABEL_IDEMPOTENCY_KEY}={hash_key(key)}"})


# -- submitters in processes of their own ------------------------------------------------------

SUBMIT = textwrap.dedent(
    """
    import sys
    import core.schedulers.docker.submit as submit
    from core.runner import get_runner
    from core.specs import AppDef, Role
    session, name, key, grace, n, image = sys.argv[1:7]
    submit.SUBMIT_GRACE = float(grace)  # the test's short deadline for interrupted submits
    app = AppDef(name, [Role("w", image=image, entrypoint="sh", args=["-c", "sleep 30"],
                             num_replicas=int(n))])
    with get_runner(session) as runner:
        print("ready", flush=True)
        sys.stdin.readline()
        print(runner.run(app, "local_docker", {"stop_timeout": 1}, idempotency_key=key), flush=True)
    """
)


def submitter(session: str, key: str, n: int = 2, grace: float = 60.0) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", SUBMIT, session, "once", key, str(grace), str(n), IMAGE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def test_racing_submitters_in_separate_processes_start_one_app(
    sched: DockerScheduler, docker_client: Any
) -> None:
    key = f"race-{uuid.uuid4().hex}"
    procs = [submitter(sched.session_name, key) for _ in range(4)]
    for p in procs:  # as close to the same instant as four pipes allow
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len(set(outs)) == 1, f"the submitters got different apps: {outs}"
    app_ids = {c["Labels"][LABEL_APP_ID] for c in key_containers(docker_client.api, key)}
    assert app_ids == {outs[0].rsplit("/", 1)[1]}, "more than one app runs for the key"
    assert len(key_containers(docker_client.api, key)) == 2
    sched.cancel(outs[0].rsplit("/", 1)[1])


def test_a_keyed_submit_starts_when_racing_submitters_made_two_networks(
    sched: DockerScheduler, docker_client: Any
) -> None:
    """The engine's check for a network of the same name is not atomic: submitters of one key
    that race may each create the app's network (CI saw a start fail, "network ... is
    ambiguous"). The one that starts the containers keeps one network, and the app runs."""
    api = docker_client.api
    info = sched.submit_dryrun(
        AppDef("nets", [sh("w", "sleep 30", n=2)]), {}, idempotency_key=f"nets-{uuid.uuid4().hex}"
    )
    name = info.request.network
    assert name is not None
    labels = {LABEL_SESSION: sched.session_name, LABEL_APP_ID: info.request.app_id}
    for _ in range(2):  # (what the race leaves: the check cannot be raced on demand)
        api.create_network(name, driver="bridge", labels=labels, check_duplicate=False)
    app_id = sched.schedule(info)
    try:
        assert app_id == info.request.app_id
        nets = [n for n in api.networks(names=[name]) if n["Name"] == name]
        assert len(nets) == 1, nets
        desc = wait_until(
            lambda: (d := sched.describe(app_id)) and d.state == AppState.RUNNING and d,
            60,
            "the app to run",
        )
        assert [r.state for r in desc.roles_statuses[0].replicas] == [AppState.RUNNING] * 2
    finally:
        sched.cancel(app_id)


def _kill_during_submit(
    sched: DockerScheduler, api: Any, key: str, when: Callable[[], None]
) -> subprocess.Popen[str]:
    p = submitter(sched.session_name, key, n=3, grace=2.0)
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()
    when()
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    return p


def _outcome(sched: DockerScheduler, runner: Runner, key: str, api: Any) -> str:
    """What a submit killed at some instant left: never an app that waits for ever."""
    handle = runner.find("local_docker", key)
    if handle is None:
        assert key_containers(api, key) == [], "containers of an unrecorded key"
        return "nothing"

    # past its deadline the app is RUNNING with every container started, or FAILED
    def settled() -> Any:
        states = {c["State"] for c in key_containers(api, key)}  # (first: they only go on)
        s = runner.status(handle)
        done = s is not None and (s.state == AppState.FAILED or states == {"running"})
        return s if done else None

    status = wait_until(settled, timeout=30, what=f"{handle} to settle")
    if status.state == AppState.RUNNING:
        assert {c["State"] for c in key_containers(api, key)} == {"running"}
        runner.cancel(handle)
        return "completed"
    assert status.state == AppState.FAILED, status
    assert "submit interrupted" in status.msg, status.msg
    # the retry with the key is given the failed app (a retry then submits anew), at once
    again = runner.run(AppDef("once", [sh("w", "true")]), "local_docker", idempotency_key=key)
    assert again == handle
    # (the runner's describes of the failed app asked its scheduler for a sweep, which may be
    # removing the containers already: this pass then leaves the app to it)
    sched.sweep()
    wait_until(
        lambda: key_containers(api, key) == [], 60, "the half-submitted app's containers to go"
    )
    final = runner.status(handle)
    assert final is not None and final.state == AppState.FAILED
    return "interrupted"


def test_a_submitter_killed_at_any_instant_never_leaves_an_app_waiting(
    sched: DockerScheduler, docker_client: Any
) -> None:
    api = docker_client.api
    outcomes = []
    with get_runner(sched.session_name) as runner:
        # as soon as the first container exists (before every container was started) ...
        key = f"kill-{uuid.uuid4().hex}"
        _kill_during_submit(
            sched, api, key, lambda: wait_until(lambda: key_containers(api, key), 60, "a container")
        )
        outcomes.append(_outcome(sched, runner, key, api))
        # ... and at random instants
        for _ in range(4):
            key = f"kill-{uuid.uuid4().hex}"
            _kill_during_submit(sched, api, key, lambda: time.sleep(random.uniform(0, 1.5)))
            outcomes.append(_outcome(sched, runner, key, api))
    assert outcomes[0] in ("interrupted", "completed")
    assert set(outcomes) <= {"nothing", "interrupted", "completed"}


LONG = [1024, 16 * 1024 + 1, 100_000, 1 << 20, 8 << 20]


def test_long_lines_arrive_whole_while_following(sched: DockerScheduler) -> None:
    script = (
        f"for n in {' '.join(map(str, LONG))}; do"
        " head -c $n /dev/zero | tr '\\0' a; echo; echo short-$n; sleep 0.2; done"
    )
    app_id = sched.submit(AppDef("long", [sh("w", script)]), {})
    expected = [x for n in LONG for x in ("a" * n + "\n", f"short-{n}\n")]
    followed = list(sched.log_iter(app_id, "w", 0, should_tail=True))
    assert [len(x) for x in followed] == [len(x) for x in expected]
    assert followed == expected
    with get_runner(sched.session_name) as runner:
        handle = f"local_docker://{sched.session_name}/{app_id}"
        streamed = [str(line) for line in runner.stream_logs(handle)]
    assert streamed == ["w/0 " + x.rstrip("\n") for x in expected]


def test_ended_apps_are_retired_and_keep_their_state_and_logs(
    sched: DockerScheduler, docker_client: Any
) -> None:
    api = docker_client.api
    # replica 1 fails once replica 0 surely ran (a replica failing first ends the app, and one
    # not started yet then has no exit code)
    script = (
        "echo out-$SHIPYARD_REPLICA_ID; echo err-$SHIPYARD_REPLICA_ID >&2;"
        ' [ "$SHIPYARD_REPLICA_ID" = 1 ] && sleep 2; exit $SHIPYARD_REPLICA_ID'
    )
    kept = sched.submit(AppDef("kept", [sh("r", script, n=2)]), {})
    gone = sched.submit(AppDef("gone", [sh("r", script, n=2)]), {"retention": 0})
    for app_id in (kept, gone):
        wait_until(lambda a=app_id: is_terminal(sched.describe(a).state), what=f"{app_id} to end")  # type: ignore[union-attr]
    before = datetime.now() + timedelta(seconds=1)
    sched.sweep()
    # every ended app's network is freed; containers go only past their retention
    assert api.networks(filters={"label": f"{LABEL_APP_ID}={kept}"}) == []
    assert api.networks(filters={"label": f"{LABEL_APP_ID}={gone}"}) == []
    assert len(api.containers(all=True, filters={"label": f"{LABEL_APP_ID}={kept}"})) == 2
    assert api.containers(all=True, filters={"label": f"{LABEL_APP_ID}={gone}"}) == []
    for app_id in (kept, gone):
        desc = sched.describe(app_id)
        assert desc is not None and desc.state == AppState.FAILED, desc
        codes = {f"{r.role}/{r.id}": r.exit_code for rs in desc.roles_statuses for r in rs.replicas}
        assert codes == {"r/0": 0, "r/1": 1}
        assert list(sched.log_iter(app_id, "r", 1, streams=Stream.STDOUT)) == ["out-1\n"]
        assert list(sched.log_iter(app_id, "r", 1, streams=Stream.STDERR)) == ["err-1\n"]
        assert sorted(sched.log_iter(app_id, "r", 0)) == ["err-0\n", "out-0\n"]
        assert list(sched.log_iter(app_id, "r", 0, regex="^err")) == ["err-0\n"]
        assert list(sched.log_iter(app_id, "r", 0, since=before)) == []
        assert sorted(sched.log_iter(app_id, "r", 0, should_tail=True)) == ["err-0\n", "out-0\n"]
    assert {a.app_id: a.state for a in sched.list()} == {
        kept: AppState.FAILED,
        gone: AppState.FAILED,
    }
    assert sched.find_by_idempotency_key("never-used") is None


def test_an_engine_with_few_address_pools_runs_many_more_apps(tmp_path: Path) -> None:
    # 16 pools of /28 (one is docker0's): 24 multi-replica apps, one after another, each on a
    # network of its own; ended apps' networks must be freed for the later ones to start.
    config = tmp_path / "daemon.json"
    config.write_text(
        json.dumps({"default-address-pools": [{"base": "10.213.0.0/24", "size": 28}]})
    )
    with private_dockerd(extra=("--config-file", str(config))) as engine:
        import docker

        client = docker.DockerClient(base_url=engine.sock)
        sched = create_scheduler("pools", docker_client=client)
        try:
            for i in range(24):  # (more than the 15 free pools: 9 must reuse one)
                app_id = sched.submit(AppDef(f"p{i}", [sh("r", "true", n=2)]), {})
                wait_until(lambda a=app_id: is_terminal(sched.describe(a).state), what=f"app {i}")  # type: ignore[union-attr]
                assert sched.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
            nets = client.api.networks(filters={"label": LABEL_SESSION})
            assert len(nets) <= 15
        finally:
            sched.close()
            client.close()
