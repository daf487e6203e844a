"""The scripted backend failures of ``tests/unit/core/watch/test_faces.py`` (a hiccup, an outage past the
retry budget, silent replicas) through the Prefect faces of the watch: the ``wait_for_job`` task
and the worker's following of a flow run's job."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.errors import BackendUnavailableError, JobSilentError
from core.runner import get_runner
from core.specs import AppDef, AppState, Role
from prefect_tasks.tasks import wait_for_job
from prefect_tasks.worker import ShipyardJobConfiguration, ShipyardWorker
from tests.unit.core.memory_scheduler import (
    OUTAGE_BUDGET,
    SILENCE,
    MemoryScheduler,
    Scenario,
    use_memory_scheduler,
)


@pytest.fixture(autouse=True)
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_memory_scheduler(monkeypatch)
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", OUTAGE_BUDGET)
    yield


APP = AppDef("face", [Role("w", entrypoint="echo", num_replicas=2)])


def wait(handle: str, **kwargs: object) -> object:
    return wait_for_job.fn(handle, poll_interval=0.1, cancel_check_interval=None, **kwargs)  # type: ignore[arg-type]


def test_wait_for_job() -> None:
    with get_runner() as runner:
        with Scenario("hiccup") as s:
            assert wait(runner.run(APP, "memory")).state == AppState.SUCCEEDED == s.state  # type: ignore[attr-defined]
        with Scenario("outage"), pytest.raises(BackendUnavailableError, match="kept failing"):
            wait(runner.run(APP, "memory"))
        with Scenario("silent") as s, pytest.raises(JobSilentError, match="from w/0, w/1"):
            wait(runner.run(APP, "memory"), max_silence=SILENCE)
        assert s.state == AppState.CANCELLED


class RunLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors.append(record.getMessage())


def test_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(tmp_path))
    worker = ShipyardWorker(work_pool_name="faces", name=f"faces-{uuid.uuid4().hex[:6]}")
    run_log = logging.getLogger(f"test.faces.{uuid.uuid4().hex}")
    errors = RunLog()
    run_log.addHandler(errors)
    monkeypatch.setattr(worker, "get_flow_run_logger", lambda flow_run: run_log)
    configuration = ShipyardJobConfiguration(poll_interval=0.1)
    flow_run = SimpleNamespace(id=uuid.uuid4(), name="brave-otter")

    async def follow(handle: str) -> object:
        return await worker._watch(flow_run, configuration, runner, handle)  # type: ignore[arg-type]

    with get_runner() as runner:
        with Scenario("hiccup") as s:
            status = asyncio.run(follow(runner.run(APP, "memory")))
            assert status.state == AppState.SUCCEEDED == s.state  # type: ignore[attr-defined]

        async def through_an_outage(handle: str) -> object:
            following = asyncio.ensure_future(follow(handle))
            while not errors.errors:  # told in the run's log once past the budget ...
                await asyncio.sleep(0.05)
            assert not following.done()  # ... and followed on
            MemoryScheduler.failures.clear()  # the backend is back
            MemoryScheduler.finish(s.app_ids[-1], AppState.SUCCEEDED)
            return await asyncio.wait_for(following, 30)

        with Scenario("outage") as s:
            status = asyncio.run(through_an_outage(runner.run(APP, "memory")))
            assert status.state == AppState.SUCCEEDED  # type: ignore[attr-defined]
        assert "kept failing" in errors.errors[0] and "still following the job" in errors.errors[0]
