"""The Shipyard worker (issue 29), against the test server and real local jobs: the ``backend``
job variable is the Shipyard Backend block (a block reference, as the UI's block picker sets
it) or a saved one's name, as before; ``kill_infrastructure`` honours ``grace_seconds``."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner
from core.specs import AppDef, AppState, Role
from prefect_tasks import ShipyardBackend
from prefect_tasks.worker import ShipyardJobConfiguration, ShipyardWorker
from tests.helpers import wait_until
from tests.integration.prefect.helpers import DEADLINE


def worker() -> ShipyardWorker:
    return ShipyardWorker(work_pool_name="issue-29", name=f"w-{uuid.uuid4().hex[:6]}")


async def _as_pool_and_deployments(name: str, block_id: uuid.UUID) -> list[Any]:
    """A pool of the worker's type and two deployments on it, ``backend`` a block reference
    and a saved block's name (the server checks job variables against the pool's schema);
    each one's job configuration as the worker builds it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    template = ShipyardWorker.get_default_base_job_template()
    ref = {"$ref": {"block_document_id": str(block_id)}}
    async with get_client() as client:
        await client.create_work_pool(
            WorkPoolCreate(name=name, type="shipyard", base_job_template=template)
        )
        flow_id = await client.create_flow_from_name(f"{name}-flow")
        configurations = []
        for i, backend in enumerate((ref, name)):
            deployment_id = await client.create_deployment(
                flow_id, f"{name}-{i}", work_pool_name=name, job_variables={"backend": backend}
            )
            deployment = await client.read_deployment(deployment_id)
            configurations.append(
                await ShipyardJobConfiguration.from_template_and_values(
                    template, deployment.job_variables, client=client
                )
            )
    return configurations


def test_backend_is_a_block_or_a_saved_blocks_name(name: str) -> None:
    block_id = ShipyardBackend(scheduler="local_dir", cfg={"log_dir": "/tmp/x"}).save(name)
    by_ref, by_name = asyncio.run(_as_pool_and_deployments(name, block_id))
    assert isinstance(by_ref.backend, ShipyardBackend) and by_name.backend == name
    assert (by_ref.backend.scheduler, by_ref.backend.cfg) == ("local_dir", {"log_dir": "/tmp/x"})
    w = worker()
    (b1, r1), (b2, r2) = [asyncio.run(w._backend(c)) for c in (by_ref, by_name)]
    assert (b1.scheduler, b1.cfg) == (b2.scheduler, b2.cfg) == ("local_dir", {"log_dir": "/tmp/x"})
    assert asyncio.run(w._backend(by_ref))[1] is r1  # (a runner per block, kept)
    schema = ShipyardWorker.get_default_base_job_template()["variables"]
    backend = schema["definitions"]["ShipyardBackend"]
    assert backend["block_type_slug"] == "shipyard-backend"  # (the UI shows a block picker)
    for r in (r1, r2):
        r.close()


def graceful(name: str, tmp_path: Path, cleanup: float) -> AppDef:
    """Says it is ready, then on SIGTERM cleans up for ``cleanup`` s and writes ``cleaned``."""
    mark = tmp_path / f"{name}.cleaned"
    script = (
        f"trap 'sleep {cleanup}; echo cleaned > {mark}; exit 0' TERM;"
        f" touch {tmp_path}/{name}.ready; while true; do sleep 0.1; done"
    )
    return AppDef(name, [Role("w", entrypoint="sh", args=["-c", script])])


def test_kill_infrastructure_gives_the_job_grace_seconds_then_kills_it(
    runner: Runner, name: str, tmp_path: Path
) -> None:
    """The local scheduler's own grace is 5 s: a 1 s grace kills a cleanup of 2 s, a 4 s grace
    lets it finish."""
    short = runner.run(graceful("short", tmp_path, cleanup=2), "local_cwd")
    long_ = runner.run(graceful("long", tmp_path, cleanup=2), "local_cwd")
    for job in ("short", "long"):
        wait_until(lambda j=job: (tmp_path / f"{j}.ready").exists(), DEADLINE, f"{job} ready")
    w, configuration = worker(), ShipyardJobConfiguration()

    async def kill_both() -> None:
        await asyncio.gather(
            w.kill_infrastructure(short, configuration, grace_seconds=1),
            w.kill_infrastructure(long_, configuration, grace_seconds=4),
        )

    asyncio.run(kill_both())
    short_status, long_status = runner.status(short), runner.status(long_)
    assert short_status is not None and long_status is not None
    assert short_status.state == long_status.state == AppState.CANCELLED
    assert not (tmp_path / "short.cleaned").exists()  # SIGKILLed at 1 s, mid-cleanup
    assert (tmp_path / "long.cleaned").read_text() == "cleaned\n"  # its cleanup had the time
    assert short_status.roles[0].replicas[0].exit_code == -9


def test_kill_infrastructure_of_no_job_says_so() -> None:
    from prefect.exceptions import InfrastructureNotFound

    with pytest.raises(InfrastructureNotFound):
        asyncio.run(
            worker().kill_infrastructure("local_cwd://shipyard/nope-0", ShipyardJobConfiguration())
        )
