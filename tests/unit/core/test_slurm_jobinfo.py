"""What the controller's rows say of a requeued job: its derived exit codes span every attempt
(the real cluster shows this only while accounting lags, which no test can bring on); and how
the tasks of a native array are read from every source (squeue, sacct, slurmrestd), including
the forms a real cluster shows only for a moment (a pending range)."""

from __future__ import annotations

from core.schedulers.slurm import rest_v0038
from core.schedulers.slurm.jobinfo import (
    SEP,
    SQUEUE_FIELDS,
    expand_task_ids,
    parse_sacct,
    parse_squeue,
    to_response,
    wait_status_code,
)
from core.specs import AppState


def _row(**fields: str) -> str:
    values = {
        "HetJobID": "40",
        "HetJobOffset": "0",
        "JobID": "40",
        "ArrayJobID": "40",
        "ArrayTaskID": "N/A",
        "State": "COMPLETED",
        "RestartCnt": "0",
        "DerivedEC": "0",
        "Name": "flaky-0",
        "NodeList": "node1",
        "WorkDir": "/w",
        "Reason": "None",
        "Comment": "(null)",
    }
    values.update(fields)
    return SEP.join(values[f] for f in SQUEUE_FIELDS) + SEP


def _codes(*rows: str) -> dict[str, tuple[AppState, int | None]]:
    d = to_response(parse_squeue("\n".join(rows))["40"])
    return {
        f"{rs.role}-{r.id}": (r.state, r.exit_code) for rs in d.roles_statuses for r in rs.replicas
    }


def test_a_first_attempt_has_the_derived_exit_code() -> None:
    rows = [
        _row(State="FAILED", DerivedEC=str(7 << 8)),
        _row(HetJobOffset="1", JobID="41", State="FAILED", Name="steady-0"),
    ]
    assert _codes(*rows) == {"flaky-0": (AppState.FAILED, 7), "steady-0": (AppState.SUCCEEDED, 0)}


def test_a_het_job_whose_leader_ended_first_runs_until_every_component_has() -> None:
    # as a real 22.05 cluster showed for ~10 ms: the leader FAILED, the failing component still
    # COMPLETING (its code not final); reading the job as ended then lost that code
    ending = [
        _row(State="FAILED", Name="trainer-0"),
        _row(HetJobOffset="1", JobID="41", State="COMPLETING", DerivedEC="768", Name="ps-0"),
    ]
    d = to_response(parse_squeue("\n".join(ending))["40"])
    assert d.state == AppState.RUNNING
    ended = [ending[0], ending[1].replace("COMPLETING", "FAILED")]
    assert _codes(*ended) == {"trainer-0": (AppState.SUCCEEDED, 0), "ps-0": (AppState.FAILED, 3)}


def test_a_requeued_job_that_completed_exited_0_whatever_earlier_attempts_did() -> None:
    rows = [
        _row(RestartCnt="1", DerivedEC=str(7 << 8)),
        _row(HetJobOffset="1", JobID="41", RestartCnt="1", Name="steady-0"),
    ]
    assert _codes(*rows) == {
        "flaky-0": (AppState.SUCCEEDED, 0),
        "steady-0": (AppState.SUCCEEDED, 0),
    }


def test_a_requeued_job_that_failed_has_the_highest_exit_code_of_its_attempts() -> None:
    # the best the controller knows; accounting's own record of the last attempt wins
    rows = [_row(State="FAILED", RestartCnt="2", DerivedEC=str(7 << 8))]
    assert _codes(*rows) == {"flaky-0": (AppState.FAILED, 7)}


def test_task_ranges_expand_as_slurm_writes_them() -> None:
    assert expand_task_ids("2-5%2") == [2, 3, 4, 5]
    assert expand_task_ids("[1,3,7-9]") == [1, 3, 7, 8, 9]
    assert expand_task_ids("N/A") == []
    assert expand_task_ids("") == []


def test_squeue_rows_of_array_tasks_are_apps_named_by_task() -> None:
    rows = [
        _row(HetJobID="N/A", JobID="51", ArrayJobID="50", ArrayTaskID="0", State="RUNNING"),
        _row(HetJobID="N/A", JobID="50", ArrayJobID="50", ArrayTaskID="1-3%2", State="PENDING"),
    ]
    jobs = parse_squeue("\n".join(rows))
    assert sorted(jobs) == ["50_0", "50_1", "50_2", "50_3"]
    assert {j.submit_id for j in jobs.values()} == {"50"}
    assert jobs["50_0"].state == "RUNNING" and jobs["50_3"].state == "PENDING"


def test_sacct_tasks_that_never_started_share_one_record() -> None:
    out = "\n".join(
        SEP.join(r)
        for r in [
            ("60_0", "w-0", "COMPLETED", "0:0", "node1", "/w", "c"),
            ("60_0.0", "sh", "COMPLETED", "0:0", "node1", "", ""),
            ("60_1", "w-0", "FAILED", "3:0", "node2", "/w", "c"),
            ("60_1.0", "sh", "FAILED", "3:0", "node2", "", ""),
            ("60_[2-3%2]", "w-0", "CANCELLED by 0", "0:0", "None assigned", "/w", "c"),
        ]
    )
    jobs = parse_sacct(out)
    assert sorted(jobs) == ["60_0", "60_1", "60_2", "60_3"]
    states = {a: to_response(j).state for a, j in jobs.items()}
    assert states == {
        "60_0": AppState.SUCCEEDED,
        "60_1": AppState.FAILED,
        "60_2": AppState.CANCELLED,
        "60_3": AppState.CANCELLED,
    }
    assert to_response(jobs["60_1"]).roles_statuses[0].replicas[0].exit_code == 3


def test_sacct_attempts_of_a_requeued_job_say_why_and_where_each_ended() -> None:
    # sacct -D of a job preempted on node1, retried after exit 3 on node2, then running
    out = "\n".join(
        SEP.join(r)
        for r in [
            ("90", "w-0", "PREEMPTED", "0:0", "node1", "/w", "c"),
            ("90.0", "sh", "CANCELLED", "0:15", "node1", "", ""),
            ("90", "w-0", "REQUEUED", "0:0", "node2", "/w", "c"),
            ("90.0", "sh", "FAILED", "3:0", "node2", "", ""),
            ("90", "w-0", "RUNNING", "0:0", "node3", "/w", "c"),
        ]
    )
    info = parse_sacct(out)["90"]
    assert info.restarts == 2 and info.state == "RUNNING"
    assert [(a.number, a.state, a.reason, a.nodes) for a in info.attempts] == [
        (0, "PREEMPTED", "preempted", "node1"),
        (1, "REQUEUED", "exit_code", "node2"),
    ]
    assert to_response(info).attempts == info.attempts


def test_slurmrestd_array_records_as_slurm_22_05_gives_them() -> None:
    # (the shapes of GET jobs and GET slurmdb job/{id} on the test cluster)
    base = {"name": "w-0", "job_state": "RUNNING", "nodes": "node1", "het_job_id": 0}
    payload = {
        "jobs": [
            {**base, "job_id": 71, "array_job_id": 70, "array_task_id": 0, "array_task_string": ""},
            {
                **base,
                "job_id": 70,
                "array_job_id": 70,
                "array_task_id": None,
                "array_task_string": "1-2%1",
                "job_state": "PENDING",
            },
            {**base, "job_id": 80, "array_job_id": 0, "array_task_id": None},
        ]
    }
    jobs = rest_v0038.parse_jobs(payload)
    assert sorted(jobs) == ["70_0", "70_1", "70_2", "80"]
    assert jobs["70_2"].state == "PENDING" and jobs["70_2"].submit_id == "70"
    acct = {
        "jobs": [
            {
                "job_id": 71,
                "name": "w-0",
                "state": {"current": "COMPLETED"},
                "array": {"job_id": 70, "task_id": 0, "task": None},
            }
        ]
    }
    assert list(rest_v0038.parse_accounting(acct)) == ["70_0"]


def test_derived_exit_codes_of_both_releases() -> None:
    # squeue -O DerivedEC: a raw wait status in 22.05, code:signal in 26.05 (seen on both rigs)
    assert [wait_status_code(x) for x in ("0", "768", "9")] == [0, 3, -9]
    assert [wait_status_code(x) for x in ("0:0", "3:0", "0:9")] == [0, 3, -9]
    assert wait_status_code("") is None and wait_status_code("N/A") is None
