"""What the controller's rows say of a requeued job: its derived exit codes span every attempt
(the real cluster shows this only while accounting lags, which no test can bring on)."""

from __future__ import annotations

from core.schedulers.slurm.jobinfo import SEP, SQUEUE_FIELDS, parse_squeue, to_response
from core.specs import AppState


def _row(**fields: str) -> str:
    values = {
        "HetJobID": "40",
        "HetJobOffset": "0",
        "JobID": "40",
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
