"""A small in-memory scheduler: a third-party backend written against the public API.

It exists to test the Scheduler base class, discovery, the Runner's own logic and the watch
(:mod:`core.watch`) without services: a test sets each app's state (:meth:`finish`), adds log
lines as the app "prints" them (:meth:`emit`), and scripts failures of the backend
(:attr:`MemoryScheduler.failures`: the next status calls raise them, in order). The real
backends are tested against real processes, Docker and Slurm.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from core.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
    filter_regex,
)
from core.specs import (
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    ReplicaStatus,
    RoleStatus,
    is_terminal,
    runopts,
)

_ids = itertools.count()
#: guards every app's state and lines; notified at each change (tails wait on it)
_changed = threading.Condition()


class MemoryScheduler(Scheduler[dict[str, Any]]):
    """Apps "run" at once; the test sets their state (:meth:`finish`) and lines (:meth:`emit`).

    Class-level state is the "backend": every instance (of any runner) sees the same apps.
    """

    apps: dict[str, dict[str, Any]] = {}
    #: what the next status calls (describe, describe_many) raise, one each, in order
    failures: list[BaseException] = []
    #: status calls answered or failed so far (a batch counts once)
    status_calls = 0
    #: called with the id of each app submitted (see :class:`Scenario`)
    on_submit: Callable[[str], None] | None = None

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
        key = dryrun_info.idempotency_key
        with _changed:
            holder = self.find_by_idempotency_key(key) if key else None
            if holder is not None:
                return holder
            app_id = f"{app.name}-{next(_ids)}"
            greeting = dryrun_info.request["cfg"]["greeting"]
            self.apps[app_id] = {
                "app": app,
                "state": AppState.RUNNING,
                "key": key,
                "logs": {
                    (r.name, k): [f"{greeting} from {r.name}/{k}\n", "second line\n"]
                    for r in app.roles
                    for k in range(r.num_replicas)
                },
            }
            _changed.notify_all()
        hook = MemoryScheduler.on_submit  # (through the class: a plain function stays unbound)
        if hook is not None:
            hook(app_id)
        return app_id

    @classmethod
    def finish(cls, app_id: str, state: AppState) -> None:
        """Sets the app's state (every replica's too)."""
        with _changed:
            cls.apps[app_id]["state"] = state
            _changed.notify_all()

    @classmethod
    def emit(cls, app_id: str, role: str, k: int, line: str) -> None:
        """Replica ``k`` of ``role`` prints ``line``."""
        with _changed:
            cls.apps[app_id]["logs"][(role, k)].append(line if line.endswith("\n") else line + "\n")
            _changed.notify_all()

    @classmethod
    def _status_call(cls) -> None:
        cls.status_calls += 1
        if cls.failures:
            raise cls.failures.pop(0)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        self.describe_calls += 1
        self._status_call()
        return self._describe(app_id)

    def _describe(self, app_id: str) -> DescribeAppResponse | None:
        rec = self.apps.get(app_id)
        if rec is None:
            return None
        app: AppDef = rec["app"]
        state = rec["state"]
        code = None if not is_terminal(state) else (0 if state == AppState.SUCCEEDED else 1)
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
        self.describe_calls += 1  # one "backend call" for the batch
        self._status_call()
        return {i: self._describe(i) for i in app_ids}

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
        return filter_regex(regex, self._lines(app_id, (role_name, k), should_tail))

    def _lines(self, app_id: str, replica: tuple[str, int], tail: bool) -> Iterator[str]:
        """The replica's lines; with ``tail``, as they come until the app ended."""
        i = 0
        while True:
            with _changed:
                rec = self.apps[app_id]
                lines = rec["logs"][replica]
                while tail and i >= len(lines) and not is_terminal(rec["state"]):
                    _changed.wait(1.0)
                new, ended = lines[i:], not tail or is_terminal(rec["state"])
            i += len(new)
            yield from new
            if ended and i >= len(self.apps[app_id]["logs"][replica]):
                return

    def _cancel_existing(self, app_id: str) -> None:
        self.finish(app_id, AppState.CANCELLED)

    def close(self) -> None:
        self.closed += 1


def create_scheduler(session_name: str, **kwargs: Any) -> MemoryScheduler:
    return MemoryScheduler(session_name, **kwargs)


# -- the scripted scenarios every face of the watch is tested against (test_watch_faces) ------


class Scenario:
    """What the backend does to the next app submitted: ``hiccup`` (two status calls fail
    transiently, then the app succeeds 0.3 s after its submit), ``outage`` (every status call
    fails transiently; run with a retry budget of a second: see :data:`OUTAGE_BUDGET`) or
    ``silent`` (the app prints its first lines, then nothing, and runs on)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.app_ids: list[str] = []

    def __enter__(self) -> Scenario:
        MemoryScheduler.failures.clear()
        if self.name == "hiccup":
            MemoryScheduler.failures[:] = [ConnectionError("engine restarting")] * 2
        elif self.name == "outage":
            MemoryScheduler.failures[:] = [ConnectionError("engine restarting")] * 100000
        MemoryScheduler.on_submit = self._submitted
        return self

    def __exit__(self, *exc: object) -> None:
        MemoryScheduler.on_submit = None
        MemoryScheduler.failures.clear()

    def _submitted(self, app_id: str) -> None:
        self.app_ids.append(app_id)
        if self.name == "hiccup":
            timer = threading.Timer(0.3, MemoryScheduler.finish, (app_id, AppState.SUCCEEDED))
            timer.daemon = True
            timer.start()

    @property
    def state(self) -> AppState:
        """The state of the app submitted in the scenario."""
        state: AppState = MemoryScheduler.apps[self.app_ids[-1]]["state"]
        return state


#: the retry budget (seconds) the faces run the ``outage`` scenario with
OUTAGE_BUDGET = "1"
#: the max_silence (seconds) the faces run the ``silent`` scenario with
SILENCE = 0.5


def use_memory_scheduler(monkeypatch: Any) -> None:
    """Makes ``memory`` one of the schedulers every part of Shipyard finds (the CLI's, the
    operator's, the Prefect tasks' runners), for the test (``monkeypatch``: pytest's fixture):
    as if a third-party package registered it under the ``shipyard.schedulers`` entry points."""
    import core.schedulers

    found = (*core.schedulers._discover(), ("memory", create_scheduler))
    monkeypatch.setattr(core.schedulers, "_discover", lambda: found)
