"""An ended app's network is freed by the describe that sees it end, on the Docker scheduler (the
real engine), even when nobody submits again: the background sweep (which submits start, and
which freed networks before) never runs in these tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from core.runner import get_runner
from core.schedulers.docker import retire
from core.schedulers.docker.model import LABEL_APP_ID
from core.schedulers.docker_scheduler import DockerScheduler, create_scheduler
from core.specs import AppDef, AppState, BindMount, Role
from tests.helpers import wait_until

pytestmark = pytest.mark.docker

IMAGE = "shipyard-test/busybox:latest"


@pytest.fixture
def sched(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[DockerScheduler]:
    monkeypatch.setattr(retire, "SWEEP_INTERVAL", float("inf"))  # (no background sweep)
    session = f"nets-{uuid.uuid4().hex[:8]}"
    scheduler = create_scheduler(session)
    yield scheduler
    for app in scheduler.list():
        scheduler.purge(app.app_id)
    scheduler.close()


def two_replicas(name: str, script: str) -> AppDef:
    """An app of two replicas: it gets a network of its own."""
    return AppDef(name, [Role("r", IMAGE, entrypoint="sh", args=["-c", script], num_replicas=2)])


def has_network(client: Any, app_id: str) -> bool:
    try:
        client.networks.get(app_id)
    except NotFound:
        return False
    return True


def exited(client: Any, app_id: str, replicas: int = 2) -> Callable[[], bool]:
    """Whether each of the app's containers has exited, as the engine lists them."""

    def check() -> bool:
        found = client.api.containers(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})
        return len(found) == replicas and all(c["State"] == "exited" for c in found)

    return check


def counting_removals(sched: DockerScheduler, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The networks the scheduler's client removes from now on."""
    api = sched._docker_client.api
    removed: list[str] = []
    remove = api.remove_network

    def counted(net_id: str) -> None:
        removed.append(net_id)
        remove(net_id)

    monkeypatch.setattr(api, "remove_network", counted)
    return removed


def test_the_network_is_gone_when_wait_returns(sched: DockerScheduler, docker_client: Any) -> None:
    with get_runner(sched.session_name) as runner:
        handle = runner.run(two_replicas("waited", "sleep 1"), "local_docker")
        app_id = handle.rsplit("/", 1)[1]
        assert has_network(docker_client, app_id)
        status = runner.wait(handle, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert not has_network(docker_client, app_id)


def test_the_describe_that_sees_the_end_frees_the_network_once(
    sched: DockerScheduler, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sched.submit(two_replicas("a", "true"), {})
    b = sched.submit(two_replicas("b", "exit 3"), {})
    for app_id in (a, b):
        wait_until(exited(docker_client, app_id), 120, f"{app_id} to end")
        assert has_network(docker_client, app_id)  # (no one described it ended yet)
    removed = counting_removals(sched, monkeypatch)
    desc = sched.describe(a)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert not has_network(docker_client, a) and has_network(docker_client, b)
    many = sched.describe_many([a, b])
    assert many[b] is not None and many[b].state == AppState.FAILED
    assert not has_network(docker_client, b)
    for _ in range(3):  # (each app's network is freed once: later describes make no call)
        sched.describe(a)
        sched.describe_many([a, b])
    assert removed == [a, b]


def test_a_failed_replica_stops_the_others_and_the_app_ends_when_they_have(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path
) -> None:
    # replica 0 fails at once; replica 1 runs until stopped, and its TERM handler waits for the
    # test, so the moment between the failure and the app's end can be looked at
    script = (
        '[ "$SHIPYARD_REPLICA_ID" = 0 ] && exit 3; '
        "trap 'touch /x/term; until [ -e /x/release ]; do sleep 0.1; done; exit 0' TERM; "
        "sleep 600 & wait"
    )
    app = two_replicas("partly", script)
    app.roles[0].mounts = [BindMount(str(tmp_path), "/x")]
    app_id = sched.submit(app, {})
    # the describes that see replica 0 failed stop replica 1 (nothing else would)
    wait_until(lambda: sched.describe(app_id) and (tmp_path / "term").exists(), 120, "the stop")
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING, desc
    assert [(r.state, r.exit_code) for r in desc.roles_statuses[0].replicas] == [
        (AppState.FAILED, 3),
        (AppState.RUNNING, None),
    ]
    assert desc.msg == "r/0 exited with code 3; stopping the other replicas", desc.msg
    assert has_network(docker_client, app_id)  # (replica 1 still uses it)

    (tmp_path / "release").touch()
    with get_runner(sched.session_name) as runner:
        status = runner.wait(f"local_docker://{sched.session_name}/{app_id}", timeout=120)
    assert status is not None and status.state == AppState.FAILED, status
    assert status.exit_codes() == {"r": [3, 0]}  # final: every replica's own code
    assert "r/0 exited with code 3" in status.msg
    assert not has_network(docker_client, app_id)
