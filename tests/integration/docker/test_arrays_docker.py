"""Arrays on the real Docker engine: each element is a container app of the session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.docker_scheduler import create_scheduler
from core.specs import BindMount, Role
from tests.integration import arrays

IMAGE = "shipyard-test/busybox:latest"


@pytest.fixture
def docker_runner(docker_client: Any) -> Iterator[Runner]:
    """A runner on a session of its own; the session's containers are purged afterwards."""
    session = f"pytest-arr-{uuid.uuid4().hex[:8]}"
    with get_runner(session) as runner:
        yield runner
    sched = create_scheduler(session)
    for app in sched.list():
        sched.purge(app.app_id)
    sched.close()


def role_in(records: Path) -> arrays.RoleFactory:
    def role(script: str) -> Role:
        mount = BindMount(str(records), str(records))
        return Role("w", image=IMAGE, entrypoint="sh", args=["-c", script], mounts=[mount])

    return role


def test_fifty_elements_at_most_four_at_once_each_once(
    docker_runner: Runner, tmp_path: Path
) -> None:
    arrays.check_cap_and_once(
        docker_runner, "local_docker", {}, role_in(tmp_path), str(tmp_path), 50
    )


def test_cancel_mid_array_stops_its_containers(docker_runner: Runner, tmp_path: Path) -> None:
    arrays.check_cancel(docker_runner, "local_docker", {}, role_in(tmp_path), str(tmp_path))


def test_retry_failed_reruns_only_the_failed(docker_runner: Runner, tmp_path: Path) -> None:
    arrays.check_retry_failed(docker_runner, "local_docker", {}, role_in(tmp_path), str(tmp_path))


def test_submitter_killed_after_submit_changes_nothing(
    docker_runner: Runner, tmp_path: Path
) -> None:
    arrays.check_submitter_killed(
        docker_runner, "local_docker", {}, role_in(tmp_path), str(tmp_path), 6
    )


def test_a_chain_runs_in_order_and_a_failure_cancels_what_waits(
    docker_runner: Runner, tmp_path: Path
) -> None:
    arrays.check_chain(docker_runner, "local_docker", {}, role_in(tmp_path), str(tmp_path))
