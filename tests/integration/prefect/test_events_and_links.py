"""Issue 29 through Prefect, against the test server: each state a job reaches is one event
``shipyard.job.<state>`` (resource the handle, payload reason and exit codes), emitted from
the tasks and flows; and the run that submits a job gets a link artifact to its page."""

from __future__ import annotations

from typing import Any

import pytest
from prefect import flow

from core.runner import AppFailedError
from prefect_tasks import ShipyardBackend, run_job, submit_job, wait_for_job
from prefect_tasks.events import emit_job_state
from tests.helpers import wait_until
from tests.integration.prefect.helpers import DEADLINE, flow_run_artifacts, sh_app


def job_events(handle: str, *wanted: str) -> list[Any]:
    """The events of the job ``handle`` (oldest first), once the server stored those named."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventResourceFilter

    def stored() -> list[Any] | None:
        with get_client(sync_client=True) as client:
            page = client.read_events(
                filter=EventFilter(resource=EventResourceFilter(id=[f"shipyard.job.{handle}"])),
                limit=50,
            )
        events = sorted(page.events, key=lambda e: e.occurred)
        return events if set(wanted) <= {e.event for e in events} else None

    found: list[Any] = wait_until(stored, DEADLINE, f"events {wanted} of {handle}")
    return found


def links(flow_run_id: Any) -> list[Any]:
    """The run's link artifacts (Prefect stores a link as a markdown artifact)."""
    return [a for a in flow_run_artifacts(flow_run_id) if "](http" in str(a.data)]


def test_each_state_is_one_event_and_the_run_links_to_the_job(name: str) -> None:
    template = "https://grafana.example/d/x?job={app_id}"
    ShipyardBackend(scheduler="local_cwd", ui_url=template).save(f"{name}-ui")
    app = sh_app(name, {"w": (2, "sleep 0.5; echo done")})
    state = run_job(app, f"{name}-ui", return_state=True)
    assert state.is_completed(), state
    handle = state.result().handle
    events = job_events(handle, "shipyard.job.running", "shipyard.job.succeeded")
    names = [e.event for e in events]
    assert names[-2:] == ["shipyard.job.running", "shipyard.job.succeeded"], names
    assert len(names) == len(set(names))  # (each state once, though two tasks saw RUNNING)
    last = events[-1]
    assert last.resource["prefect.resource.name"] == name
    assert last.resource["shipyard.scheduler"] == "local_cwd"
    assert last.payload["exit_codes"] == {"w": [0, 0]} and last.payload["reason"] == "exit_code"
    assert "flow-run" in {r.role for r in last.related}
    # the same state seen again (another process, a retry) is the same event: stored once
    assert emit_job_state(handle, state.result().status) is False  # (this process knows)

    (link,) = links(state.state_details.flow_run_id)  # (Prefect keeps it as markdown)
    app_id = handle.rsplit("/", 1)[1]
    assert link.data == f"[{handle}](https://grafana.example/d/x?job={app_id})"
    assert link.description == f"Shipyard job {handle} ({name})"


def test_a_failed_job_has_its_reason_and_exit_codes(name: str) -> None:
    @flow
    def fails() -> str:
        handle = submit_job(sh_app(name, {"w": (1, "echo bad; exit 7")}))
        try:
            wait_for_job(handle, poll_interval=0.2)
        except AppFailedError:
            return handle
        raise AssertionError("the job did not fail")

    handle = fails()
    failed = job_events(handle, "shipyard.job.failed")[-1]
    assert failed.event == "shipyard.job.failed"
    assert failed.payload["exit_codes"] == {"w": [7]}
    assert failed.payload["reason"] == "exit_code" and failed.payload["state"] == "FAILED"


def test_no_template_no_link(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHIPYARD_UI_URL", raising=False)
    state = run_job(sh_app(name, {"w": (1, "true")}), return_state=True)
    assert state.is_completed(), state
    assert not links(state.state_details.flow_run_id)
