"""The Shipyard worker's parts: the app a flow run becomes, exit codes, idempotency keys, the
work pool's template, the ShipyardBackend block's resolution, and the forwarding of a job's output
with its checkpoints, on real local jobs (the worker itself runs against the real server in
tests/deploy_prefect)."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.runner import Runner
from core.specs import AppDef, AppState, AppStatus, ReplicaStatus, Role, RoleStatus
from core.watch import CursorStore, JobWatch, LogCursor
from prefect_tasks.blocks import ShipyardBackend, resolve_backend
from prefect_tasks.worker import (
    ROLE,
    ShipyardJobConfiguration,
    ShipyardWorker,
    exit_code,
    flow_run_app,
    idempotency_key,
)
from prefect_tasks.worker_output import OutputCheckpoints


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


def test_remote_slurm_keeps_python_and_home_of_the_cluster() -> None:
    """On a cluster reached over SSH the worker's interpreter and PREFECT_HOME do not exist:
    the job runs the cluster's python, with its own home; this host's Slurm gets the worker's."""
    from core.clusters import ClusterConfig, register_cluster

    register_cluster(ClusterConfig(name="far-away", transport="ssh", host="login.example"))
    env = {"PREFECT_HOME": "/var/lib/worker-home", "PREFECT_API_URL": "http://a/api"}
    cfg = ShipyardJobConfiguration(command="python -m prefect.engine", env=env)
    (far,) = flow_run_app(cfg, flow_run(), "slurm", {"cluster": "far-away"}).roles
    assert far.entrypoint == "python" and "PREFECT_HOME" not in far.env
    (near,) = flow_run_app(cfg, flow_run(), "slurm", {"partition": "debug"}).roles
    assert near.entrypoint == sys.executable and near.env["PREFECT_HOME"] == "/var/lib/worker-home"


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


# -- output checkpoints ------------------------------------------------------------------------


def test_checkpoints_round_trip_privately_and_atomically(tmp_path: Path) -> None:
    checkpoints = OutputCheckpoints(tmp_path / "state" / "prefect-worker" / "w1")
    run = uuid.uuid4()
    store = checkpoints.store(run, "local_cwd://s/a")
    assert store.load() == LogCursor()
    store.save(LogCursor({f"{ROLE}/0": 7}))
    assert store.load() == LogCursor({f"{ROLE}/0": 7})
    # another job of the run (a retry) does not resume from it
    assert checkpoints.store(run, "local_cwd://s/b").load() == LogCursor()
    path = checkpoints.path(run)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    top = checkpoints.directory
    for d in (top, top.parent, top.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert [p.name for p in checkpoints.directory.iterdir()] == [path.name]  # no temporary file
    assert json.loads(path.read_text()) == {
        "app_handle": "local_cwd://s/a",
        "cursor": {f"{ROLE}/0": 7},
    }
    store.clear()
    assert not path.exists()
    store.clear()  # idempotent


def test_unreadable_checkpoint_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    checkpoints = OutputCheckpoints(tmp_path)
    run = uuid.uuid4()
    for text in ("{not json", '{"app_handle": "h", "cursor": {"r/0": -1}}', "[]"):
        checkpoints.path(run).write_text(text)
        assert checkpoints.store(run, "h").load() == LogCursor()
    assert "ignoring the log cursor" in caplog.text


def test_prune_keeps_the_runs_still_followed(tmp_path: Path) -> None:
    checkpoints = OutputCheckpoints(tmp_path)
    kept, ended = uuid.uuid4(), uuid.uuid4()
    for run in (kept, ended):
        checkpoints.store(run, "h").save(LogCursor({"r/0": 1}))
    (tmp_path / f".{ended}.json.123.tmp").write_text("{}")  # a worker killed mid-save
    removed = checkpoints.prune({kept})
    assert sorted(removed) == sorted([f"{ended}.json", f".{ended}.json.123.tmp"])
    assert [p.name for p in tmp_path.iterdir()] == [f"{kept}.json"]
    assert OutputCheckpoints(tmp_path / "missing").prune(set()) == []


def test_worker_checkpoints_live_in_the_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIPYARD_STATE_DIR", "/srv/shipyard")
    checkpoints = OutputCheckpoints.for_worker("gpu worker/1")
    assert checkpoints.directory == Path("/srv/shipyard/prefect-worker/gpu-worker-1")


# -- forwarding a job's output -----------------------------------------------------------------


class Logged(logging.Handler):
    """The job lines the worker logged (``prefix | role/k text`` -> ``text``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        prefix, _, rest = record.getMessage().partition(" | ")
        if prefix == "run-1" and rest.startswith(f"{ROLE}/0 "):
            self.lines.append(rest.split(" ", 1)[1])


@pytest.fixture
def output_log() -> Iterator[tuple[logging.Logger, Logged]]:
    logger = logging.getLogger(f"test.shipyard.output.{uuid.uuid4().hex}")
    logger.setLevel(logging.INFO)
    handler = Logged()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)


def printer(n: int, every: float) -> AppDef:
    """A one-role app printing ``line 0`` .. ``line n-1``, one every ``every`` seconds."""
    script = f"import time\nfor i in range({n}):\n    print('line', i, flush=True)\n    time.sleep({every})\n"
    return AppDef("printer", [Role(ROLE, entrypoint=sys.executable, args=["-c", script])])


async def forward(
    runner: Runner,
    handle: str,
    store: CursorStore,
    logger: logging.Logger,
    stop_after: int | None = None,
    handler: Logged | None = None,
) -> None:
    """Follows the job's output as the worker does (its watch, from the run's checkpoint):
    until ``handler`` has ``stop_after`` lines (then the worker stops), or to the job's end."""
    watch = JobWatch(
        runner,
        handle,
        poll_interval=0.2,
        logs=True,
        on_line=lambda line: logger.info("%s | %s", "run-1", line),
        cursor=store,
    )
    following = asyncio.ensure_future(watch.run_async())
    if stop_after is None:
        await following
        return
    assert handler is not None
    while len(handler.lines) < stop_after:
        await asyncio.sleep(0.02)
    following.cancel()
    with pytest.raises(asyncio.CancelledError):
        await following


def test_output_resumes_after_the_checkpoint_each_line_once(
    runner: Runner, output_log: tuple[logging.Logger, Logged], tmp_path: Path
) -> None:
    logger, logged = output_log
    checkpoints, run = OutputCheckpoints(tmp_path), uuid.uuid4()
    handle = runner.run(printer(40, 0.05), "local_cwd")
    store = checkpoints.store(run, handle)
    # a first worker forwards some lines and stops (the job goes on)
    asyncio.run(forward(runner, handle, store, logger, stop_after=5, handler=logged))
    first = list(logged.lines)
    assert store.load().total == len(first) >= 5
    assert runner.status(handle).state == AppState.RUNNING  # type: ignore[union-attr]
    # the next one resumes after them, to the end, and removes the checkpoint
    asyncio.run(forward(runner, handle, store, logger))
    assert logged.lines == [f"line {i}" for i in range(40)]
    assert not checkpoints.path(run).exists()


def test_output_of_a_job_that_ended_unseen_comes_from_its_complete_logs(
    runner: Runner, output_log: tuple[logging.Logger, Logged], tmp_path: Path
) -> None:
    logger, logged = output_log
    checkpoints, run = OutputCheckpoints(tmp_path), uuid.uuid4()
    handle = runner.run(printer(12, 0), "local_cwd")
    assert runner.wait(handle).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    store = checkpoints.store(run, handle)
    store.save(LogCursor({f"{ROLE}/0": 4}))
    asyncio.run(forward(runner, handle, store, logger))  # the job ended before any poll
    assert logged.lines == [f"line {i}" for i in range(4, 12)]
    assert not checkpoints.path(run).exists()
