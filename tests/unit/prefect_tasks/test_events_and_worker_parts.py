"""Issue 29's Prefect parts without a server: the job events (each state once, what they
carry, their ids), the worker's graced scheduler factories and its variables' schema, and the
blocks' ui_url and metadata."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus
from prefect_tasks import events
from prefect_tasks.blocks import PROCESS_LOGO_URL, ShipyardBackend, SlurmCluster
from prefect_tasks.worker import ShipyardWorker
from prefect_tasks.worker_cancel import graced_factories


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The events emitted (as emit_event's arguments), with an API to send them to."""
    import prefect.events

    out: list[dict[str, Any]] = []
    monkeypatch.setattr(prefect.events, "emit_event", lambda **kw: out.append(kw))
    monkeypatch.setattr(events, "has_api", lambda: True)
    return out


def status(state: AppState, code: int | None = None) -> AppStatus:
    replica = ReplicaStatus(
        0, state, "w", "h", exit_code=code, reason="exit_code" if code else None
    )
    return AppStatus(
        state, roles=[RoleStatus("w", [replica])], reason="exit_code" if code else None
    )


def test_each_state_of_a_job_is_emitted_once(sent: list[dict[str, Any]]) -> None:
    handle = f"local_cwd://s/train-{uuid.uuid4().hex[:8]}"
    events.remember_name(handle, "train")
    watch = events.JobEvents(handle)
    for state in (AppState.PENDING, AppState.RUNNING, AppState.PENDING, AppState.RUNNING):
        watch(status(state))  # (requeued: PENDING and RUNNING again)
    watch(status(AppState.FAILED, 3))
    watch(status(AppState.FAILED, 3))
    assert [e["event"] for e in sent] == [
        "shipyard.job.pending", "shipyard.job.running", "shipyard.job.failed"
    ]  # fmt: skip
    failed = sent[-1]
    assert failed["resource"] == {
        "prefect.resource.id": f"shipyard.job.{handle}",
        "prefect.resource.name": "train",
        "shipyard.scheduler": "local_cwd",
        "shipyard.session": "s",
    }
    assert failed["payload"] == {
        "handle": handle, "state": "FAILED", "reason": "exit_code",
        "exit_codes": {"w": [3]}, "message": None,
    }  # fmt: skip
    # the id is the job's and the state's: another process emitting it makes the same event
    assert failed["id"] == uuid.uuid5(events._ID_NAMESPACE, f"{handle}\nfailed")


def test_nothing_without_an_api_or_for_unknown_states(
    sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = f"local_cwd://s/x-{uuid.uuid4().hex[:8]}"
    assert not events.emit_job_state(handle, status(AppState.UNKNOWN))
    assert not events.emit_job_state(handle, None)
    monkeypatch.setattr(events, "has_api", lambda: False)
    assert not events.emit_job_state(handle, status(AppState.RUNNING))
    assert sent == []
    monkeypatch.setattr(events, "has_api", lambda: True)
    assert events.emit_job_state(handle, status(AppState.RUNNING), name="n", related=[{"a": "b"}])
    assert (
        sent[0]["related"] == [{"a": "b"}] and sent[0]["resource"]["prefect.resource.name"] == "n"
    )


def test_graced_factories_give_the_local_and_docker_schedulers_the_grace() -> None:
    made: list[tuple[str, dict[str, Any]]] = []

    def factory(kind: str) -> Any:
        return lambda session, **kw: made.append((kind, kw))

    names = ("local_cwd", "local_dir", "local_docker", "slurm")
    factories = {name: factory(name) for name in names}
    graced = graced_factories(factories, 7.0)
    for make in graced.values():
        make("s", other=1)
    assert made == [
        ("local_cwd", {"other": 1, "grace": 7.0}),
        ("local_dir", {"other": 1, "grace": 7.0}),
        ("local_docker", {"other": 1, "grace": 7.0}),
        ("slurm", {"other": 1}),  # (scancel's grace is the cluster's KillWait)
    ]


def test_the_backend_variable_is_a_block_the_server_takes_by_reference() -> None:
    from prefect.utilities.schema_tools import validate

    schema = ShipyardWorker.get_default_base_job_template()["variables"]
    (block_ref, text, null) = schema["properties"]["backend"]["anyOf"]
    assert block_ref == {"$ref": "#/definitions/ShipyardBackend"} and text == {"type": "string"}
    ref = {"$ref": {"block_document_id": str(uuid.uuid4())}}
    for value in (ref, "a-saved-block", None):  # (no error: the server takes each)
        validate({"backend": value}, schema, preprocess=True, ignore_required=True,
                 raise_on_error=True)  # fmt: skip


def test_blocks_name_real_pages_and_check_their_template() -> None:
    assert str(SlurmCluster._logo_url) == "https://slurm.schedmd.com/slurm_logo.png"
    assert str(ShipyardBackend._logo_url) == str(ShipyardWorker._logo_url) == PROCESS_LOGO_URL
    for block in (SlurmCluster, ShipyardBackend):
        assert "```python" in (block.get_code_example() or "")
    with pytest.raises(ValueError, match=r"^ui_url: expected a URL template"):
        ShipyardBackend(scheduler="local_cwd", ui_url="https://x/{jobid}").resolve()
    backend = ShipyardBackend(scheduler="local_cwd", ui_url="https://x/{job_id}").resolve()
    assert backend.ui_url == "https://x/{job_id}"


def test_the_worker_emits_its_jobs_states(
    sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import asyncio
    import threading
    from types import SimpleNamespace

    from core.runner import get_runner
    from core.specs import AppDef, Role
    from prefect_tasks.worker import ShipyardJobConfiguration
    from tests.unit.core.memory_scheduler import MemoryScheduler, use_memory_scheduler

    use_memory_scheduler(monkeypatch)
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(tmp_path))
    worker = ShipyardWorker(work_pool_name="events", name=f"events-{uuid.uuid4().hex[:6]}")
    flow_run = SimpleNamespace(id=uuid.uuid4(), name="brave-otter")
    with get_runner() as runner:
        handle = runner.run(AppDef("flow", [Role("flow-run", entrypoint="true")]), "memory")
        app_id = handle.rsplit("/", 1)[1]
        threading.Timer(0.3, MemoryScheduler.finish, (app_id, AppState.SUCCEEDED)).start()
        configuration = ShipyardJobConfiguration(poll_interval=0.1)
        final = asyncio.run(worker._watch(flow_run, configuration, runner, handle))  # type: ignore[arg-type]
    assert final is not None and final.state == AppState.SUCCEEDED
    assert [e["event"] for e in sent] == ["shipyard.job.running", "shipyard.job.succeeded"]
    assert sent[-1]["resource"]["prefect.resource.name"] == "brave-otter"  # (the app's name)
    roles = {r.get("prefect.resource.role") for r in sent[-1]["related"]}
    assert "worker" in roles
