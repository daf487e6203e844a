"""A small in-memory scheduler: a third-party backend written against the public API.

It exists to test the Scheduler base class, discovery and the Runner's own logic; the real
backends are tested against real processes, Docker and Slurm.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from core.schedulers.api import (
    IDEMPOTENCY_KEY,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
    filter_regex,
    split_lines,
)
from core.specs import AppDef, AppDryRunInfo, AppState, CfgVal, ReplicaStatus, RoleStatus, runopts

_ids = itertools.count()


class MemoryScheduler(Scheduler[dict[str, Any]]):
    """Apps "run" instantly; their state is set by the test through ``finish``."""

    apps: dict[str, dict[str, Any]] = {}

    def __init__(self, session_name: str, **kwargs: Any) -> None:
        super().__init__("memory", session_name)
        self.kwargs = kwargs
        self.describe_calls = 0
        self.closed = 0

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("greeting", type_=str, help="what to print", default="hello")
        return opts

    def _submit_dryrun(
        self, app: AppDef, cfg: Mapping[str, CfgVal]
    ) -> AppDryRunInfo[dict[str, Any]]:
        req = {"app": app, "cfg": dict(cfg)}
        return AppDryRunInfo(req, lambda r: f"memory request for {r['app'].name}")

    def schedule(self, dryrun_info: AppDryRunInfo[dict[str, Any]]) -> str:
        app: AppDef = dryrun_info.request["app"]
        app_id = f"{app.name}-{next(_ids)}"
        greeting = dryrun_info.request["cfg"]["greeting"]
        self.apps[app_id] = {
            "app": app,
            "state": AppState.RUNNING,
            "key": app.metadata.get(IDEMPOTENCY_KEY),
            "logs": {
                (r.name, k): f"{greeting} from {r.name}/{k}\nsecond line\n"
                for r in app.roles
                for k in range(r.num_replicas)
            },
        }
        return app_id

    def finish(self, app_id: str, state: AppState) -> None:
        self.apps[app_id]["state"] = state

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        self.describe_calls += 1
        rec = self.apps.get(app_id)
        if rec is None:
            return None
        app: AppDef = rec["app"]
        state = rec["state"]
        code = None if state == AppState.RUNNING else (0 if state == AppState.SUCCEEDED else 1)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=0,
            roles=app.roles,
            roles_statuses=[
                RoleStatus(
                    r.name,
                    [
                        ReplicaStatus(k, state, r.name, "mem", exit_code=code)
                        for k in range(r.num_replicas)
                    ],
                )
                for r in app.roles
            ],
        )

    def describe_many(self, app_ids: Iterable[str]) -> dict[str, DescribeAppResponse | None]:
        ids = list(app_ids)
        self.describe_calls -= len(ids) - 1  # one "backend call" for the batch
        return {i: self.describe(i) for i in ids}

    def list(self) -> list[ListAppResponse]:
        return [ListAppResponse(app_id=i, state=r["state"]) for i, r in self.apps.items()]

    def find_by_idempotency_key(self, key: str, cfg: Any = None) -> str | None:
        found = [i for i, r in self.apps.items() if r["key"] == key]
        return found[-1] if found else None

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        check_stream(streams, [Stream.COMBINED])
        return filter_regex(regex, split_lines(self.apps[app_id]["logs"][(role_name, k)]))

    def _cancel_existing(self, app_id: str) -> None:
        self.apps[app_id]["state"] = AppState.CANCELLED

    def close(self) -> None:
        self.closed += 1


def create_scheduler(session_name: str, **kwargs: Any) -> MemoryScheduler:
    return MemoryScheduler(session_name, **kwargs)
