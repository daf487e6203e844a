"""core.reasons: why an app and its replicas ended, from what every backend reports."""

from __future__ import annotations

import pytest

from core.reasons import fill_reasons
from core.schedulers.slurm.jobinfo import Component, JobInfo, to_response
from core.specs import AppState, AppStatus, ReplicaStatus, ResourceUsage, RoleStatus

S, F, C, R = AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED, AppState.RUNNING


def status(state: AppState, *replicas: tuple[AppState, int | None], msg: str = "") -> AppStatus:
    reps = [ReplicaStatus(i, st, "w", "", exit_code=code) for i, (st, code) in enumerate(replicas)]
    return fill_reasons(AppStatus(state, msg=msg, roles=[RoleStatus("w", reps)]))


@pytest.mark.parametrize(
    "app, replicas, msg, want, want_replicas",
    [
        (S, [(S, 0), (S, 0)], "", "exit_code", ["exit_code", "exit_code"]),
        (F, [(F, 3), (S, 0)], "", "exit_code", ["exit_code", "exit_code"]),
        (F, [(F, -9), (F, 2)], "", "signal", ["signal", "exit_code"]),
        (C, [(C, -15), (C, None)], "", "cancelled", ["cancelled", "cancelled"]),
        (F, [(F, None)], "submit interrupted: w/0 never started", "submit_interrupted", [None]),
        (R, [(R, None), (S, 0)], "", None, [None, "exit_code"]),
    ],
)
def test_reasons_from_states_and_exit_codes(
    app: AppState, replicas: list, msg: str, want: str | None, want_replicas: list
) -> None:
    got = status(app, *replicas, msg=msg)
    assert got.reason == want
    assert [r.reason for r in got.roles[0].replicas] == want_replicas
    assert got.to_json()["reason"] == want


def test_an_oom_kill_outranks_the_other_failures() -> None:
    reps = [
        ReplicaStatus(0, F, "w", "", exit_code=1),
        ReplicaStatus(1, F, "w", "", exit_code=137, usage=ResourceUsage(1.0, oom_killed=True)),
    ]
    got = fill_reasons(AppStatus(F, roles=[RoleStatus("w", reps)]))
    assert got.reason == "oom" and [r.reason for r in reps] == ["exit_code", "oom"]


@pytest.mark.parametrize(
    "slurm, want",
    [("TIMEOUT", "timeout"), ("PREEMPTED", "preempted"), ("NODE_FAIL", "node_failure"),
     ("OUT_OF_MEMORY", "oom"), ("CANCELLED", "cancelled"), ("FAILED", None)],
)  # fmt: skip
def test_slurm_states_say_why(slurm: str, want: str | None) -> None:
    comp = Component(0, "w-0", slurm, step_state="CANCELLED")
    info = JobInfo("7", slurm, components={0: comp})
    resp = to_response(info)
    assert resp.reason == want
    replica = resp.roles_statuses[0].replicas[0]
    # a job's timeout, preemption or node failure cancels its steps: they say why
    assert replica.reason == (want if want not in (None, "cancelled") else "cancelled")
