"""The Shipyard worker's pure parts: the app a flow run becomes, exit codes, idempotency keys, the
work pool's template, and the ShipyardBackend block's resolution (the worker itself runs against
the real server in tests/deploy_prefect)."""

from __future__ import annotations

import sys
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus
from prefect_tasks.blocks import ShipyardBackend, resolve_backend
from prefect_tasks.worker import (
    ShipyardJobConfiguration,
    ShipyardWorker,
    exit_code,
    flow_run_app,
    idempotency_key,
)


def flow_run(name: str = "brave-otter") -> Any:
    return SimpleNamespace(id=uuid.uuid4(), name=name)


def config(**kwargs: Any) -> ShipyardJobConfiguration:
    env = {"PREFECT_API_URL": "http://10.0.0.5:4200/api", "PREFECT__FLOW_RUN_ID": "x", "GONE": None}
    return ShipyardJobConfiguration(command="python -m prefect.engine", env=env, **kwargs)


def test_flow_run_app_runs_the_engine_with_the_run_env() -> None:
    app = flow_run_app(config(cpu=2, mem_mb=512, name="train/nightly run"), flow_run(), "local_cwd")
    (role,) = app.roles
    assert app.name == "train-nightly-run"
    assert [role.entrypoint, *role.args] == [sys.executable, "-m", "prefect.engine"]
    assert role.env["PREFECT__FLOW_RUN_ID"] == "x" and "GONE" not in role.env
    assert (role.resource.cpu, role.resource.memMB, role.num_replicas) == (2, 512, 1)


def test_docker_needs_an_image_and_keeps_python_from_the_image() -> None:
    with pytest.raises(ValueError, match="^image: "):
        flow_run_app(config(), flow_run(), "local_docker")
    mounts = ["type=bind,src=/code,dst=/code,readonly"]
    app = flow_run_app(config(image="img:1", mounts=mounts), flow_run(), "local_docker")
    (role,) = app.roles
    assert role.entrypoint == "python" and role.image == "img:1"
    assert role.env["PREFECT_API_URL"] == "http://10.0.0.5:4200/api"  # not loopback: as it is
    assert [m.dst_path for m in role.mounts] == ["/code"]


def test_exit_code() -> None:
    def status(state: AppState, *codes: int | None) -> AppStatus:
        replicas = [ReplicaStatus(i, state, "r", "h", exit_code=c) for i, c in enumerate(codes)]
        return AppStatus(state, roles=[RoleStatus("r", replicas)])

    assert exit_code(status(AppState.SUCCEEDED, 0)) == 0
    assert exit_code(status(AppState.FAILED, 0, 3)) == 3
    assert exit_code(status(AppState.FAILED, -9)) == -9
    assert exit_code(status(AppState.FAILED)) == 1
    assert exit_code(status(AppState.CANCELLED)) == 143
    assert exit_code(None) == 1


def test_idempotency_key_names_the_run_and_the_scheduled_state() -> None:
    run, state, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert idempotency_key(run, state) == idempotency_key(run, state)
    assert idempotency_key(run, state) != idempotency_key(run, other)


def test_default_template_has_the_shipyard_variables() -> None:
    template = ShipyardWorker.get_default_base_job_template()
    variables = template["variables"]["properties"]
    for name in ("scheduler", "cfg", "backend", "image", "cpu", "mem_mb", "gpu", "mounts", "env"):
        assert name in variables, name
    assert template["job_configuration"]["scheduler"] == "{{ scheduler }}"


def test_backend_block_resolution() -> None:
    block = ShipyardBackend(scheduler="local_docker", cfg={"quiet": True, "stop_timeout": 5})
    backend = resolve_backend(block, {"stop_timeout": 1})
    assert backend.scheduler == "local_docker"
    assert backend.cfg == {"quiet": True, "stop_timeout": 1}
    assert resolve_backend("local_cwd", {"log_dir": "/tmp"}).cfg == {"log_dir": "/tmp"}
    with pytest.raises(ValueError, match="^scheduler: "):
        ShipyardBackend(scheduler="nope").resolve()
    with pytest.raises(ValueError, match="registry_username and registry_password"):
        ShipyardBackend(scheduler="local_docker", registry_username="ci").resolve()


def test_backend_block_keeps_the_registry_password_secret() -> None:
    block = ShipyardBackend(
        scheduler="local_docker", registry_username="ci", registry_password="s3cr3t-pw"
    )
    assert "s3cr3t-pw" not in repr(block) and "s3cr3t-pw" not in str(block.model_dump())
