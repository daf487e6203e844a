"""What a Slurm app's replicas produced and what they used.

- Results: the batch script gives every component ``$SHIPYARD_RESULT_FILE`` =
  ``<job dir>/shipyard-results-<job id>/<role>-<k>.json`` (see :mod:`.script`); they are read
  through the cluster's files (this host, SFTP, or a REST cluster's local mount).
- Usage: from accounting (``sacct``: ``ElapsedRaw``, ``TotalCPU``, ``MaxRSS`` of each
  component's ``srun`` step, ``ReqMem`` of its allocation), for ended jobs over the command
  transports (slurmrestd's accounting is not read: usage stays None there). ``MaxRSS`` is
  sampled by the job accounting plugin (so is the GPU memory peak, ``gres/gpumem`` of
  ``TRESUsageInMax``, where the cluster gathers GPU usage); the script asks for a sample
  every second (``--acctg-freq=task=1``). A component ending ``OUT_OF_MEMORY``, or killed
  past its ``--mem`` by ``OverMemoryKill``, is named so.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable

from core.reports import (
    MAX_RESULT_BYTES,
    ReplicaResult,
    oom_message,
    parse_result,
)
from core.schedulers.api import DescribeAppResponse
from core.schedulers.slurm.jobinfo import SEP
from core.schedulers.slurm.script import result_dir_name
from core.schedulers.slurm.transport import (
    CommandClient,
    Files,
    SlurmClient,
    TransportError,
)
from core.schedulers.slurm.usage import USAGE_FIELDS, Usage, parse_usage
from core.specs import AppState, is_terminal

log = logging.getLogger(__name__)

__all__ = ["apply_usage", "fetch_usage", "read_results"]

# -- results ---------------------------------------------------------------------------------------


def read_results(
    files: Files, workdir: str, job_id: str, replicas: Iterable[tuple[str, int]]
) -> list[ReplicaResult]:
    """The results of ``replicas`` (``(role, k)``) from the job's result directory (replica 0
    of each role unless the job's script marked ``all``)."""
    base = posixpath.join(workdir, result_dir_name(job_id))
    everyone = _exists(files, posixpath.join(base, "all"))
    out = []
    for role, k in replicas:
        if k != 0 and not everyone:
            continue
        out.append(_read_one(files, posixpath.join(base, f"{role}-{k}.json"), role, k))
    return out


def _exists(files: Files, path: str) -> bool:
    reader = files.open_reader(path)
    if reader is None:
        return False
    reader.close()
    return True


def _read_one(files: Files, path: str, role: str, k: int) -> ReplicaResult:
    try:
        reader = files.open_reader(path)
        if reader is None:
            return parse_result(role, k, None)
        try:
            data = b""
            while len(data) <= MAX_RESULT_BYTES:
                chunk = reader.read(1 << 16)
                if not chunk:
                    break
                data += chunk
        finally:
            reader.close()
    except (OSError, TransportError) as e:
        res = ReplicaResult(role, k, present=True)
        res.error = f"{role}/{k}: cannot read its result file {path}: {e}"
        return res
    if len(data) > MAX_RESULT_BYTES:  # (read only one chunk past the limit)
        return parse_result(role, k, None, size=len(data))
    return parse_result(role, k, data)


# -- usage ----------------------------------------------------------------------------------------


def fetch_usage(client: SlurmClient, job_ids: list[str]) -> dict[str, Usage] | None:
    """The usage of ended jobs' components from accounting, in one call, by job id (None:
    not available)."""
    if not isinstance(client, CommandClient):
        return None
    ids = ",".join(job_ids)
    argv = ["sacct", "-n", "-P", f"--delimiter={SEP}", "-j", ids, "-o", ",".join(USAGE_FIELDS)]
    try:
        p = client.shell.run(argv)
    except TransportError as e:
        log.debug("sacct usage of %s: %s", ids, e)
        return None
    return parse_usage(p.stdout) if p.returncode == 0 else None


def apply_usage(resp: DescribeAppResponse, usage: Usage) -> None:
    """Puts each component's usage on its replica; an OOM-killed one's message says so."""
    ooms = []
    for rs in resp.roles_statuses:
        for r in rs.replicas:
            found = usage.get(f"{rs.role}-{r.id}")
            if found is None:
                continue
            r.usage = found[0]
            if r.usage.oom_killed:
                msg = f"{rs.role}/{r.id} " + oom_message(
                    r.usage.peak_memory, r.usage.requested_memory
                )
                r.structured_error_msg = msg
                r.state = AppState.FAILED
                ooms.append(msg)
    if ooms:
        resp.msg = "; ".join([*ooms, resp.msg])


def complete(resp: DescribeAppResponse, usage: Usage) -> bool:
    """True if accounting has every replica's ended step (the usage will not change)."""
    return is_terminal(resp.state) and all(
        f"{rs.role}-{r.id}" in usage for rs in resp.roles_statuses for r in rs.replicas
    )
