"""slurmrestd's APIs v0.0.42 to v0.0.45 (Slurm 24.11 to 26.05): ``openapi/slurmctld`` and
``openapi/slurmdbd`` with the ``data_parser`` of the same version.

These four versions share the forms Shipyard uses: states are lists (a base state, then
flags), numbers that may be unset are ``{"set", "infinite", "number"}``, exit codes are
``{"status", "return_code", "signal"}``, environments are ``NAME=value`` lists and the batch
shell's warning signal is ``kill_warning_*``. The one difference: only v0.0.45 marks the
default partition (``flags: ["DEFAULT"]``); with an older version pre-flight cannot tell which
partition a job without ``partition`` lands in. Partitions are read as v0.0.38 reads them
(``rest_v0038.parse_partitions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.schedulers.slurm.jobinfo import (
    AccountingParser,
    JobInfo,
    add_controller_rows,
    expand_task_ids,
)
from core.schedulers.slurm.rest_v0038 import parse_partitions as parse_partitions  # (the same)
from core.schedulers.slurm.rest_v0038 import time_minutes
from core.schedulers.slurm.script import SlurmBatchRequest, SlurmReplicaRequest

#: the versions this module speaks, newest first
VERSIONS = ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42")
#: whether a pending job's excluded nodes can be changed (``exclude_failed_nodes``)
EXCLUDES_NODES = True

#: sbatch options that map one to one onto job properties
_PLAIN = {
    "job-name": "name",
    "partition": "partition",
    "comment": "comment",
    "constraint": "constraints",
    "mail-user": "mail_user",
    "dependency": "dependency",
}
_INTS = {"ntasks": "tasks", "cpus-per-task": "cpus_per_task"}
#: job state flags that squeue shows in place of the base state (as Slurm's
#: ``job_state_string`` does), most telling first
_FLAG_STATES = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)


def _number(value: Any) -> int | None:
    """A ``{"set", "infinite", "number"}`` struct (or a plain number) as an int; None if unset
    or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    return int(value) if isinstance(value, int) else None


def _state(states: Any) -> str:
    """A state list (``["PENDING", "REQUEUED"]``) as squeue names it."""
    names = [str(s) for s in states] if isinstance(states, list) else [str(states or "")]
    return next((f for f in _FLAG_STATES if f in names), names[0] if names else "")


def _component(rep: SlurmReplicaRequest, workdir: str, env: Mapping[str, str]) -> dict[str, Any]:
    props: dict[str, Any] = {
        "current_working_directory": workdir,
        "environment": [f"{k}={v}" for k, v in env.items()],
    }
    for opt, value in rep.sbatch_opts.items():
        if opt in _PLAIN and value is not None:
            props[_PLAIN[opt]] = value
        elif opt in _INTS and value is not None:
            props[_INTS[opt]] = int(value)
        elif opt == "mem" and value is not None:
            props["memory_per_node"] = {"set": True, "number": int(value)}
        elif opt == "gpus-per-task" and value is not None:
            props["tres_per_task"] = f"gres/gpu:{value}"
        elif opt == "mail-type" and value is not None:
            props["mail_type"] = value.upper().split(",")
        elif opt == "time" and value is not None:
            minutes = time_minutes(value)
            if minutes is not None:
                props["time_limit"] = {"set": True, "number": minutes}
        elif opt == "signal" and value is not None:
            props.update(_warning(value))
        elif opt in ("requeue", "no-requeue"):
            props["requeue"] = opt == "requeue"
        elif opt == "open-mode" and value == "append":
            props["open_mode"] = ["APPEND"]
        elif opt == "kill-on-invalid-dep":
            props.setdefault("flags", []).append(
                "KILL_INVALID_DEPENDENCY" if value == "yes" else "NO_KILL_INVALID_DEPENDENCY"
            )
    return props


def _warning(value: str) -> dict[str, Any]:
    """sbatch's ``--signal=[B:]SIG[@SECONDS]`` as the ``kill_warning_*`` properties."""
    batch = value.startswith("B:")
    sig, _, delay = value.removeprefix("B:").partition("@")
    props: dict[str, Any] = {
        "kill_warning_signal": sig,
        "kill_warning_delay": {"set": True, "number": int(delay or 60)},
    }
    if batch:
        props["kill_warning_flags"] = ["BATCH_JOB"]
    return props


def submission(
    req: SlurmBatchRequest, workdir: str, hold: bool, env: Mapping[str, str]
) -> dict[str, Any]:
    """The body of ``POST job/submit``: the batch script (its ``#SBATCH`` lines are not read
    by slurmrestd) and one set of job properties per het component. ``env`` is the batch
    step's environment (the replicas' own is in the script)."""
    comps = [_component(r, workdir, env) for r in req.replicas.values()]
    comps[0]["standard_output"] = f"{workdir}/slurm-{'%A_%a' if req.array else '%j'}.out"
    comps[0]["script"] = req.materialize()
    if req.array:
        comps[0]["array"] = req.array
    if hold:
        comps[0]["hold"] = True
    return {"job": comps[0]} if len(comps) == 1 else {"jobs": comps}


def parse_jobs(
    payload: Mapping[str, Any], user: str | None = None, only: set[str] | None = None
) -> dict[str, JobInfo]:
    """``GET jobs`` / ``GET job/{id}`` as jobs keyed by app id (only ``user``'s if given; with
    ``only``, just the jobs, het jobs and arrays of those ids)."""
    jobs: dict[str, JobInfo] = {}
    for j in payload.get("jobs") or []:
        if user and j.get("user_name") != user:
            continue
        het_id = _number(j.get("het_job_id")) or 0
        if only is not None:
            ids = (_number(j.get("job_id")), het_id, _number(j.get("array_job_id")))
            if not {str(i) for i in ids if i} & only:
                continue
        app_id = str(het_id or j["job_id"])
        off = (_number(j.get("het_job_offset")) or 0) if het_id else 0
        array_job, tasks = _tasks(
            _number(j.get("array_job_id")),
            _number(j.get("array_task_id")),
            str(j.get("array_task_string") or ""),
        )
        row = {
            "state": _state(j.get("job_state")),
            "restarts": str(_number(j.get("restart_cnt")) or 0),
            "derived": _colon(j.get("derived_exit_code")),
            "name": str(j.get("name") or ""),
            "nodes": str(j.get("nodes") or ""),
            "workdir": str(j.get("current_working_directory") or ""),
            "reason": str(j.get("state_reason") or "None"),
            "comment": str(j.get("comment") or ""),
        }
        add_controller_rows(jobs, app_id, off, row, array_job, tasks)
    return jobs


def _tasks(array_job: int | None, task_id: int | None, task_text: str) -> tuple[str, list[int]]:
    """An array task's (or a pending range's) array job id and task indices; ``("", [])``
    for a job that is not in an array. Accounting gives a pending range as a hex bitmap
    (``0xC``: tasks 2 and 3)."""
    if not array_job:
        return "", []
    if task_id is not None:
        return str(array_job), [task_id]
    if task_text.lower().startswith("0x"):
        bits = int(task_text, 16)
        return str(array_job), [i for i in range(bits.bit_length()) if bits >> i & 1]
    return str(array_job), expand_task_ids(task_text)


def _exit_code(raw: Mapping[str, Any] | None) -> int | None:
    """An exit code struct as an exit code (-N for signal N; None if unknown)."""
    if not raw:
        return None
    status = raw.get("status") or []
    signal = _number((raw.get("signal") or {}).get("id"))
    if "SIGNALED" in status and signal:
        return -signal
    if "PENDING" in status or "INVALID" in status:
        return None
    return _number(raw.get("return_code"))


def _colon(raw: Mapping[str, Any] | None) -> str:
    """An exit code struct in squeue's ``code:signal`` form (empty if unknown)."""
    code = _exit_code(raw)
    if code is None:
        return ""
    return f"0:{-code}" if code < 0 else f"{code}:0"


def user_filter(user: str | None) -> dict[str, str]:
    """The query of ``GET slurmdb jobs`` that keeps only ``user``'s jobs."""
    return {"users": user} if user else {}


def parse_accounting(payload: Mapping[str, Any], user: str | None = None) -> dict[str, JobInfo]:
    """``GET slurmdb jobs`` / ``job/{id}`` as jobs keyed by app id (only ``user``'s if
    given)."""
    parser = AccountingParser()
    for j in payload.get("jobs") or []:
        if user and j.get("user") != user:
            continue
        het = j.get("het") or {}
        het_id = het.get("job_id") or 0
        app_id = str(het_id or j["job_id"])
        off = (_number(het.get("job_offset")) or 0) if het_id else 0
        arr = j.get("array") or {}
        array_job, tasks = _tasks(
            arr.get("job_id"), _number(arr.get("task_id")), str(arr.get("task") or "")
        )
        rec = {
            "name": str(j.get("name") or ""),
            "state": _state((j.get("state") or {}).get("current")),
            "nodes": str(j.get("nodes") or ""),
            "workdir": str(j.get("working_directory") or ""),
            "comment": str((j.get("comment") or {}).get("job") or ""),
        }
        # the srun steps: "123.0", "123+1.0" (a het component's), not "123.batch"
        steps = [
            (_state(step.get("state")), _exit_code(step.get("exit_code")))
            for step in j.get("steps") or []
            if str((step.get("step") or {}).get("id", "")).rpartition(".")[2].isdigit()
        ]
        parser.record(app_id, off, rec, steps, array_job, tasks)
    return parser.result()
