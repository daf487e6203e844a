"""slurmrestd v0.0.42-v0.0.45 (Slurm 24.11-26.05): the submission body and the answers, in the
forms slurmrestd 26.05.3 gave on the rig (``scripts/start_slurm26.sh``)."""

from __future__ import annotations

from typing import Any

from core.schedulers.slurm import rest_v0042
from core.schedulers.slurm_scheduler import SlurmScheduler
from core.specs import AppDef, Resource, Role


def _num(n: int | None) -> dict[str, Any]:
    return {"set": n is not None, "infinite": False, "number": n or 0}


def _code(status: str, code: int | None, signal: int | None = None) -> dict[str, Any]:
    return {"status": [status], "return_code": _num(code), "signal": {"id": _num(signal)}}


def test_a_het_job_becomes_one_property_set_per_component() -> None:
    app = AppDef(
        "a",
        [
            Role("trainer", entrypoint="true", resource=Resource(cpu=1, gpu=0, memMB=500)),
            Role("ps", entrypoint="true"),
        ],
    )
    cfg = {"time_limit": "90s", "checkpoint_signal": "USR1", "max_requeues": 1}
    req = SlurmScheduler("s").submit_dryrun(app, cfg).request
    body = rest_v0042.submission(req, "/w", hold=True, env={"PATH": "/usr/bin"})
    first, second = body["jobs"]
    assert first["script"].startswith("#!/bin/bash") and "script" not in second
    assert first["environment"] == ["PATH=/usr/bin"] and first["hold"] is True
    assert first["time_limit"] == {"set": True, "number": 2}  # (whole minutes, rounded up)
    assert first["kill_warning_signal"] == "USR1" and first["kill_warning_flags"] == ["BATCH_JOB"]
    assert first["requeue"] is True and first["open_mode"] == ["APPEND"]
    mem = [c.get("memory_per_node") for c in body["jobs"]]
    assert {"set": True, "number": 500} in mem  # (the component that asked for memory)
    assert all(c["current_working_directory"] == "/w" for c in body["jobs"])


def test_the_v0038_refusals_do_not_apply() -> None:
    app = AppDef("a", [Role("w", entrypoint="true")])
    cfg = {"time_limit": "5m", "requeue_on_timeout": True, "exclude_failed_nodes": True}
    req = SlurmScheduler("s").submit_dryrun(app, {**cfg, "max_requeues": 2}).request
    body = rest_v0042.submission(req, "/w", hold=False, env={})
    assert body["job"]["kill_warning_flags"] == ["BATCH_JOB"]
    assert "Requeue=0" not in body["job"]["script"] or body["job"]["requeue"] is True


def test_controller_records_of_a_het_job_and_an_array() -> None:
    het = {
        "job_state": ["RUNNING", "COMPLETING"],
        "restart_cnt": 0,
        "het_job_id": _num(228),
        "array_job_id": _num(0),
        "array_task_id": _num(None),
        "derived_exit_code": _code("SUCCESS", 0),
        "nodes": "s26n1",
        "state_reason": "None",
        "comment": "c",
        "user_name": "hpcuser",
    }
    arr = {**het, "het_job_id": _num(0), "array_job_id": _num(230), "job_state": ["PENDING"]}
    payload = {
        "jobs": [
            {**het, "job_id": 228, "name": "a-0", "het_job_offset": _num(0)},
            {**het, "job_id": 229, "name": "b-0", "het_job_offset": _num(1)},
            {**arr, "job_id": 230, "array_task_string": "2-3%2", "nodes": ""},
            {**arr, "job_id": 231, "array_task_id": _num(0), "job_state": ["FAILED"]},
        ]
    }
    payload["jobs"][3]["derived_exit_code"] = _code("SIGNALED", None, 9)
    jobs = rest_v0042.parse_jobs(payload)
    assert sorted(jobs) == ["228", "230_0", "230_2", "230_3"]
    assert jobs["228"].state == "COMPLETING" and sorted(jobs["228"].components) == [0, 1]
    assert jobs["230_2"].state == "PENDING" and jobs["230_2"].submit_id == "230"
    assert jobs["230_0"].components[0].exit_code == -9
    assert rest_v0042.parse_jobs(payload, user="someone-else") == {}


def test_accounting_records_steps_and_a_pending_range_as_a_bitmap() -> None:
    base = {"user": "hpcuser", "nodes": "s26n2", "working_directory": "/w"}
    payload = {
        "jobs": [
            {
                **base,
                "job_id": 233,
                "name": "a-0",
                "het": {"job_id": 233, "job_offset": _num(0)},
                "array": {"job_id": 0, "task_id": _num(None), "task": ""},
                "state": {"current": ["FAILED"]},
                "comment": {"job": "k"},
                "steps": [
                    {
                        "step": {"id": "233.batch"},
                        "state": ["FAILED"],
                        "exit_code": _code("ERROR", 3),
                    },
                    {
                        "step": {"id": "233+0.0"},
                        "state": ["FAILED"],
                        "exit_code": _code("ERROR", 4),
                    },
                ],
            },
            {
                **base,
                "job_id": 230,
                "name": "w-0",
                "het": {"job_id": 0, "job_offset": _num(None)},
                "array": {"job_id": 230, "task_id": _num(None), "task": "0xC"},
                "state": {"current": ["CANCELLED"]},
                "steps": [],
            },
        ]
    }
    jobs = rest_v0042.parse_accounting(payload)
    assert sorted(jobs) == ["230_2", "230_3", "233"]
    comp = jobs["233"].components[0]
    assert comp.step_state == "FAILED" and comp.exit_code == 4  # (the srun step, not the batch)
    assert jobs["233"].comment == "k"


def test_partitions_and_the_default_only_v0045_names() -> None:
    nodes = {"nodes": [{"partitions": ["debug", "urgent"], "real_memory": 4000}]}
    v45 = {"partitions": [{"name": "debug", "flags": ["DEFAULT"]}, {"name": "urgent", "flags": []}]}
    assert rest_v0042.parse_partitions(v45, nodes) == ({"debug": 4000, "urgent": 4000}, "debug")
    v42 = {"partitions": [{"name": "debug", "flags": None}, {"name": "urgent"}]}
    assert rest_v0042.parse_partitions(v42, nodes)[1] is None
