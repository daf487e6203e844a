"""``exclude_failed_nodes``: a job requeued because its node failed is kept off that node.

Slurm has no such setting, and a job's excluded nodes can only change while it is pending
(``scontrol update JobId=... ExcNodeList=...``; not from the job itself, which is gone by then).
So whoever describes the job does it, once per requeue: a pending job that asked for it (a word
in its comment) whose ended attempts include node failures gets those attempts' nodes
excluded. A requeued job waits at least Slurm's requeue delay (about ``cred_expire``) before it
can start again; a watch polls more often than that, so the exclusion is in place first. A job
nobody follows is requeued as Slurm chooses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from core.limits import MAX_REQUEUES_OPT
from core.schedulers.slurm.jobinfo import JobInfo
from core.schedulers.slurm.script import EXCLUDE_MARK
from core.schedulers.slurm.transport import SlurmClient
from core.specs import CfgVal, Reason

__all__ = ["EXCLUDE_FAILED_NODES_OPT", "exclusion_comment", "keep_off_failed_nodes"]

log = logging.getLogger(__name__)

EXCLUDE_FAILED_NODES_OPT = "exclude_failed_nodes"


def exclusion_comment(cfg: Mapping[str, CfgVal], max_requeues: int) -> str | None:
    """The comment of a job ``cfg`` asks to keep off failed nodes (None: it does not).

    Raises:
        ValueError: naming the option, when it has no requeue (``max_requeues``) to keep off
            a node, or is not true or false.
    """
    value = cfg.get(EXCLUDE_FAILED_NODES_OPT)
    if value not in (None, True, False):
        raise ValueError(f"cfg.{EXCLUDE_FAILED_NODES_OPT}: expected true or false, got {value!r}")
    if not value:
        return None
    if not max_requeues:
        raise ValueError(f"cfg.{EXCLUDE_FAILED_NODES_OPT}: needs {MAX_REQUEUES_OPT} > 0")
    comment = cfg.get("comment")
    return f"{comment} {EXCLUDE_MARK}" if comment else EXCLUDE_MARK


def keep_off_failed_nodes(
    client: SlurmClient, infos: Mapping[str, JobInfo], done: set[tuple[str, int]]
) -> None:
    """Excludes, from each pending requeued job of ``infos`` that asked for it, the nodes of
    its attempts that ended in a node failure; ``done``: the (job, requeues) already seen to."""
    for job_id, info in infos.items():
        if info.restarts == 0 or info.state != "PENDING" or EXCLUDE_MARK not in info.comment:
            continue
        key = (job_id, info.restarts)
        failed = [a.nodes for a in info.attempts if a.reason == Reason.NODE_FAILURE and a.nodes]
        if key in done or not failed:
            continue
        try:
            client.exclude_nodes(job_id, ",".join(dict.fromkeys(failed)))
        except Exception as e:  # (the next describe tries again)
            log.warning("could not keep job %s off its failed nodes: %s", job_id, e)
            continue
        done.add(key)
        log.info("job %s requeued after a node failure: kept off %s", job_id, ",".join(failed))
