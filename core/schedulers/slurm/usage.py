"""Usage of ended Slurm jobs from accounting: ``ElapsedRaw``, ``TotalCPU`` and ``MaxRSS`` of
each component's ``srun`` step, ``ReqMem`` of its allocation, the GPU memory peak where the
cluster gathers it, and whether the step was killed for memory.

The describe of a job the controller forgot reads it from the same ``sacct`` as the job's
state (:data:`ACCOUNTING_FIELDS`); a job the controller still knows has it read on its own
(``outcome.fetch_usage``).
"""

from __future__ import annotations

import re

from core.schedulers.slurm.jobinfo import SACCT_FIELDS, SEP, Usage, slurm_state
from core.specs import ResourceUsage

__all__ = ["ACCOUNTING_FIELDS", "USAGE_FIELDS", "Usage", "parse_usage", "split_accounting"]

USAGE_FIELDS = (
    "JobID",
    "JobName",
    "State",
    "ElapsedRaw",
    "TotalCPU",
    "MaxRSS",
    "ReqMem",
    "ExitCode",
    "TRESUsageInMax",
)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def _bytes(text: str) -> int | None:
    """``218432K`` / ``1000M`` / ``4000Mn`` as bytes."""
    m = re.fullmatch(r"([\d.]+)([KMGTP]?)[nc]?", text.strip())
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _seconds(text: str) -> float | None:
    """sacct's ``[DD-[HH:]]MM:SS[.mmm]`` as seconds."""
    text = text.strip()
    if not text:
        return None
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    try:
        secs = sum(float(p) * 60**i for i, p in enumerate(reversed(parts)))
        return secs + (int(days) * 86400 if days else 0)
    except ValueError:
        return None


def parse_usage(out: str) -> dict[str, Usage]:
    """``sacct -P --delimiter=SEP -o USAGE_FIELDS`` rows as each job's components' usage and
    the state of their steps: ``{job id: {component name (role-k): (usage, state)}}``."""
    names: dict[str, str] = {}  # allocation id -> component name
    req: dict[str, int | None] = {}
    found: dict[str, Usage] = {}
    for line in out.splitlines():
        parts = line.split(SEP)
        if len(parts) < len(USAGE_FIELDS) - 1:
            continue
        parts += [""] * (len(USAGE_FIELDS) - len(parts))  # (TRESUsageInMax is optional)
        job_id, name, state, elapsed, cpu, maxrss, reqmem, code, tres = parts[: len(USAGE_FIELDS)]
        alloc, _, step = job_id.partition(".")
        if not step:
            names[alloc], req[alloc] = name, _bytes(reqmem)
            continue
        if not step.isdigit() or alloc not in names:
            continue  # (the batch and extern steps are not the replica)
        usage = ResourceUsage(
            wall_time=float(elapsed) if elapsed.isdigit() else None,
            cpu_time=_seconds(cpu),
            peak_memory=_bytes(maxrss) if maxrss else None,
            requested_memory=req.get(alloc),
            peak_gpu_memory=_gpu_memory(tres),
        )
        usage.oom_killed = _oom_killed(slurm_state(state), code, usage)
        job = alloc.split("+", 1)[0]  # (a heterogeneous job's components are <id>+<n>)
        found.setdefault(job, {})[names[alloc]] = (usage, slurm_state(state))
    return found


def _gpu_memory(tres: str) -> int | None:
    """The ``gres/gpumem`` peak of a step's ``TRESUsageInMax`` (only where the cluster gathers
    GPU usage: ``AcctGatherGpuType``/NVML), in bytes."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpumem":
            return _bytes(value)
    return None


def _oom_killed(state: str, exit_code: str, usage: ResourceUsage) -> bool:
    """Killed for memory: ``OUT_OF_MEMORY`` (task/cgroup), or, where the accounting plugin
    enforces ``--mem`` (``JobAcctGatherParams=OverMemoryKill``), a step ended by SIGKILL
    (``ExitCode`` ``0:9``) with a sampled peak past its request: that plugin kills only then
    (a cgroup holds the peak at the limit). A step that exceeded without enforcement and then
    exited, or was cancelled with SIGTERM, is not named out of memory."""
    if state == "OUT_OF_MEMORY":
        return True
    peak, req = usage.peak_memory, usage.requested_memory
    killed = exit_code.partition(":")[2] == "9"
    return state in ("CANCELLED", "FAILED") and killed and bool(peak and req and peak > req)


#: a job's state (``SACCT_FIELDS``) and usage (``USAGE_FIELDS``) in one ``sacct`` (``Comment``,
#: free text, last)
ACCOUNTING_FIELDS = tuple(dict.fromkeys([*SACCT_FIELDS[:-1], *USAGE_FIELDS, SACCT_FIELDS[-1]]))


def split_accounting(out: str) -> tuple[str, str]:
    """``sacct -D -P --delimiter=SEP -o ACCOUNTING_FIELDS`` rows as ``SACCT_FIELDS`` rows (every
    attempt's, for ``parse_sacct``) and ``USAGE_FIELDS`` rows (the last attempt's of each
    allocation, as ``sacct`` without ``-D`` gives them, for :func:`parse_usage`)."""
    n = len(ACCOUNTING_FIELDS)
    states: list[str] = []
    usage: dict[str, list[str]] = {}  # allocation id -> its last record and that one's steps
    for line in out.splitlines():
        parts = line.split(SEP, n - 1)
        if len(parts) < n:
            continue
        rec = dict(zip(ACCOUNTING_FIELDS, parts, strict=True))
        states.append(SEP.join(rec[f] for f in SACCT_FIELDS))
        alloc, dot, _ = rec["JobID"].partition(".")
        row = SEP.join(rec[f] for f in USAGE_FIELDS)
        if dot:
            usage.setdefault(alloc, []).append(row)
        else:
            usage[alloc] = [row]  # (a requeued job's next attempt)
    return "\n".join(states), "\n".join(r for rows in usage.values() for r in rows)
