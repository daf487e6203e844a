"""run_job and the tasks on the local scheduler: success, logs in the Prefect API, failures,
retries (re-attach, never submit twice), app given as AppDef / dict / YAML path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect import flow, task
from prefect.context import TaskRunContext

from core.appfile import app_to_dict
from core.runner import AppFailedError, Runner, get_runner
from core.specs import AppState
from prefect_tasks import JobResult, run_job, submit_job, wait_for_job
from tests.helpers import wait_until
from tests.integration.prefect.helpers import (
    DEADLINE,
    apps_named,
    flow_run_logs,
    sh_app,
    task_runs,
)


def _two_roles(name: str) -> Any:
    return sh_app(
        name,
        {
            "coord": (1, 'for i in 1 2 3; do echo "coord line $i"; done'),
            "worker": (2, 'for i in 1 2 3; do echo "worker $0 line $i"; done'),
        },
    )


def test_run_job_local_succeeds_and_every_line_is_one_record_in_the_api(name: str) -> None:
    app = _two_roles(name)
    # the worker replicas say which replica they are through $0
    for role in app.roles:
        role.args.append("${replica_id}")

    state = run_job(app, return_state=True)

    assert state.is_completed(), state
    result = state.result()
    assert isinstance(result, JobResult)
    assert result.state == AppState.SUCCEEDED
    assert result.status.exit_codes() == {"coord": [0], "worker": [0, 0]}
    logs = flow_run_logs(state.state_details.flow_run_id)
    expected = [f"coord/0 coord line {i}" for i in (1, 2, 3)] + [
        f"worker/{k} worker {k} line {i}" for k in (0, 1) for i in (1, 2, 3)
    ]
    for line in expected:
        assert logs.count(line) == 1, (line, logs)
    assert all("\n" not in message for message in logs)
    # each replica's lines keep their order
    for prefix in ("coord/0", "worker/0", "worker/1"):
        mine = [m for m in logs if m.startswith(prefix + " ")]
        assert mine == sorted(mine), mine


def test_log_lines_reach_the_api_while_the_job_runs(name: str, tmp_path: Path) -> None:
    """The job only finishes after the test saw its first line in the Prefect API."""
    go = tmp_path / "go"
    app = sh_app(
        name,
        {"main": (1, f'echo "first {name}"; while [ ! -e {go} ]; do sleep 0.1; done; echo second')},
    )
    done: dict[str, Any] = {}

    @flow
    def streaming() -> Any:
        done["flow_run_id"] = _flow_run_id()
        return run_job(app, poll_interval=0.2)

    thread = threading.Thread(target=lambda: done.setdefault("state", streaming(return_state=True)))
    thread.start()
    try:
        wait_until(lambda: "flow_run_id" in done, DEADLINE, "the flow to start")
        wait_until(
            lambda: f"main/0 first {name}" in flow_run_logs_of_children(done["flow_run_id"]),
            DEADLINE,
            "the first line in the Prefect API while the job runs",
        )
    finally:
        go.touch()
        thread.join(120)
    assert not thread.is_alive()
    assert done["state"].is_completed(), done["state"]
    assert "main/0 second" in flow_run_logs_of_children(done["flow_run_id"])


def _flow_run_id() -> Any:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    return ctx.flow_run.id


def flow_run_logs_of_children(parent_id: Any) -> list[str]:
    """Logs of a flow run and of its subflow runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
            )
        )
    out = flow_run_logs(parent_id)
    for child in children:
        out += flow_run_logs(child.id)
    return out


def test_app_as_dict_and_as_yaml_path(name: str, tmp_path: Path) -> None:
    data = app_to_dict(sh_app(name, {"hello": (1, "echo hello from yaml-or-dict")}))
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump(data))

    @flow
    def both() -> list[Any]:
        handles = [submit_job(data), submit_job(str(path))]
        return [wait_for_job(h) for h in handles]

    state = both(return_state=True)
    assert state.is_completed(), state
    assert [s.state for s in state.result()] == [AppState.SUCCEEDED] * 2
    assert len(apps_named(name)) == 2
    assert (
        flow_run_logs(state.state_details.flow_run_id).count("hello/0 hello from yaml-or-dict") == 2
    )


def test_failing_job_fails_the_task_with_exit_code_and_last_lines(name: str) -> None:
    app = sh_app(name, {"ok": (1, "echo fine"), "bad": (1, "echo boom-before-exit; exit 3")})

    state = run_job(app, return_state=True)

    assert state.is_failed(), state
    with pytest.raises(AppFailedError) as info:
        state.result()
    err = info.value
    assert err.state == AppState.FAILED
    assert err.exit_codes["bad"] == [3]
    assert "bad/0=3" in str(err)
    assert "boom-before-exit" in str(err)
    assert err.last_lines["bad/0"][-1].strip() == "boom-before-exit"
    runs = {r.name.rsplit("-", 1)[0]: r for r in task_runs(state.state_details.flow_run_id)}
    wait_run = runs["shipyard-wait-for-job"]
    assert wait_run.state.is_failed()
    assert "bad/0=3" in wait_run.state.message


def test_retried_task_reattaches_to_the_job_it_submitted(name: str) -> None:
    app = sh_app(name, {"main": (1, "echo attempt; sleep 1")})
    seen: list[str] = []

    @task(retries=2, retry_delay_seconds=0)
    def flaky_submit() -> str:
        handle = submit_job.fn(app)
        seen.append(handle)
        run_count = TaskRunContext.get().task_run.run_count  # type: ignore[union-attr]
        if run_count < 3:
            raise RuntimeError(f"worker lost after submitting (attempt {run_count})")
        return handle

    @flow
    def reattach() -> Any:
        return wait_for_job(flaky_submit())

    state = reattach(return_state=True)
    assert state.is_completed(), state
    assert len(seen) == 3 and len(set(seen)) == 1, seen
    assert apps_named(name) == seen[:1]
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert sum("re-attaching to" in m and seen[0] in m for m in logs) == 2, logs


@pytest.mark.parametrize("budget, attempts", [("60", 1), ("1", 2)], ids=["tolerated", "retried"])
def test_backend_errors_while_waiting_keep_the_job(
    name: str, monkeypatch: Any, budget: str, attempts: int
) -> None:
    """Errors polling the status (the backend briefly unreachable: faked, a real one cannot be
    produced on demand): three in a row (0.5 + 1 + 2 s of backoff) are retried within a budget
    of 60 s; with a budget of 1 s they fail the attempt but leave the job running, and the
    task's retry follows it to the end."""
    errors = 3
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", budget)
    app = sh_app(name, {"main": (1, "sleep 1; echo survived")})
    real_status_many = Runner.status_many
    calls = {"n": 0}
    job: list[str] = []

    def flaky_status_many(self: Runner, handles: Any) -> Any:
        handles = list(handles)
        if job and job[0] in handles:
            calls["n"] += 1
            if 3 <= calls["n"] < 3 + errors:
                raise ConnectionError("backend unreachable")
        return real_status_many(self, handles)

    monkeypatch.setattr(Runner, "status_many", flaky_status_many)

    @flow
    def waits() -> Any:
        job.append(submit_job(app))
        return wait_for_job.with_options(retries=1, retry_delay_seconds=0)(job[0])

    state = waits(return_state=True)
    assert state.is_completed(), state
    assert state.result().state == AppState.SUCCEEDED
    assert calls["n"] > 2 + errors
    assert len(apps_named(name)) == 1
    runs = task_runs(state.state_details.flow_run_id)
    wait_run = next(r for r in runs if r.name.startswith("shipyard-wait-for-job"))
    assert wait_run.run_count == attempts
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert "main/0 survived" in logs
    assert sum("backend unreachable" in m for m in logs) >= 2


def test_flow_retry_runs_a_failed_job_again(name: str, tmp_path: Path) -> None:
    """The first job fails; the flow's retry submits a fresh one (and only one), which succeeds."""
    marker = tmp_path / "tried"
    app = sh_app(
        name, {"main": (1, f"if [ -e {marker} ]; then echo ok; else touch {marker}; exit 7; fi")}
    )

    state = run_job.with_options(retries=1, retry_delay_seconds=0)(app, return_state=True)

    assert state.is_completed(), state
    handles = apps_named(name)
    assert len(handles) == 2
    with get_runner() as runner:
        states = sorted(runner.status(h).state.name for h in handles)  # type: ignore[union-attr]
    assert states == ["FAILED", "SUCCEEDED"]
    assert state.result().handle in handles
