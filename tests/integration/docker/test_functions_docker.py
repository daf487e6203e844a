"""Python functions as jobs in Docker containers: the image's Python runs them (it needs
cloudpickle, not Shipyard), and an image without a fit Python is refused before anything
starts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.docker_scheduler import create_scheduler
from tests.integration import functions
from tests.services import python_image

BUSYBOX = "shipyard-test/busybox:latest"


@pytest.fixture
def docker_runner(docker_client: Any) -> Iterator[Runner]:
    """A runner on a session of its own; the session's containers are purged afterwards."""
    session = f"pytest-fn-{uuid.uuid4().hex[:8]}"
    with get_runner(session) as runner:
        yield runner
    sched = create_scheduler(session)
    for app in sched.list():
        sched.purge(app.app_id)
    sched.close()


def test_value_exception_and_map(docker_runner: Runner, docker_client: Any) -> None:
    image = python_image(docker_client)
    functions.check_value_exception_and_map(docker_runner, "local_docker", image=image)


def _probes(client: Any) -> set[str]:
    """The busybox containers of an interpreter check (its command imports cloudpickle)."""
    found = client.api.containers(all=True, filters={"ancestor": BUSYBOX})
    return {c["Id"] for c in found if "cloudpickle" in c.get("Command", "")}


def test_image_without_python_refused_before_anything_starts(
    docker_runner: Runner, docker_client: Any
) -> None:
    sched = create_scheduler(docker_runner.session_name)
    before = _probes(docker_client)
    with pytest.raises(ValueError, match=r"^cfg.python: cannot run python3 in .*busybox.*python3"):
        docker_runner.run_function(functions.square, 2, scheduler="local_docker", image=BUSYBOX)
    with pytest.raises(ValueError, match=r"^image: expected a Docker image with Python"):
        docker_runner.run_function(functions.square, 2, scheduler="local_docker")
    assert sched.list() == []
    # the container that found no python3 in the image is gone too
    assert _probes(docker_client) == before
    sched.close()
