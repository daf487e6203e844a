"""Issue 19 on the real Docker engine: results copied out of stopped containers (and out of
the archive after retention), OOMKilled named with its peak, and pre-flight checks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner
from core.schedulers.docker_scheduler import DockerScheduler, create_scheduler
from core.specs import AppDef, AppState, BindMount, DeviceMount, Resource, Role
from tests.integration.docker.usage_probe import MEASURE
from tests.services import python_image

IMAGE = "shipyard-test/busybox:latest"
WRITE = 'echo "{\\"rank\\": $SHIPYARD_REPLICA_ID}" > "$SHIPYARD_RESULT_FILE"'


@pytest.fixture
def sched(docker_client: Any) -> Iterator[DockerScheduler]:
    """A scheduler on a session of its own; its apps are purged afterwards."""
    docker_client.images.get(IMAGE)
    scheduler = create_scheduler(f"pytest-{uuid.uuid4().hex[:8]}")
    yield scheduler
    for app in scheduler.list():
        scheduler.purge(app.app_id)
    scheduler.close()


def _runner(sched: DockerScheduler) -> Runner:
    return Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})


def _run(sched: DockerScheduler, app: AppDef, cfg: dict[str, Any] | None = None) -> str:
    runner = _runner(sched)
    handle = runner.run(app, "local_docker", cfg)
    runner.wait(handle, wait_interval=0.1)
    return handle


def test_result_copied_out_of_stopped_containers(sched: DockerScheduler) -> None:
    app = AppDef(
        "res",
        [
            Role("w", image=IMAGE, entrypoint="sh", args=["-c", WRITE], num_replicas=2),
            Role("quiet", image=IMAGE, entrypoint="true"),
        ],
    )
    handle = _run(sched, app)
    result = _runner(sched).result(handle)
    assert result.state == AppState.SUCCEEDED
    assert result.values() == {"w": {0: {"rank": 0}}}  # replica 0 of each role
    assert result.get("quiet") is None and result.errors == []
    every = _runner(sched).result(_run(sched, app, {"result_replicas": "all"}))
    assert every.values() == {"w": {0: {"rank": 0}, 1: {"rank": 1}}}


def test_result_survives_retention(sched: DockerScheduler, docker_client: Any) -> None:
    app = AppDef("keep", [Role("w", image=IMAGE, entrypoint="sh", args=["-c", WRITE])])
    handle = _run(sched, app, {"retention": 0})
    sched.sweep()  # archives the logs (and the result) and removes the containers
    app_id = handle.rsplit("/", 1)[1]
    flt = {"label": f"shipyard.app_id={app_id}"}
    assert docker_client.api.containers(all=True, filters=flt) == []
    assert _runner(sched).result(handle).get("w") == {"rank": 0}
    status = _runner(sched).status(handle)  # (from the tombstone, with the usage it kept)
    assert status is not None and "containers and network removed" in status.msg
    usage = status.roles[0].replicas[0].usage
    assert usage is not None and usage.wall_time is not None and usage.wall_time >= 0


def test_invalid_and_oversized_results_name_the_replica(sched: DockerScheduler) -> None:
    bad = 'echo "{oops" > "$SHIPYARD_RESULT_FILE"'
    big = 'head -c 1100000 /dev/zero > "$SHIPYARD_RESULT_FILE"'
    app = AppDef(
        "bad",
        [
            Role("bad", image=IMAGE, entrypoint="sh", args=["-c", bad]),
            Role("big", image=IMAGE, entrypoint="sh", args=["-c", big]),
        ],
    )
    errors = _runner(sched).result(_run(sched, app)).errors
    assert errors[0].startswith("bad/0: result file is not valid JSON")
    assert errors[1].startswith("big/0: result file is 1100000 bytes, more than")


def test_oom_kill_is_named_with_its_peak(sched: DockerScheduler) -> None:
    hog = AppDef(
        "oom",
        [
            Role(
                "m",
                image=IMAGE,
                entrypoint="sh",
                args=["-c", "head -c 300m /dev/zero | tail"],
                resource=Resource(1, 0, 64),
            )
        ],
    )
    status = _runner(sched).status(_run(sched, hog))
    assert status is not None and status.state == AppState.FAILED
    assert status.msg.startswith("m/0 killed: out of memory (peak 64 MiB of 64 MiB requested)")
    replica = status.roles[0].replicas[0]
    assert replica.usage is not None and replica.usage.oom_killed
    assert replica.reason == "oom" and status.reason == "oom"


def test_usage_within_20_percent_of_what_the_replica_measured(
    sched: DockerScheduler, docker_client: Any
) -> None:
    image = python_image(docker_client)
    app = AppDef(
        "use",
        [
            Role(
                "m",
                image=image,
                entrypoint="python",
                args=["-c", MEASURE],
                resource=Resource(1, 0, 1000),
            )
        ],  # fmt: skip
    )
    handle = _run(sched, app)  # (its waits describe the running replica: the samples)
    own = _runner(sched).result(handle).get("m")
    status = _runner(sched).status(handle)
    assert status is not None and status.state == AppState.SUCCEEDED
    u = status.roles[0].replicas[0].usage
    assert u is not None and not u.oom_killed
    assert u.cpu_time == pytest.approx(own["cpu"], rel=0.2)
    assert u.peak_memory == pytest.approx(own["maxrss"], rel=0.2)
    assert u.wall_time == pytest.approx(own["wall"], rel=0.2)
    assert u.requested_memory == 1000 << 20
    # another process's scheduler never saw it run: the exact wall time only
    other = create_scheduler(sched.session_name)
    try:
        desc = other.describe(handle.rsplit("/", 1)[1])
    finally:
        other.close()
    assert desc is not None
    late = desc.roles_statuses[0].replicas[0].usage
    assert late is not None and late.cpu_time is None and late.peak_memory is None
    assert late.wall_time == pytest.approx(u.wall_time, abs=0.01)


def test_preflight_reports_every_problem_at_once(
    sched: DockerScheduler, docker_client: Any
) -> None:
    app = AppDef(
        "pre",
        [
            Role(
                "a",
                image="shipyard-test/no-such-image:latest",
                entrypoint="true",
                mounts=[BindMount("/no/such/dir", "/data"), DeviceMount("/dev/no-such", "/dev/x")],
            ),
            Role("b", image=IMAGE, entrypoint="true"),
            Role("c", image=IMAGE, entrypoint="no-such-command-shipyard"),
        ],
    )
    before = docker_client.containers.list(all=True)
    # (pull=never: the default, missing, would ask Docker's default registry, out of reach here)
    problems = _runner(sched).preflight(app, "local_docker", {"pull": "never"})
    assert [p.field for p in problems] == [
        "roles[0].image",
        "roles[0].mounts[0].src",
        "roles[0].mounts[1].src",
        "roles[2].entrypoint",
    ]
    assert "not present on the Docker engine" in problems[0].message
    assert problems[3].message == (
        f"'no-such-command-shipyard' was not found on PATH in image {IMAGE!r}"
    )
    assert (
        _runner(sched).preflight(
            AppDef("ok", [Role("b", image=IMAGE, entrypoint="true")]), "local_docker"
        )
        == []
    )
    assert sched.list() == []  # nothing was started
    assert docker_client.containers.list(all=True) == before  # (the lookups' containers too)


def test_preflight_looks_entrypoints_up_as_the_container_would(sched: DockerScheduler) -> None:
    """A name on the role's PATH (else the image's), a path from the image's working
    directory, and a directory is not an entrypoint."""
    app = AppDef(
        "ep",
        [
            Role("a", image=IMAGE, entrypoint="true", env={"PATH": "/no/such/dir"}),
            Role("b", image=IMAGE, entrypoint="/no/such/file"),
            Role("c", image=IMAGE, entrypoint="bin/busybox"),  # the working directory is /
            Role("d", image=IMAGE, entrypoint="/bin"),
            Role("e", image=IMAGE, entrypoint="busybox", env={"PATH": "/no/such/dir:/bin"}),
            Role("f", image=IMAGE, entrypoint="/bin/true"),
        ],
    )
    problems = _runner(sched).preflight(app, "local_docker", {"pull": "never"})
    assert [str(p) for p in problems] == [
        f"roles[0].entrypoint: 'true' was not found on PATH in image {IMAGE!r}",
        f"roles[1].entrypoint: '/no/such/file' does not exist in image {IMAGE!r}",
        f"roles[3].entrypoint: '/bin' is a directory in image {IMAGE!r}",
    ]


def test_preflight_with_a_workspace_looks_in_the_image_it_builds(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "run.sh").chmod(0o755)
    app = AppDef("ws", [Role("main", image=IMAGE, entrypoint="./run.sh")])
    runner = _runner(sched)
    assert runner.preflight(app, "local_docker", {"pull": "never"}, str(tmp_path)) == []
    assert [str(p) for p in runner.preflight(app, "local_docker", {"pull": "never"})] == [
        f"roles[0].entrypoint: './run.sh' does not exist in image {IMAGE!r}"
    ]
    assert sched.list() == []


def test_preflight_leaves_no_volume_and_skips_images_with_an_entrypoint(
    sched: DockerScheduler, docker_client: Any
) -> None:
    """An image's VOLUME gives the lookup container an anonymous volume, removed with it; an
    image with an ENTRYPOINT of its own takes the role's command as its arguments."""
    import io

    dockerfile = f'FROM {IMAGE}\nVOLUME /data\nENTRYPOINT ["sh", "-c"]\n'
    with_entrypoint, _ = docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag="shipyard-test/preflight-ep:latest", rm=True
    )
    dockerfile = f"FROM {IMAGE}\nVOLUME /data\n"
    with_volume, _ = docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag="shipyard-test/preflight-vol:latest", rm=True
    )
    volumes = {v.name for v in docker_client.volumes.list()}
    app = AppDef(
        "vol",
        [
            Role("a", image="shipyard-test/preflight-vol:latest", entrypoint="true"),
            Role("b", image="shipyard-test/preflight-ep:latest", entrypoint="echo hi"),
        ],
    )
    assert _runner(sched).preflight(app, "local_docker", {"pull": "never"}) == []
    assert {v.name for v in docker_client.volumes.list()} == volumes
    assert with_entrypoint.attrs["Config"]["Entrypoint"] == ["sh", "-c"]
    assert with_volume.attrs["Config"]["Volumes"] == {"/data": {}}
