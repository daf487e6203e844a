"""What a Docker app's replicas used: wall time, CPU time, peak memory, the memory limit, and
whether the kernel OOM-killed them.

The engine keeps no figures once a container has exited (``docker stats`` of a stopped
container is all zeros), so whenever the scheduler describes a running replica it has its
stats sampled in the background, each container at most once per :data:`SAMPLE_EVERY`
seconds (a poll of many apps starts at most :data:`POLL_SAMPLES`, the stalest first), and
keeps the last sample. So:

- wall time is exact: the container's start and finish times (``docker inspect``, once while
  it runs and once after, when its app is described alone);
- CPU time is the container cgroup's total at the last sample (short by what the replica
  used after it: a second or two of work, or one poll interval if longer);
- peak memory is the cgroup's high-water mark (``max_usage``, cgroup v1), or on cgroup v2,
  where the engine reports none, the largest sampled use without inactive file cache;
- a process that never described the replica while it ran has its wall time only (the
  Airflow trigger hands its figures to the task that resumes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from core.schedulers.api import DescribeAppResponse
from core.schedulers.docker.model import LABEL_REPLICA_ID, LABEL_ROLE_NAME, parse_docker_time
from core.specs import ResourceUsage

log = logging.getLogger(__name__)

__all__ = ["POLL_SAMPLES", "SAMPLE_EVERY", "UsageBook", "cpu_seconds", "memory_peak"]

#: seconds between two stats samples of one container
SAMPLE_EVERY = 1.0
#: threads taking stats samples (each waits up to a second for the engine's next collection)
SAMPLERS = 4
#: the most stats samples one poll of many apps (``describe_many``) takes
POLL_SAMPLES = 8
#: how long the figures of an ended container are kept (seconds after it was last described)
KEEP_FOR = 24 * 3600.0


def cpu_seconds(stats: Mapping[str, Any]) -> float | None:
    """The container's CPU seconds so far, from an engine stats sample."""
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return total / 1e9 if total else None


def memory_peak(stats: Mapping[str, Any]) -> int | None:
    """The cgroup's high-water mark (v1), else its use without inactive file cache (v2)."""
    mem = stats.get("memory_stats") or {}
    if mem.get("max_usage"):
        return int(mem["max_usage"])
    usage = mem.get("usage")
    if not usage:
        return None
    inactive = (mem.get("stats") or {}).get("inactive_file", 0)
    return int(usage) - int(inactive)


@dataclass
class _Figures:
    """One container's figures, as far as known."""

    started: float | None = None
    finished: float | None = None
    limit: int | None = None
    oom_killed: bool = False
    cpu: float | None = None
    peak: int | None = None
    sampled_at: float = 0.0
    seen_at: float = field(default_factory=time.time)

    def known(self) -> bool:
        """Whether an inspection or a sample gave a figure yet."""
        return self.started is not None or self.cpu is not None or self.peak is not None

    def usage(self, now: float) -> ResourceUsage:
        end = self.finished if self.finished is not None else now
        wall = max(end - self.started, 0.0) if self.started is not None else None
        return ResourceUsage(wall, self.cpu, self.peak, self.limit, self.oom_killed)


class UsageBook:
    """The figures of the containers one scheduler described (the single owner of them).

    Inspections (a few ms) are made while describing; stats samples are not: the engine
    answers one only at its next collection (up to a second), so they are taken in the
    background, at most one at a time per container, and the next describe shows them.
    """

    def __init__(self, pool: Callable[[], ThreadPoolExecutor]) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._figures: dict[str, _Figures] = {}
        self._sampling: set[str] = set()
        self._sampler: ThreadPoolExecutor | None = None

    def apply(
        self,
        api: Any,
        described: list[tuple[DescribeAppResponse, list[dict[str, Any]]]],
        budget: int | None = None,
    ) -> None:
        """Puts each replica's usage on its app's response (``(response, its containers)``
        pairs), and starts samples of the running containers whose last one is due.

        ``budget`` None (one app described): every due container is sampled, and each is
        inspected once while it runs and once after it ended (start, finish, limit, OOM).
        Else (many apps at once, a poll): at most ``budget`` samples, the stalest first, and
        no inspection, so a poll stays one engine call.
        """
        now = time.time()
        containers = [c for _, cs in described for c in cs]
        if budget is None:
            todo = [c for c in containers if self._inspect_due(c)]
            if todo:
                list(self._pool().map(lambda c: self._inspect(api, c), todo))
        with self._lock:
            due = [c for c in containers if self._sample_due(c, now)]
            due = sorted(due, key=lambda c: self._figures[c["Id"]].sampled_at)[:budget]
            for c in due:
                self._sampling.add(c["Id"])
            for resp, cs in described:
                self._assign(resp, cs, now)
            self._forget(now)
        for c in due:
            self._sampler_pool().submit(self._sample, api, c["Id"])

    def close(self) -> None:
        """Stops taking samples (those under way end on their own)."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.shutdown(wait=False, cancel_futures=True)

    def _sampler_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._sampler is None:
                self._sampler = ThreadPoolExecutor(SAMPLERS, thread_name_prefix="shipyard-stats")
            return self._sampler

    def _assign(
        self, resp: DescribeAppResponse, containers: list[dict[str, Any]], now: float
    ) -> None:
        by_replica = {_replica_key(c): c["Id"] for c in containers}
        for rs in resp.roles_statuses:
            for r in rs.replicas:
                figures = self._figures.get(by_replica.get((rs.role, str(r.id)), ""))
                if figures is not None and figures.known():
                    figures.seen_at = now
                    r.usage = figures.usage(now)

    def _inspect_due(self, c: Mapping[str, Any]) -> bool:
        with self._lock:
            figures = self._figures.get(c["Id"])
        return (
            figures is None or figures.started is None or (_ended(c) and figures.finished is None)
        )

    def _sample_due(self, c: Mapping[str, Any], now: float) -> bool:
        if c.get("State") != "running" or c["Id"] in self._sampling:
            return False
        figures = self._figures.setdefault(c["Id"], _Figures())
        return now - figures.sampled_at >= SAMPLE_EVERY

    def _inspect(self, api: Any, c: Mapping[str, Any]) -> None:
        try:
            info = api.inspect_container(c["Id"])
        except Exception as e:  # (removed meanwhile, ...: its figures stay as they were)
            log.debug("inspecting container %s: %s", c["Id"][:12], e)
            return
        with self._lock:
            _inspected(info, self._figures.setdefault(c["Id"], _Figures()))

    def _sample(self, api: Any, cid: str) -> None:
        try:
            stats = api.stats(cid, stream=False, one_shot=True)
        except Exception as e:
            log.debug("stats of container %s: %s", cid[:12], e)
            stats = None
        with self._lock:
            self._sampling.discard(cid)
            figures = self._figures.get(cid)
            if figures is not None:  # (a failed one waits its turn too)
                _sampled(stats or {}, figures, time.time())

    def _forget(self, now: float) -> None:
        for cid in [k for k, f in self._figures.items() if now - f.seen_at > KEEP_FOR]:
            del self._figures[cid]


def _replica_key(c: Mapping[str, Any]) -> tuple[str, str]:
    labels = c.get("Labels") or {}
    return labels.get(LABEL_ROLE_NAME, ""), labels.get(LABEL_REPLICA_ID, "")


def _ended(c: Mapping[str, Any]) -> bool:
    return c.get("State") in ("exited", "dead")


def _inspected(info: Mapping[str, Any], figures: _Figures) -> None:
    st = info.get("State") or {}
    figures.started = parse_docker_time(st.get("StartedAt") or "")
    if st.get("Status") in ("exited", "dead"):
        figures.finished = parse_docker_time(st.get("FinishedAt") or "")
    figures.limit = int((info.get("HostConfig") or {}).get("Memory") or 0) or None
    figures.oom_killed = bool(st.get("OOMKilled"))


def _sampled(stats: Mapping[str, Any], figures: _Figures, now: float) -> None:
    cpu, peak = cpu_seconds(stats), memory_peak(stats)
    if cpu is not None:
        figures.cpu = max(cpu, figures.cpu or 0.0)
    if peak is not None:
        figures.peak = max(peak, figures.peak or 0)
    figures.sampled_at = now
