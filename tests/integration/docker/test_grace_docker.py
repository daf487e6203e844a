"""A Docker scheduler made with a ``grace`` cancels with that grace instead of each app's
``stop_timeout`` (the Prefect worker's ``kill_infrastructure(grace_seconds=...)``)."""

from __future__ import annotations

import uuid
from typing import Any

from core.runner import Runner
from core.schedulers.docker_scheduler import create_scheduler
from core.specs import AppDef, AppState, Role
from tests.helpers import wait_until

IMAGE = "shipyard-test/busybox:latest"


def test_the_scheduler_grace_replaces_the_apps_stop_timeout(docker_client: Any) -> None:
    session = f"pytest-grace-{uuid.uuid4().hex[:8]}"
    # PID 1 of the container ignores SIGTERM: only the SIGKILL after the grace ends it, which
    # with the app's own stop_timeout would come after 600 s (past the test's timeout)
    app = AppDef("stubborn", [Role("w", image=IMAGE, entrypoint="sleep", args=["600"])])
    sched = create_scheduler(session, grace=1)
    runner = Runner(session, {"local_docker": lambda s, **kw: sched})
    try:
        handle = runner.run(app, "local_docker", {"stop_timeout": 600})
        wait_until(lambda: (s := runner.status(handle)) is not None
                   and s.state == AppState.RUNNING, what="the replica to run")  # fmt: skip
        runner.cancel(handle)
        status = runner.status(handle)
        assert status is not None and status.state == AppState.CANCELLED
    finally:
        for listed in sched.list():
            sched.purge(listed.app_id)
        sched.close()
