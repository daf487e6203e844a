"""ShipyardHook with a ``shipyard`` connection naming a Docker engine (TLS over TCP) and a
registry login: its runner's ``local_docker`` uses both, against the real test engine's TLS
listener and the registry that wants a login (``scripts/start_docker.sh``).

The worker's own engine is made unreachable (``DOCKER_HOST``) and it has no ``docker login``
(an empty ``DOCKER_CONFIG``), so a job that runs used the connection's engine and credentials.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider import get_provider_info
from airflow_provider.hooks.shipyard import DOCKER_EXTRAS, ShipyardHook, connection_settings
from core.schedulers.docker_scheduler import DockerEngine, DockerScheduler
from core.specs import AppDef, AppState, Role
from tests.integration.docker.test_docker_pull import (  # noqa: F401 (fixtures)
    REGISTRY,
    USER,
    password,
    remote_image,
)
from tests.services import DOCKER_TLS_CLIENT_DIR

pytestmark = [pytest.mark.airflow, pytest.mark.docker]

TLS_HOST = "tcp://127.0.0.1:2376"


def _connection(
    monkeypatch: pytest.MonkeyPatch, conn_password: str | None, pem: bool = True, **extra: Any
) -> str:
    """A ``shipyard`` connection (from ``AIRFLOW_CONN_...``) for the TLS engine and registry;
    returns its id."""
    certs = Path(DOCKER_TLS_CLIENT_DIR)

    def value(name: str) -> str:
        return (certs / name).read_text() if pem else str(certs / name)

    conn_id = f"dk_{uuid.uuid4().hex[:8]}"
    extras = {
        "docker_host": TLS_HOST,
        "tls_ca_cert": value("ca.pem"),
        "tls_client_cert": value("cert.pem"),
        "tls_private_key": value("key.pem"),
        "registry_url": REGISTRY,
        "registry_username": USER,
        **extra,
    }
    conn = {"conn_type": "shipyard", "password": conn_password, "extra": extras}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


@pytest.fixture
def worker(password: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    """The registry's password; the worker's own engine and login made unusable."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    return password


@pytest.fixture
def handles(docker_client: Any, remote_image: str) -> Iterator[list[str]]:  # noqa: F811
    """Handles of the apps a test runs: purged afterwards (through the local socket), and the
    pulled image removed."""
    made: list[str] = []
    yield made
    for handle in made:
        session, app_id = handle.split("/")[2:4]
        sched = DockerScheduler(session, docker_engine=DockerEngine("unix:///var/run/docker.sock"))
        sched.purge(app_id)
        sched.close()
    try:
        docker_client.api.remove_image(remote_image)
    except Exception as e:  # never pulled
        if getattr(e, "status_code", None) != 404:
            raise


@pytest.mark.parametrize("pem", [True, False], ids=["pem", "files"])
def test_the_hooks_runner_uses_the_connections_engine_and_login(
    pem: bool,
    worker: str,
    remote_image: str,  # noqa: F811
    handles: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn_id = _connection(monkeypatch, worker, pem=pem)
    hook = ShipyardHook(conn_id)
    scheduler, cfg, cluster = hook.settings()
    assert (scheduler, cfg, cluster) == ("local_docker", {}, None)
    engine = hook.docker_engine()
    assert engine is not None and engine.host == TLS_HOST and engine.registry == REGISTRY
    assert worker not in repr(engine) and "PRIVATE KEY" not in repr(engine)
    app = AppDef("hooked", [Role("r", image=remote_image, entrypoint="echo", args=["via hook"])])
    with hook.get_conn() as runner:
        handle = runner.run(app, scheduler, {"pull": "always"})
        handles.append(handle)
        status = runner.wait(handle, wait_interval=0.2, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert list(runner.log_lines(handle, "r")) == ["via hook\n"]


def test_a_wrong_registry_password_fails_clearly(
    worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"not-the-password-{uuid.uuid4().hex}"
    conn_id = _connection(monkeypatch, secret)
    app = AppDef("refused", [Role("r", image=f"{REGISTRY}/shipyard-test/x:1", entrypoint="true")])
    with ShipyardHook(conn_id).get_conn() as runner, pytest.raises(ValueError) as info:
        runner.run(app, "local_docker", {"pull": "always"})
    msg = str(info.value)
    assert msg.startswith(f"connection {conn_id!r}: registry {REGISTRY}: the login of 'shipyard'")
    assert secret not in msg


def test_a_connection_without_the_client_certificate_fails_clearly(
    worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id = _connection(monkeypatch, worker, tls_client_cert=None, tls_private_key=None)
    app = AppDef("refused", [Role("r", image="shipyard-test/busybox:latest", entrypoint="true")])
    with ShipyardHook(conn_id).get_conn() as runner, pytest.raises(ValueError) as info:
        runner.run(app, "local_docker", {"pull": "never"})
    assert str(info.value).startswith(
        f"connection {conn_id!r}: the TLS connection to the Docker engine at {TLS_HOST} failed"
    )


# -- the connection's settings, without services ----------------------------------------------


def _conn(monkeypatch: pytest.MonkeyPatch, conn_password: str | None, **extra: Any) -> Any:
    from airflow.sdk import BaseHook

    conn_id = f"dk_{uuid.uuid4().hex[:8]}"
    conn = {"conn_type": "shipyard", "password": conn_password, "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return BaseHook.get_connection(conn_id)


@pytest.mark.parametrize(
    "conn_password, extra, match",
    [
        (None, {"registry_username": "ci"}, r"registry_username: the registry's password goes"),
        ("pw", {"docker_host": "builder:2376"}, r"docker_host: expected a URL"),
        (
            "pw",
            {"docker_host": "tcp://b:2376", "transport": "ssh"},
            r"transport and docker_host: a connection names a Slurm cluster or a Docker engine",
        ),
        (
            None,
            {"docker_host": "tcp://b:2376", "tls_client_cert": "-----BEGIN C"},
            r"tls_client_cert and tls_private_key: give both or neither",
        ),
    ],
)
def test_unusable_docker_settings_name_the_connection_and_field(
    conn_password: str | None,
    extra: dict[str, Any],
    match: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = _conn(monkeypatch, conn_password, **extra)
    with pytest.raises(ValueError, match=rf"^connection '{conn.conn_id}': {match}"):
        connection_settings(conn)


def test_a_connection_without_docker_settings_keeps_the_workers_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = _conn(monkeypatch, None, scheduler="local_docker", cfg={"pull": "never"})
    hook = ShipyardHook(conn.conn_id)
    assert hook.settings() == ("local_docker", {"pull": "never"}, None)
    assert hook.docker_engine() is None


def test_the_connection_form_has_the_docker_fields() -> None:
    (conn_type,) = get_provider_info()["connection-types"]
    fields = conn_type["conn-fields"]
    assert set(DOCKER_EXTRAS) <= set(fields)
    assert fields["tls_private_key"]["schema"]["format"] == "password"
    assert "registry" in conn_type["ui-field-behaviour"]["relabeling"]["password"]


def test_operator_trigger_and_sensor_use_the_connections_engine(
    worker: str,
    remote_image: str,  # noqa: F811
    handles: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's own engine is unreachable: the task, its deferred wait and a sensor on the
    job reach the job through the connection's engine only."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider.operators import ShipyardOperator
    from airflow_provider.sensors import ShipyardJobSensor
    from tests.integration.airflow.helpers import StateStoreStub, TaskInstanceStub, context

    conn_id = _connection(monkeypatch, worker)
    app = AppDef(
        "opengine",
        [Role("r", image=remote_image, entrypoint="sh", args=["-c", "echo hi; sleep 1"])],
    )
    blocking = ShipyardOperator(
        task_id="job", app=app, shipyard_conn_id=conn_id, cfg={"pull": "always"}, poll_interval=0.2
    )
    ti = TaskInstanceStub()
    handle = blocking.execute(context(ti, StateStoreStub()))
    handles.append(handle)
    assert ti.xcoms["state"] == "SUCCEEDED"

    deferred = ShipyardOperator(
        task_id="job2", app=app, shipyard_conn_id=conn_id, deferrable=True, poll_interval=0.2
    )
    ti2 = TaskInstanceStub()
    with pytest.raises(TaskDeferred) as info:
        deferred.execute(context(ti2, StateStoreStub()))
    trigger = info.value.trigger
    handles.append(trigger.app_handle)

    async def first_event() -> Any:
        return await anext(trigger.run())

    event = asyncio.run(first_event())
    assert event.payload["status"] == "success", event.payload
    assert event.payload["log_lines"] == 1  # the trigger read the job's log on that engine
    assert deferred.execute_complete(context(ti2), event.payload) == trigger.app_handle

    sensor = ShipyardJobSensor(task_id="wait", app_handle=handle, shipyard_conn_id=conn_id)
    assert sensor.poke(context(TaskInstanceStub())).is_done  # type: ignore[union-attr]
