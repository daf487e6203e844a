"""A Docker app's state from its containers as the engine lists them (no engine: list entries
as the engine gives them, in moments a test cannot hold a real engine in, such as the engine
stopping its containers one after the other while it shuts down).

An app ends when every replica has ended: a replica that failed while others still run leaves
the app RUNNING (their stop is asked for), so an ended app's state and exit codes are final."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.schedulers.docker import state
from core.schedulers.docker.model import (
    CANCELLED_SUFFIX,
    LABEL_APP_ID,
    LABEL_REPLICA_ID,
    LABEL_ROLE_NAME,
    LABEL_ROLES,
)
from core.specs import AppState

EXITED = {0: "Exited (0) 1 second ago", 3: "Exited (3) 2 seconds ago", 137: "Exited (137) now"}


def _c(rid: int, st: str, code: int | None = None, cancelling: bool = False) -> dict[str, Any]:
    name = f"/a-1-w-{rid}" + (CANCELLED_SUFFIX if cancelling else "")
    roles = json.dumps([{"name": "w", "num_replicas": 2}])
    labels = {
        LABEL_APP_ID: "a-1",
        LABEL_ROLE_NAME: "w",
        LABEL_REPLICA_ID: str(rid),
        LABEL_ROLES: roles,
    }
    status = EXITED[code] if code is not None else "Up 3 seconds"
    return {"Id": f"id{rid}", "Names": [name], "State": st, "Status": status, "Labels": labels}


def _summary(*containers: dict[str, Any]) -> tuple[AppState, dict[str, list[int | None]], str]:
    resp, complete = state.summarize("a-1", list(containers), {}, 0.0)
    assert complete
    codes = {rs.role: [r.exit_code for r in rs.replicas] for rs in resp.roles_statuses}
    return resp.state, codes, resp.msg


def test_a_replica_killed_while_the_other_still_runs_leaves_the_app_running() -> None:
    # the engine shutting down: replica 0 killed, replica 1 not yet (a kept-alive connection
    # still answers); the app has not ended, and replica 1's stop is asked for
    containers = (_c(0, "exited", 137), _c(1, "running"))
    assert _summary(*containers) == (
        AppState.RUNNING,
        {"w": [137, None]},
        "w/0 exited with code 137; stopping the other replicas",
    )
    assert [c["Id"] for c in state.gang_survivors(list(containers))] == ["id1"]


def test_the_app_ends_failed_with_every_code_once_every_replica_ended() -> None:
    st, codes, msg = _summary(_c(0, "exited", 137), _c(1, "exited", 137))
    assert (st, codes) == (AppState.FAILED, {"w": [137, 137]})
    assert msg == "w/0 exited with code 137; w/1 exited with code 137"
    assert _summary(_c(0, "exited", 3), _c(1, "exited", 0))[:2] == (
        AppState.FAILED,
        {"w": [3, 0]},
    )


@pytest.mark.parametrize(
    ("other", "survivor"),
    [("restarting", True), ("paused", True), ("created", False)],
)
def test_a_replica_waiting_to_run_again_is_stopped_too(other: str, survivor: bool) -> None:
    containers = [_c(0, "exited", 3), _c(1, other)]
    assert _summary(*containers)[0] == AppState.RUNNING
    assert bool(state.gang_survivors(containers)) is survivor


def test_nothing_is_stopped_while_no_replica_failed_or_the_app_is_being_cancelled() -> None:
    assert state.gang_survivors([_c(0, "exited", 0), _c(1, "running")]) == []
    assert _summary(_c(0, "exited", 0), _c(1, "running"))[0] == AppState.RUNNING
    cancelling = [_c(0, "exited", 137, cancelling=True), _c(1, "running", cancelling=True)]
    assert state.gang_survivors(cancelling) == []
    assert _summary(*cancelling)[0] == AppState.CANCELLED


def test_pending_running_and_succeeded_as_before() -> None:
    assert _summary(_c(0, "created"), _c(1, "created"))[0] == AppState.PENDING
    assert _summary(_c(0, "created"), _c(1, "running"))[0] == AppState.RUNNING
    assert _summary(_c(0, "exited", 0), _c(1, "exited", 0))[:2] == (
        AppState.SUCCEEDED,
        {"w": [0, 0]},
    )
