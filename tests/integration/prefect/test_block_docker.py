"""A ShipyardBackend block naming a Docker engine reached over TCP+TLS (the test engine's TLS
listener, scripts/start_docker.sh): the tasks given the block run the job there, with the
worker's own engine unreachable."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.specs import AppDef, AppState, Role
from prefect_tasks import ShipyardBackend, cancel_job, submit_job, wait_for_job
from tests.services import DOCKER_TLS_CLIENT_DIR, docker_secure_problem, require

pytestmark = pytest.mark.docker
IMAGE = "shipyard-test/busybox:latest"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


@pytest.mark.parametrize("pem", [False, True], ids=["files", "pem"])
def test_a_block_with_tls_settings_runs_the_job_on_that_engine(
    pem: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("docker", docker_secure_problem())
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # the worker's own: unusable
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.setenv(name, SYSTEM_CA)
    certs = Path(DOCKER_TLS_CLIENT_DIR)

    def value(name: str) -> str:
        return (certs / name).read_text() if pem else str(certs / name)

    block = ShipyardBackend(
        scheduler="local_docker",
        cfg={"pull": "never"},
        docker_host="tcp://127.0.0.1:2376",
        tls_ca_cert=value("ca.pem"),
        tls_client_cert=value("cert.pem"),
        tls_private_key=value("key.pem"),
    )
    assert "PRIVATE KEY" not in repr(block)
    name = f"blocktls{uuid.uuid4().hex[:6]}"
    app = AppDef(name, [Role("r", image=IMAGE, entrypoint="echo", args=["over tls"])])

    @flow
    def on_tls() -> Any:
        handle = submit_job(app, scheduler=block)
        status = wait_for_job(handle, cluster=block)
        cancel_job(handle, cluster=block)  # (its containers go with the engine's retention)
        return handle, status

    handle, status = on_tls()
    assert handle.startswith("local_docker://")
    assert status.state == AppState.SUCCEEDED
