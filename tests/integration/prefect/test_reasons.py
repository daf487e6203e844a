"""Why a job ended, in the Prefect state of the flow that waited for it (issue 27): each reason
produced for real on a backend where it exists, through ``submit_job`` and ``wait_for_job`` on
the real Prefect server; the state's message names it (``reason oom``), for code as well as
people."""

from __future__ import annotations

from typing import Any

import pytest
from prefect import flow

from core.runner import get_runner
from core.specs import AppDef, Resource, Role
from prefect_tasks import submit_job, wait_for_job

IMAGE = "shipyard-test/busybox:latest"


def _app(name: str, script: str, image: str = "", mem: int = 0) -> AppDef:
    role = Role("w", image=image, entrypoint="sh", args=["-c", script])
    if mem:
        role.resource = Resource(1, 0, mem)
    return AppDef(name, [role])


CASES = [
    pytest.param("signal", "local_cwd", _app("sig", "kill -9 $$"), {}, id="signal-local"),
    pytest.param("timeout", "local_cwd", _app("lim", "sleep 300"), {"time_limit": "1s"},
                 id="timeout-local"),
    pytest.param("timeout", "local_docker", _app("lim", "sleep 300", IMAGE),
                 {"time_limit": "2s", "stop_timeout": 1}, id="timeout-docker",
                 marks=pytest.mark.docker),
    pytest.param("oom", "local_docker", _app("oom", "head -c 300m /dev/zero | tail", IMAGE, 64),
                 {}, id="oom-docker", marks=pytest.mark.docker),
]  # fmt: skip


@pytest.mark.parametrize(("reason", "scheduler", "app", "cfg"), CASES)
def test_the_reason_is_in_the_failed_state_message(
    reason: str, scheduler: str, app: AppDef, cfg: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    if scheduler == "local_docker":
        request.getfixturevalue("docker_client")

    @flow
    def job() -> Any:
        return wait_for_job(submit_job(app, scheduler, cfg), poll_interval=0.2)

    state = job(return_state=True)
    assert state.is_failed() and f"reason {reason}" in (state.message or ""), state


def test_a_silent_job_and_one_whose_dependency_failed_name_theirs() -> None:
    hangs = _app("hang", "echo started; sleep 300")

    @flow
    def silent() -> Any:
        return wait_for_job(submit_job(hangs, "local_cwd"), poll_interval=0.2, max_silence=1)

    state = silent(return_state=True)
    assert state.is_failed() and "reason silent" in (state.message or ""), state
    with get_runner("prefect-reasons") as runner:
        failed = runner.run(_app("up", "exit 3"), "local_cwd")
        waiting = runner.run(_app("down", "echo never"), "local_cwd", after=[failed])

    @flow
    def dependent() -> Any:
        return wait_for_job(waiting, poll_interval=0.2)

    state = dependent(return_state=True)
    assert state.is_failed() and "reason dependency" in (state.message or ""), state
    assert failed in (state.message or "")  # (names the dependency)
