"""What a Docker app's replicas produced and why they died.

- Results: every container gets ``$SHIPYARD_RESULT_FILE`` = :data:`RESULT_PATH` in its own
  filesystem (the container's user must be able to write ``/``; a role may set another path
  in its env, which the ``shipyard.result_file`` label remembers). It is copied out with
  ``get_archive``, which works on stopped containers too; once retention removed the
  containers, from the copy :mod:`.retire` keeps in the app's tombstone archive.
- OOM kills: a failed replica whose container the engine marks ``OOMKilled`` is named so
  ("killed: out of memory (peak X of Y requested)"); its peak is its sampled high-water mark
  (see :mod:`.usage`), or the memory limit it hit.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

from core.reports import MAX_RESULT_BYTES, ReplicaResult, oom_message, parse_result
from core.schedulers.api import DescribeAppResponse
from core.schedulers.docker.model import (
    LABEL_REPLICA_ID,
    LABEL_RESULT_FILE,
    LABEL_RESULT_REPLICAS,
    LABEL_ROLE_NAME,
    RESULT_PATH,
)
from core.specs import AppState

__all__ = [
    "apply_oom",
    "collected",
    "read_archived_result",
    "read_container_result",
]


def collected(labels: Mapping[str, str]) -> bool:
    """Whether this container's result is collected (replica 0, or every one with ``all``)."""
    return labels.get(LABEL_REPLICA_ID) == "0" or labels.get(LABEL_RESULT_REPLICAS) == "all"


def untar_one(chunks: Any, what: str) -> bytes | int:
    """The one file of a ``get_archive`` stream (its size if over the limit)."""
    import tarfile  # (here: results only; it loads shutil, bz2 and lzma)

    data = b"".join(chunks)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = next((m for m in tar.getmembers() if m.isfile()), None)
        if member is None:
            raise ValueError(f"{what}: not a regular file")
        if member.size > MAX_RESULT_BYTES:
            return member.size
        f = tar.extractfile(member)
        assert f is not None
        return f.read()


def read_container_result(api: Any, c: Mapping[str, Any]) -> ReplicaResult:
    """The result of one container (running or stopped)."""
    import tarfile

    from docker.errors import APIError, NotFound

    labels = c.get("Labels") or {}
    role, k = labels.get(LABEL_ROLE_NAME, ""), int(labels.get(LABEL_REPLICA_ID, "0"))
    path = labels.get(LABEL_RESULT_FILE) or RESULT_PATH
    try:
        chunks, stat = api.get_archive(c["Id"], path)
        if int(stat.get("size", 0)) > MAX_RESULT_BYTES:
            return parse_result(role, k, None, size=int(stat["size"]))
        got = untar_one(chunks, path)
    except NotFound:
        return parse_result(role, k, None)
    except (APIError, ValueError, tarfile.TarError) as e:
        res = ReplicaResult(role, k, present=True)
        res.error = f"{role}/{k}: cannot copy its result file {path} out: {e}"
        return res
    if isinstance(got, int):
        return parse_result(role, k, None, size=got)
    return parse_result(role, k, got)


def read_archived_result(role: str, k: int, data: bytes | None) -> ReplicaResult:
    """The result of a retired replica, from the tombstone archive's copy (None: none)."""
    if data is not None and len(data) > MAX_RESULT_BYTES:
        return parse_result(role, k, None, size=len(data))
    return parse_result(role, k, data)


def apply_oom(resp: DescribeAppResponse) -> None:
    """Names the failed replicas the engine OOM-killed (their usage says so: see
    :mod:`.usage`); one never sampled gets the limit it hit as its peak."""
    ooms = []
    for rs in resp.roles_statuses:
        for r in rs.replicas:
            u = r.usage
            if u is None or not u.oom_killed or r.state != AppState.FAILED:
                continue
            u.peak_memory = max(u.peak_memory or 0, u.requested_memory or 0) or None
            msg = f"{rs.role}/{r.id} " + oom_message(u.peak_memory, u.requested_memory)
            r.structured_error_msg = json.dumps({"message": msg, "exit_code": r.exit_code})
            ooms.append(msg)
    if ooms:
        resp.msg = "; ".join([*ooms, *([] if resp.msg in ("", "<NONE>") else [resp.msg])])
