"""slurmrestd's API v0.0.38 (Slurm 22.05): ``openapi/v0.0.38`` and ``openapi/dbv0.0.38``.

Everything that depends on the API version is here: the job properties of a submission, and
how the answers map to :class:`JobInfo`. Newer versions (``rest_v0042``) are modules with the
same names, listed in ``rest.API_VERSIONS``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from core.schedulers.slurm.jobinfo import (
    AccountingParser,
    JobInfo,
    add_controller_rows,
    expand_task_ids,
)
from core.schedulers.slurm.script import EXCLUDE_MARK, SlurmBatchRequest, SlurmReplicaRequest

#: the versions this module speaks
VERSIONS = ("v0.0.38",)
#: whether a pending job's excluded nodes can be changed (``exclude_failed_nodes``)
EXCLUDES_NODES = False

#: sbatch options that map one to one onto job properties
_PLAIN = {
    "job-name": "name",
    "partition": "partition",
    "comment": "comment",
    "constraint": "constraints",
    "mail-user": "mail_user",
    "mail-type": "mail_type",
    "gpus-per-task": "gpus_per_task",
    "dependency": "dependency",
}
_INTS = {"ntasks": "tasks", "cpus-per-task": "cpus_per_task", "mem": "memory_per_node"}
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_minutes(value: str) -> int | None:
    """sbatch's ``--time`` formats in whole minutes (rounded up); None for no limit."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME_RE.fullmatch(value)
    if not m:
        raise ValueError(f"cfg.time: cannot read {value!r}")
    days, a, b, c = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # hours:minutes:seconds
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # minutes:seconds
        seconds = int(a) * 60 + int(b)
    else:  # minutes
        seconds = int(a) * 60
    return math.ceil(seconds / 60)


def _component(rep: SlurmReplicaRequest, workdir: str, env: Mapping[str, str]) -> dict[str, Any]:
    props: dict[str, Any] = {"current_working_directory": workdir, "environment": dict(env)}
    for opt, value in rep.sbatch_opts.items():
        if opt in _PLAIN and value is not None:
            props[_PLAIN[opt]] = value
        elif opt in _INTS and value is not None:
            props[_INTS[opt]] = int(value)
        elif opt == "time" and value is not None:
            minutes = time_minutes(value)
            if minutes is not None:
                props["time_limit"] = minutes
        elif opt == "signal" and value is not None:
            # v0.0.38 refuses the batch-shell form (B:): the signal then goes to the job's
            # steps, which reaches every replica straight from Slurm (the script's trap idles)
            props["signal"] = value.removeprefix("B:")
        elif opt in ("requeue", "no-requeue"):
            props["requeue"] = opt == "requeue"
        elif opt == "kill-on-invalid-dep":
            props["kill_on_invalid_dependency"] = value == "yes"
    return props


def submission(
    req: SlurmBatchRequest, workdir: str, hold: bool, env: Mapping[str, str]
) -> dict[str, Any]:
    """The body of ``POST job/submit``: the batch script (its ``#SBATCH`` lines are not read
    by slurmrestd) and one set of job properties per het component. ``env`` is the batch
    step's environment (the replicas' own is in the script)."""
    if req.timeout_requeue_in is not None:
        raise ValueError(
            "cfg.requeue_on_timeout: slurmrestd's v0.0.38 API cannot signal the batch shell,"
            " which requeues the job before its time limit; use the ssh or local transport"
        )
    if EXCLUDE_MARK in str(next(iter(req.replicas.values())).sbatch_opts.get("comment")):
        raise ValueError(
            "cfg.exclude_failed_nodes: slurmrestd's v0.0.38 API cannot change a job's excluded"
            " nodes; use the ssh or local transport"
        )
    comps = [_component(r, workdir, env) for r in req.replicas.values()]
    if comps[0].get("requeue") is False:  # (v0.0.38 ignores it)
        req = dataclasses.replace(req, requeue_off_in_script=True)
    comps[0]["standard_output"] = f"{workdir}/slurm-{'%A_%a' if req.array else '%j'}.out"
    if req.array:
        comps[0]["array"] = req.array
    if hold:
        comps[0]["hold"] = True
    body: dict[str, Any] = {"script": req.materialize()}
    if len(comps) == 1:
        body["job"] = comps[0]
    else:
        body["jobs"] = comps
    return body


def parse_jobs(
    payload: Mapping[str, Any], user: str | None = None, only: set[str] | None = None
) -> dict[str, JobInfo]:
    """``GET jobs`` / ``GET job/{id}`` as jobs keyed by app id (only ``user``'s if given; with
    ``only``, just the jobs, het jobs and arrays of those ids)."""
    jobs: dict[str, JobInfo] = {}
    for j in payload.get("jobs") or []:
        if user and j.get("user_name") != user:
            continue
        het_id = j.get("het_job_id") or 0
        if only is not None and not _ids(j["job_id"], het_id, j.get("array_job_id")) & only:
            continue
        app_id = str(het_id or j["job_id"])
        off = int(j.get("het_job_offset") or 0) if het_id else 0
        array_job, tasks = _tasks(
            j.get("array_job_id"), j.get("array_task_id"), j.get("array_task_string")
        )
        row = {
            "state": str(j.get("job_state") or ""),
            "restarts": str(j.get("restart_cnt") or 0),
            "derived": str(j.get("derived_exit_code") or 0),
            "name": str(j.get("name") or ""),
            "nodes": str(j.get("nodes") or ""),
            "workdir": str(j.get("current_working_directory") or ""),
            "reason": str(j.get("state_reason") or "None"),
            "comment": str(j.get("comment") or ""),
        }
        add_controller_rows(jobs, app_id, off, row, array_job, tasks)
    return jobs


def _ids(*ids: Any) -> set[str]:
    return {str(i) for i in ids if i}


def _tasks(array_job: Any, task_id: Any, task_string: Any) -> tuple[str, list[int]]:
    """An array task's (or a pending range's) array job id and task indices; ``("", [])``
    for a job that is not in an array."""
    if not array_job:
        return "", []
    if isinstance(task_id, int) and 0 <= task_id < 0xFFFFFFF0:  # (Slurm's NO_VAL: none)
        return str(array_job), [task_id]
    return str(array_job), expand_task_ids(str(task_string or ""))


def _exit_code(raw: Mapping[str, Any] | None, state: str) -> int | None:
    """A step's exit code (-N for signal N). Slurm 22.05's dbv0.0.38 reports ``SUCCESS`` and
    0 for a step that failed with another code: that code is unknown (None), not 0."""
    if not raw:
        return None
    signal = (raw.get("signal") or {}).get("signal_id")
    if raw.get("status") == "SIGNALED" and signal:
        return -int(signal)
    code = raw.get("return_code")
    if code is None or (int(code) == 0 and state.upper().startswith("FAILED")):
        return None
    return int(code)


def user_filter(user: str | None) -> dict[str, str]:
    """None: dbv0.0.38's ``GET jobs`` has no user filter (every user's jobs come, and are
    filtered here)."""
    return {}


def parse_accounting(payload: Mapping[str, Any], user: str | None = None) -> dict[str, JobInfo]:
    """``GET slurmdb jobs`` / ``job/{id}`` as jobs keyed by app id (only ``user``'s if
    given)."""
    parser = AccountingParser()
    for j in payload.get("jobs") or []:
        if user and j.get("user") not in (user, None):  # (None: a user without association)
            continue
        het = j.get("het") or {}
        het_id = het.get("job_id") or 0
        app_id = str(het_id or j["job_id"])
        off = int(het.get("job_offset") or 0) if het_id else 0
        arr = j.get("array") or {}
        array_job, tasks = _tasks(arr.get("job_id"), arr.get("task_id"), arr.get("task"))
        rec = {
            "name": str(j.get("name") or ""),
            "state": str((j.get("state") or {}).get("current") or ""),
            "nodes": str(j.get("nodes") or ""),
            "workdir": str(j.get("working_directory") or ""),
            "comment": str((j.get("comment") or {}).get("job") or ""),
        }
        steps = [
            (state, _exit_code(step.get("exit_code"), state))
            for step in j.get("steps") or []
            if str((step.get("step") or {}).get("id", "")).isdigit()
            for state in [str(step.get("state") or "")]
        ]
        parser.record(app_id, off, rec, steps, array_job, tasks)
    return parser.result()


def parse_partitions(
    partitions: Mapping[str, Any], nodes: Mapping[str, Any]
) -> tuple[dict[str, int], str | None]:
    """Each partition's smallest node RealMemory (MB), and the default partition (the one
    flagged ``default``: v0.0.38; ``DEFAULT``: v0.0.45; None where no flag says). A node's
    partitions are a list (or a comma-separated string)."""
    memory: dict[str, int] = {}
    for node in nodes.get("nodes") or []:
        parts = node.get("partitions") or []
        for part in parts.split(",") if isinstance(parts, str) else parts:
            value = int(node.get("real_memory") or 0)
            memory[part] = min(value, memory.get(part, value))
    default = next(
        (
            p["name"]
            for p in partitions.get("partitions") or []
            if "default" in (str(f).lower() for f in p.get("flags") or [])
        ),
        None,
    )
    return memory, default
