"""The local_docker scheduler against the real Docker engine (``scripts/start_docker.sh``).

Images are built locally (``scripts/build_test_images.sh``), never pulled. Every test cleans up
the containers, networks, tombstone volumes and images it creates.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core.runner import get_runner
from core.schedulers.api import DescribeAppResponse, Stream
from core.schedulers.docker_scheduler import (
    LABEL_APP_ID,
    LABEL_SESSION,
    DockerJob,
    DockerScheduler,
    create_scheduler,
    has_docker,
)
from core.specs import (
    AppDef,
    AppState,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    VolumeMount,
    is_terminal,
    parse_mounts,
)
from tests.helpers import ROOT, wait_until
from tests.services import require

pytestmark = pytest.mark.docker

IMAGE = "shipyard-test/busybox:latest"
REGISTRY = "127.0.0.1:5000"


# --------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(docker_client: Any) -> str:
    """The busybox test image, built (locally) if it is missing."""
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(IMAGE)
    except ImageNotFound:
        subprocess.run(["bash", str(ROOT / "scripts" / "build_test_images.sh")], check=True)
    docker_client.images.get(IMAGE)
    return IMAGE


@pytest.fixture
def sched(docker_client: Any, image: str) -> Iterator[DockerScheduler]:
    """A scheduler on a session of its own; every app of the session is purged afterwards."""
    session = f"pytest-{uuid.uuid4().hex[:8]}"
    scheduler = create_scheduler(session)
    yield scheduler
    for app in scheduler.list():
        scheduler.purge(app.app_id)
    leftovers = docker_client.api.containers(
        all=True, filters={"label": f"{LABEL_SESSION}={session}"}
    )
    nets = docker_client.api.networks(filters={"label": f"{LABEL_SESSION}={session}"})
    scheduler.close()
    assert not leftovers and not nets, "the test left containers or networks behind"


@pytest.fixture
def built_images(docker_client: Any) -> Iterator[set[str]]:
    """Ids of the images a test builds; removed (with their tags) afterwards."""
    ids: set[str] = set()
    yield ids
    for image_id in ids:
        try:
            docker_client.api.remove_image(image_id, force=True)
        except Exception as e:  # already gone
            if getattr(e, "status_code", None) != 404:
                raise


def wait_terminal(
    sched: DockerScheduler, app_id: str, timeout: float = 180, every_replica: bool = False
) -> DescribeAppResponse:
    """Polls describe until the app (and with ``every_replica`` each replica) is terminal."""
    deadline = time.monotonic() + timeout
    while True:
        desc = sched.describe(app_id)
        assert desc is not None, f"{app_id} disappeared"
        if is_terminal(desc.state) and (
            not every_replica or all(is_terminal(s) for s, _ in replicas(desc).values())
        ):
            return desc
        assert time.monotonic() < deadline, f"{app_id} still {desc.state.name} after {timeout}s"
        time.sleep(0.1)


def app_containers(docker_client: Any, app_id: str) -> list[dict[str, Any]]:
    return docker_client.api.containers(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})


def app_networks(docker_client: Any, app_id: str) -> list[dict[str, Any]]:
    return docker_client.api.networks(filters={"label": f"{LABEL_APP_ID}={app_id}"})


def session_networks(docker_client: Any, sched: DockerScheduler) -> list[dict[str, Any]]:
    return docker_client.api.networks(filters={"label": f"{LABEL_SESSION}={sched.session_name}"})


def replicas(desc: DescribeAppResponse) -> dict[str, tuple[AppState, int | None]]:
    return {
        f"{r.role}/{r.id}": (r.state, r.exit_code)
        for rs in desc.roles_statuses
        for r in rs.replicas
    }


def sh(name: str, script: str, image: str = IMAGE, **kwargs: Any) -> Role:
    return Role(name, image=image, entrypoint="sh", args=["-c", script], **kwargs)


# --------------------------------------------------------------------------------------------
# dry run: the request (no engine needed)
# --------------------------------------------------------------------------------------------


def test_dryrun_builds_one_container_per_replica(tmp_path: Path) -> None:
    sched = DockerScheduler("dry")
    os.environ["SHIPYARD_TEST_COPY_ME"] = "copied"
    os.environ["SHIPYARD_TEST_OVERRIDE"] = "from-os"
    try:
        app = AppDef(
            "dry",
            [
                Role(
                    "trainer",
                    image=IMAGE,
                    entrypoint="python",
                    args=["train.py", "--app", "${app_id}", "--rank", "${replica_id}"],
                    env={"ROLE_ENV": "r${replica_id}", "SHIPYARD_TEST_OVERRIDE": "from-role"},
                    num_replicas=2,
                    max_retries=3,
                    resource=Resource(cpu=2, gpu=1, memMB=512),
                    mounts=[
                        BindMount(str(tmp_path), "/data", read_only=True),
                        VolumeMount("cache-vol", "/cache"),
                        DeviceMount("/dev/null", "/dev/mynull", "rw"),
                    ],
                ),
                Role("ps", image=IMAGE, entrypoint="sleep", args=["1"]),
            ],
        )
        info = sched.submit_dryrun(
            app,
            {"copy_env": ["SHIPYARD_TEST_*"], "env": "CFG_A:1;SHIPYARD_TEST_COPY_ME:cfg"},
            idempotency_key="my-key",
        )
    finally:
        del os.environ["SHIPYARD_TEST_COPY_ME"], os.environ["SHIPYARD_TEST_OVERRIDE"]
    job = info.request
    assert isinstance(job, DockerJob)
    app_id = job.app_id
    assert app_id.startswith("dry-")
    assert len(job.containers) == 3
    c1 = job.containers[1]
    assert c1.image == IMAGE
    assert c1.command == ["python", "train.py", "--app", app_id, "--rank", "1"]
    kw: dict[str, Any] = c1.kwargs
    assert kw["name"] == f"{app_id}-trainer-1"
    assert kw["hostname"] == "trainer-1"
    env = kw["environment"]
    assert env["ROLE_ENV"] == "r1"
    assert env["CFG_A"] == "1"
    assert env["SHIPYARD_TEST_COPY_ME"] == "cfg"  # cfg env over copy_env
    assert env["SHIPYARD_TEST_OVERRIDE"] == "from-role"  # role env over both
    assert env["SHIPYARD_APP_ID"] == app_id
    assert env["SHIPYARD_ROLE_NAME"] == "trainer"
    assert env["SHIPYARD_REPLICA_ID"] == "1"
    assert env["SHIPYARD_NUM_REPLICAS"] == "2"
    assert env["SHIPYARD_RANK0_HOST"] == "trainer-0"
    assert kw["network"] == app_id
    assert kw["networking_config"] == {app_id: {"Aliases": ["trainer-1"]}}
    assert kw["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
    assert kw["nano_cpus"] == 2_000_000_000
    assert kw["mem_limit"] == "512m"
    assert kw["device_requests"] == [{"count": 1, "capabilities": [["gpu"]]}]
    assert kw["mounts"] == [
        {"Type": "bind", "Source": str(tmp_path), "Target": "/data", "ReadOnly": True},
        {"Type": "volume", "Source": "cache-vol", "Target": "/cache", "ReadOnly": False},
    ]
    assert kw["devices"] == ["/dev/null:/dev/mynull:rw"]
    labels = kw["labels"]
    assert labels[LABEL_APP_ID] == app_id
    assert labels["shipyard.role_name"] == "trainer"
    assert labels["shipyard.replica_id"] == "1"
    assert labels[LABEL_SESSION] == "dry"
    assert labels["shipyard.app_name"] == "dry"
    assert labels["shipyard.idempotency_key"] != "my-key"  # hashed
    # the role without retries gets no restart policy
    assert "restart_policy" not in job.containers[2].kwargs
    # the printable form names every container
    assert f"{app_id}-ps-0" in str(info)


def test_dryrun_single_container_uses_default_network() -> None:
    info = DockerScheduler("dry").submit_dryrun(
        AppDef("one", [Role("solo", image=IMAGE, entrypoint="true")]), {}
    )
    (c,) = info.request.containers
    assert "network" not in c.kwargs
    assert c.kwargs["hostname"] == "solo-0"


def test_run_opts_match_the_spec() -> None:
    opts = DockerScheduler("x").run_opts()
    assert {"copy_env", "env", "image_repo", "quiet", "pull"} <= {k for k, _ in opts}
    pull = opts.get("pull")
    assert pull is not None and pull.default == "missing"
    assert "comma or semicolon" in str(opts)


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"bogus": 1}, r"cfg: unknown option\(s\) bogus"),
        ({"env": "NOCOLON"}, r"cfg\.env: expected KEY:VALUE"),
        ({"env": "1BAD:x"}, r"cfg\.env: expected variable names"),
        ({"env": {"A B": "x"}}, r"cfg\.env: expected variable names"),
        ({"quiet": "maybe"}, r"cfg\.quiet: expected a bool"),
        ({"image_repo": "Bad Repo"}, r"cfg\.image_repo"),
        ({"image_repo": "127.0.0.1:5000/x:tag"}, r"cfg\.image_repo"),
        ({"stop_timeout": -1}, r"cfg\.stop_timeout"),
        ({"pull": "sometimes"}, r"cfg\.pull: expected one of missing, always, never"),
    ],
)
def test_bad_cfg_is_rejected_naming_the_field(cfg: dict[str, Any], match: str) -> None:
    app = AppDef("bad", [Role("r", image=IMAGE, entrypoint="true")])
    with pytest.raises(ValueError, match=match):
        DockerScheduler("x").submit_dryrun(app, cfg)


@pytest.mark.parametrize(
    "role, match",
    [
        (Role("r", entrypoint="true"), r"roles\[0\]\.image: a Docker image is required"),
        (Role("r", image="Not An Image", entrypoint="true"), r"roles\[0\]\.image: not a valid"),
        (Role("r", image="UPPER/case", entrypoint="true"), r"roles\[0\]\.image: not a valid"),
        (Role("r", image="a" * 256, entrypoint="true"), r"roles\[0\]\.image: the repository"),
        (
            Role("r", image=IMAGE, entrypoint="true", mounts=[BindMount("/no/such/dir", "/x")]),
            r"roles\[0\]\.mounts\[0\]\.src: bind source '/no/such/dir' does not exist",
        ),
        (
            Role("r", image=IMAGE, entrypoint="true", mounts=[BindMount("/tmp", "rel")]),
            r"roles\[0\]\.mounts\[0\]\.dst: expected an absolute container path",
        ),
        (
            Role("r", image=IMAGE, entrypoint="true", mounts=[VolumeMount("bad/name", "/x")]),
            r"roles\[0\]\.mounts\[0\]\.src: expected a volume name",
        ),
        (
            Role("r", image=IMAGE, entrypoint="true", mounts=[DeviceMount("/dev/nope", "/d")]),
            r"roles\[0\]\.mounts\[0\]\.src: device '/dev/nope' does not exist",
        ),
        (
            Role("r" * 62, image=IMAGE, entrypoint="true", num_replicas=10),
            r"roles\[0\]\.name: the replica hostname",
        ),
    ],
)
def test_bad_roles_are_rejected_naming_the_field(role: Role, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DockerScheduler("x").submit_dryrun(AppDef("bad", [role]), {})


def test_malformed_mount_specs_name_the_mount() -> None:
    with pytest.raises(ValueError, match=r"mounts\[0\]\.type: expected bind, volume or device"):
        parse_mounts("type=tmpfs,src=a,dst=/b")
    with pytest.raises(ValueError, match=r"mounts\[1\]\.dst: required"):
        parse_mounts(["type=bind,src=/a,dst=/b", "type=bind,src=/c"])
    assert parse_mounts("type=bind,src=/a,dst=/b,readonly") == [BindMount("/a", "/b", True)]


def test_has_docker_and_scheduler_discovery(docker_client: Any) -> None:
    from core.schedulers import get_scheduler_factories

    assert has_docker() is True
    sched = get_scheduler_factories()["local_docker"]("disco")
    assert isinstance(sched, DockerScheduler)
    assert sched.backend == "local_docker" and sched.session_name == "disco"
    sched.close()
    sched.close()  # close is idempotent


# --------------------------------------------------------------------------------------------
# the real engine
# --------------------------------------------------------------------------------------------

_DESCRIBE_IN_OTHER_PROCESS = """
import json, sys
from core.schedulers.docker_scheduler import create_scheduler
desc = create_scheduler("someone-else").describe(sys.argv[1])
print(json.dumps({
    "state": desc.state.name,
    "replicas": {f"{r.role}/{r.id}": [r.state.name, r.exit_code, r.hostname]
                 for rs in desc.roles_statuses for r in rs.replicas},
}))
"""


def test_two_roles_three_replicas_resolve_each_other_and_one_fails(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path
) -> None:
    hosts = " ".join(f"{r}-{i}" for r in ("server", "worker") for i in range(3))
    # Every replica resolves all six hostnames on the app network and pings server-0, then
    # checks in at a barrier (a shared bind mount) so nobody exits before all have resolved.
    script = (
        f"for h in {hosts}; do "
        "  n=0; until nslookup $h >/dev/null 2>&1; do n=$((n+1)); "
        '    [ $n -gt 100 ] && echo "cannot resolve $h" && exit 9; sleep 0.1; done; '
        "done; "
        "ping -c 1 -W 5 server-0 >/dev/null || exit 8; "
        'echo "$SHIPYARD_ROLE_NAME/$SHIPYARD_REPLICA_ID of $SHIPYARD_NUM_REPLICAS resolved all"; '
        "touch /sync/$HOSTNAME; "
        "until [ $(ls /sync | wc -l) -ge 6 ]; do sleep 0.1; done; "
        '[ "$SHIPYARD_ROLE_NAME/$SHIPYARD_REPLICA_ID" = worker/2 ] && exit 3; '
        "exit 0"
    )
    sync = [BindMount(str(tmp_path), "/sync")]
    app = AppDef(
        "mesh",
        [
            sh("server", script, num_replicas=3, mounts=sync),
            sh("worker", script, num_replicas=3, mounts=sync),
        ],
    )
    app_id = sched.submit(app, {})

    # every replica is listed from the moment submit returns
    desc = sched.describe(app_id)
    assert desc is not None
    assert sorted(replicas(desc)) == [f"{r}/{i}" for r in ("server", "worker") for i in range(3)]
    assert {r.hostname for rs in desc.roles_statuses for r in rs.replicas} == set(hosts.split())
    assert len(app_networks(docker_client, app_id)) == 1

    final = wait_terminal(sched, app_id, every_replica=True)
    assert final.state == AppState.FAILED
    got = replicas(final)
    assert got.pop("worker/2") == (AppState.FAILED, 3), got
    assert all(v == (AppState.SUCCEEDED, 0) for v in got.values()), got
    assert "worker/2 exited with code 3" in final.msg
    for role, k in [("server", 0), ("worker", 1)]:
        lines = list(sched.log_iter(app_id, role, k))
        assert lines == [f"{role}/{k} of 3 resolved all\n"]

    # describe from another process, with another session: state lives in the labels
    out = subprocess.run(
        [sys.executable, "-c", _DESCRIBE_IN_OTHER_PROCESS, app_id],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    other = json.loads(out.stdout)
    assert other["state"] == "FAILED"
    assert other["replicas"]["worker/2"] == ["FAILED", 3, "worker-2"]
    assert other["replicas"]["server/1"] == ["SUCCEEDED", 0, "server-1"]

    listed = {a.app_id: a.state for a in sched.list()}
    assert listed == {app_id: AppState.FAILED}


def test_logs_by_stream_with_since_and_until(sched: DockerScheduler, docker_client: Any) -> None:
    script = "echo one; echo err-one >&2; sleep 1.5; echo two; echo err-two >&2"
    app_id = sched.submit(AppDef("logs", [sh("talker", script)]), {})
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED

    assert list(sched.log_iter(app_id, "talker", streams=Stream.STDOUT)) == ["one\n", "two\n"]
    assert list(sched.log_iter(app_id, "talker", streams=Stream.STDERR)) == [
        "err-one\n",
        "err-two\n",
    ]
    combined = list(sched.log_iter(app_id, "talker", streams=Stream.COMBINED))
    assert sorted(combined) == ["err-one\n", "err-two\n", "one\n", "two\n"]
    assert list(sched.log_iter(app_id, "talker", regex="^err")) in (["err-one\n", "err-two\n"],)

    # cut between the two halves, at the middle of the engine's own timestamps
    raw = docker_client.api.logs(f"{app_id}-talker-0", timestamps=True).decode()
    stamps = {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in raw.splitlines()}

    def ts(name: str) -> float:
        m = re.match(r"(.*T\d\d:\d\d:\d\d)\.?(\d*)Z", stamps[name])
        assert m
        base = datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
        return base + (int(m.group(2)) / 10 ** len(m.group(2)) if m.group(2) else 0)

    cut = datetime.fromtimestamp((ts("err-one") + ts("two")) / 2, tz=UTC)
    after = list(sched.log_iter(app_id, "talker", since=cut))
    before = list(sched.log_iter(app_id, "talker", until=cut))
    assert sorted(after) == ["err-two\n", "two\n"]
    assert sorted(before) == ["err-one\n", "one\n"]
    assert list(sched.log_iter(app_id, "talker", since=cut, streams=Stream.STDOUT)) == ["two\n"]

    with pytest.raises(ValueError, match="streams"):
        sched.log_iter(app_id, "talker", streams="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no replica talker/5"):
        sched.log_iter(app_id, "talker", 5)


def test_log_iter_tails_until_the_replica_ends(sched: DockerScheduler) -> None:
    script = "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done; printf 'no newline'"
    app_id = sched.submit(AppDef("tail", [sh("t", script)]), {})
    lines = list(sched.log_iter(app_id, "t", should_tail=True))
    assert lines == [f"line {i}\n" for i in range(1, 6)] + ["no newline"]
    assert sched.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]


def test_large_log_is_split_into_whole_lines(sched: DockerScheduler) -> None:
    n = 50_000
    app_id = sched.submit(AppDef("big", [sh("seq", f"seq 1 {n}")]), {})
    tailed = list(sched.log_iter(app_id, "seq", should_tail=True))
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
    full = list(sched.log_iter(app_id, "seq"))
    expected = [f"{i}\n" for i in range(1, n + 1)]
    assert full == expected
    assert tailed == expected


def test_cancel_stops_replicas_that_ignore_sigterm_and_leaves_nothing(
    sched: DockerScheduler, docker_client: Any
) -> None:
    script = "trap '' TERM; echo up; while true; do sleep 0.2; done"
    app = AppDef("stubborn", [sh("r", script, num_replicas=3)])
    app_id = sched.submit(app, {"stop_timeout": 1})
    wait_until(
        lambda: all(c["State"] == "running" for c in app_containers(docker_client, app_id)),
        what="replicas running",
    )
    assert sched.describe(app_id).state == AppState.RUNNING  # type: ignore[union-attr]
    assert len(app_networks(docker_client, app_id)) == 1

    sched.cancel(app_id)
    assert app_containers(docker_client, app_id) == []
    assert app_networks(docker_client, app_id) == []
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert {v[0] for v in replicas(desc).values()} == {AppState.CANCELLED}
    assert sorted(replicas(desc)) == ["r/0", "r/1", "r/2"]
    assert {a.app_id: a.state for a in sched.list()} == {app_id: AppState.CANCELLED}
    assert sched.exists(app_id)

    sched.cancel(app_id)  # idempotent
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="cancelled"):
        sched.log_iter(app_id, "r", 0)

    # wait() through the runner sees the cancellation from a fresh scheduler
    with get_runner("pytest-other") as runner:
        status = runner.wait(f"local_docker://{sched.session_name}/{app_id}", timeout=10)
        assert status is not None and status.state == AppState.CANCELLED

    sched.purge(app_id)
    assert sched.describe(app_id) is None
    sched.cancel(app_id)  # unknown apps are ignored


def test_describe_during_cancel_never_reports_success_or_failure(
    sched: DockerScheduler, docker_client: Any
) -> None:
    # Replicas 0 and 1 exit 0 on SIGTERM right away, replica 2 ignores it for the whole grace
    # period: while cancel waits for it, the others have exited with 0 (they must not make the
    # app look SUCCEEDED) and been removed (they must not make it look FAILED).
    script = (
        'if [ "$SHIPYARD_REPLICA_ID" = 2 ]; then trap "" TERM; else trap "exit 0" TERM; fi; '
        "echo up; while true; do sleep 0.1; done"
    )
    app_id = sched.submit(
        AppDef("graceful", [sh("r", script, num_replicas=3)]), {"stop_timeout": 2}
    )
    wait_until(
        lambda: all(list(sched.log_iter(app_id, "r", k)) == ["up\n"] for k in range(3)),
        what="replicas up",
    )
    done = threading.Event()
    errors: list[BaseException] = []

    def cancel() -> None:
        try:
            sched.cancel(app_id)
        except BaseException as e:  # surfaced below
            errors.append(e)
        finally:
            done.set()

    seen: list[AppState] = []
    thread = threading.Thread(target=cancel)
    thread.start()
    while not done.is_set():
        desc = sched.describe(app_id)
        assert desc is not None
        seen.append(desc.state)
    thread.join()
    assert not errors, errors
    assert set(seen) <= {AppState.RUNNING, AppState.CANCELLED}, seen
    assert AppState.CANCELLED in seen  # the grace period was long enough to look
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
    assert app_containers(docker_client, app_id) == []


def test_cancel_after_the_app_ended_keeps_its_final_state(sched: DockerScheduler) -> None:
    app_id = sched.submit(AppDef("done", [sh("r", "exit 0", num_replicas=2)]), {})
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
    sched.cancel(app_id)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert set(replicas(desc).values()) == {(AppState.SUCCEEDED, 0)}

    failed = sched.submit(AppDef("bad", [sh("r", "exit $SHIPYARD_REPLICA_ID", num_replicas=2)]), {})
    assert wait_terminal(sched, failed, every_replica=True).state == AppState.FAILED
    sched.cancel(failed)
    desc = sched.describe(failed)
    assert desc is not None and desc.state == AppState.FAILED
    assert replicas(desc) == {"r/0": (AppState.SUCCEEDED, 0), "r/1": (AppState.FAILED, 1)}
    assert "r/1 exited with code 1" in desc.msg
    assert {a.app_id: a.state for a in sched.list()} == {
        app_id: AppState.SUCCEEDED,
        failed: AppState.FAILED,
    }


def test_records_of_a_retired_app_expire_after_its_record_retention(
    sched: DockerScheduler, docker_client: Any
) -> None:
    """A cancelled app keeps its tombstone and key claim for its ``record_retention`` (7 days
    by default), then the sweep removes them: volumes do not pile up on a shared engine."""

    def cancelled(cfg: dict[str, Any]) -> tuple[str, str]:
        key = f"expire-{uuid.uuid4().hex}"
        app_id = sched.submit(
            AppDef("expire", [sh("r", "trap 'exit 143' TERM; sleep 60 & wait")]),
            cfg,
            idempotency_key=key,
        )
        sched.cancel(app_id)
        return app_id, key

    def volumes(app_id: str) -> int:
        found = docker_client.api.volumes(filters={"label": f"shipyard.app_id={app_id}"})
        return len(found.get("Volumes") or [])

    kept, kept_key = cancelled({})
    gone, gone_key = cancelled({"record_retention": 0})
    assert volumes(kept) == volumes(gone) == 2  # a tombstone and a claim each
    sched.sweep()
    assert sched.describe(kept).state == AppState.CANCELLED  # type: ignore[union-attr]
    assert sched.find_by_idempotency_key(kept_key) == kept and volumes(kept) == 2
    assert sched.describe(gone) is None and sched.find_by_idempotency_key(gone_key) is None
    assert volumes(gone) == 0


def test_max_retries_restarts_only_the_failing_replica(sched: DockerScheduler) -> None:
    app = AppDef(
        "retry",
        [
            sh("flaky", "echo attempt; exit 4", max_retries=2),
            sh("steady", "echo ok; sleep 1"),
        ],
    )
    app_id = sched.submit(app, {})
    tailed = list(sched.log_iter(app_id, "flaky", should_tail=True))
    desc = wait_terminal(sched, app_id, every_replica=True)
    assert desc.state == AppState.FAILED
    assert desc.num_restarts == 2
    assert replicas(desc) == {
        "flaky/0": (AppState.FAILED, 4),
        "steady/0": (AppState.SUCCEEDED, 0),
    }
    assert "after 2 restart(s)" in desc.msg
    assert list(sched.log_iter(app_id, "flaky")) == ["attempt\n"] * 3
    assert tailed == ["attempt\n"] * 3
    assert list(sched.log_iter(app_id, "steady")) == ["ok\n"]


def test_retries_that_end_in_success(sched: DockerScheduler, tmp_path: Path) -> None:
    # fails twice (counting attempts in a bind-mounted directory), then succeeds
    script = (
        "echo x >> /state/attempts; n=$(wc -l < /state/attempts); echo attempt $n; "
        '[ "$n" -ge 3 ] || exit 1'
    )
    role = sh("r", script, max_retries=5, mounts=[BindMount(str(tmp_path), "/state")])
    app_id = sched.submit(AppDef("eventually", [role]), {})
    desc = wait_terminal(sched, app_id)
    assert desc.state == AppState.SUCCEEDED
    assert desc.num_restarts == 2
    assert (tmp_path / "attempts").read_text().count("x") == 3


def test_env_mounts_and_resources_reach_the_container(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path
) -> None:
    (tmp_path / "input.txt").write_text("from the host\n")
    vol = f"shipyard-test-{uuid.uuid4().hex[:8]}"
    os.environ["SHIPYARD_TEST_COPIED"] = "yes"
    app_id = None
    script = (
        'echo "copied=$SHIPYARD_TEST_COPIED cfg=$CFG_VAR role=$ROLE_VAR app=$SHIPYARD_APP_ID"; '
        "cat /in/input.txt; echo written > /vol/out.txt && cat /vol/out.txt; "
        "touch /in/nope 2>/dev/null || echo read-only; "
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
    )
    role = sh(
        "env",
        script,
        env={"ROLE_VAR": "r-${replica_id}"},
        resource=Resource(cpu=1, gpu=0, memMB=64),
        mounts=parse_mounts(
            [f"type=bind,src={tmp_path},dst=/in,readonly", f"type=volume,src={vol},dst=/vol"]
        ),
    )
    try:
        app_id = sched.submit(
            AppDef("env", [role]), {"copy_env": ["SHIPYARD_TEST_*"], "env": "CFG_VAR:c1"}
        )
        assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
        lines = list(sched.log_iter(app_id, "env", streams=Stream.STDOUT))
        assert lines == [
            f"copied=yes cfg=c1 role=r-0 app={app_id}\n",
            "from the host\n",
            "written\n",
            "read-only\n",
            f"{64 * 1024 * 1024}\n",
        ]
        host_config = docker_client.api.inspect_container(f"{app_id}-env-0")["HostConfig"]
        assert host_config["NanoCpus"] == 1_000_000_000
        assert host_config["Memory"] == 64 * 1024 * 1024
    finally:
        del os.environ["SHIPYARD_TEST_COPIED"]
        if app_id:
            sched.purge(app_id)  # (cancel keeps an ended app's containers, so the volume's use)
        docker_client.api.remove_volume(vol, force=True)


def test_missing_image_fails_before_anything_starts(
    sched: DockerScheduler, docker_client: Any
) -> None:
    app = AppDef(
        "noimg",
        [
            Role("ok", image=IMAGE, entrypoint="true", num_replicas=2),
            Role("bad", image="shipyard-test/does-not-exist:1", entrypoint="true"),
        ],
    )
    # (pull=never: the default, missing, would ask Docker's default registry, out of reach here)
    with pytest.raises(ValueError, match=r"roles\[1\]\.image: .*not present.*pull=never"):
        sched.submit(app, {"pull": "never"})
    alone = AppDef(
        "noimg", [Role("bad", image="shipyard-test/does-not-exist:1", entrypoint="true")]
    )
    with pytest.raises(ValueError, match=r"roles\[0\]\.image: .*not present.*pull=never"):
        sched.submit(alone, {"pull": "never"})
    assert sched.list() == []
    assert session_networks(docker_client, sched) == []


def test_failed_submit_leaves_no_container_or_network(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path
) -> None:
    # The engine refuses to mount over "/": the second role's containers cannot be created
    # after the first role's (and the network) were.
    app = AppDef(
        "halfway",
        [
            Role("fine", image=IMAGE, entrypoint="sleep", args=["30"], num_replicas=2),
            Role("broken", image=IMAGE, entrypoint="true", mounts=[BindMount(str(tmp_path), "/")]),
        ],
    )
    with pytest.raises(RuntimeError, match="nothing left behind"):
        sched.submit(app, {})
    # keyed: nor its saved request or the key's claim (a retry submits anew)
    key = f"halfway-{uuid.uuid4().hex}"
    with pytest.raises(RuntimeError, match="nothing left behind"):
        sched.submit(app, {}, idempotency_key=key)
    assert sched.find_by_idempotency_key(key) is None
    assert (
        docker_client.api.containers(
            all=True, filters={"label": f"{LABEL_SESSION}={sched.session_name}"}
        )
        == []
    )
    assert session_networks(docker_client, sched) == []
    volumes = docker_client.api.volumes(filters={"label": f"{LABEL_SESSION}={sched.session_name}"})
    assert not volumes.get("Volumes"), volumes


def test_describe_many_list_and_idempotency_key(sched: DockerScheduler) -> None:
    key = f"key-{uuid.uuid4().hex}"
    a = sched.submit(
        AppDef("a", [sh("r", "trap 'exit 143' TERM; sleep 30 & wait")]), {}, idempotency_key=key
    )
    b = sched.submit(AppDef("b", [sh("r", "exit 0", num_replicas=2)]), {})
    assert wait_terminal(sched, b).state == AppState.SUCCEEDED

    many = sched.describe_many([a, b, "nope-123"])
    assert many["nope-123"] is None
    assert many[a] is not None and many[a].state in (AppState.PENDING, AppState.RUNNING)
    assert many[b] is not None and many[b].state == AppState.SUCCEEDED
    assert sorted(replicas(many[b])) == ["r/0", "r/1"]
    assert {x.app_id for x in sched.list()} == {a, b}
    assert sched.describe("nope-123") is None
    assert not sched.exists("nope-123")

    assert sched.find_by_idempotency_key(key) == a
    assert sched.find_by_idempotency_key("another-key") is None
    sched.cancel(a)
    assert sched.find_by_idempotency_key(key) == a  # still found: it was submitted
    assert sched.describe_many([a, b])[a].state == AppState.CANCELLED  # type: ignore[union-attr]

    # a session only lists its own apps
    other = create_scheduler(f"{sched.session_name}-other")
    assert other.list() == []
    other.close()


def test_runner_runs_waits_and_reattaches_by_idempotency_key(sched: DockerScheduler) -> None:
    key = f"key-{uuid.uuid4().hex}"
    app = AppDef("viarunner", [sh("r", "echo hello from $SHIPYARD_ROLE_NAME")])
    with get_runner(sched.session_name) as runner:
        handle = runner.run(app, "local_docker", idempotency_key=key)
        again = runner.run(app, "local_docker", idempotency_key=key)
        assert again == handle
        status = runner.wait(handle, wait_interval=0.2, timeout=60)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert list(runner.log_lines(handle, "r")) == ["hello from r\n"]
        assert [str(line) for line in runner.stream_logs(handle)] == ["r/0 hello from r"]


def test_workspace_overlay_is_visible_in_the_container(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path, built_images: set[str]
) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "data.txt").write_text("workspace content\n")
    script = ws / "run.sh"
    script.write_text("#!/bin/sh\necho running; cat pkg/data.txt\n")
    script.chmod(0o755)
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ignored\n")

    image_id = sched.build_workspace_image(IMAGE, str(ws))
    built_images.add(image_id)
    assert image_id.startswith("sha256:")
    app = AppDef("ws", [Role("main", image=IMAGE, entrypoint="./run.sh")])
    app_id = sched.submit(app, {"quiet": True}, workspace=str(ws))
    used = docker_client.api.inspect_container(f"{app_id}-main-0")["Image"]
    built_images.add(used)
    assert used != docker_client.images.get(IMAGE).id  # runs on the patched image
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "main")) == ["running\n", "workspace content\n"]
    sched.purge(app_id)

    # .git is skipped and the generated Dockerfile is not copied
    check = AppDef("check", [sh("c", "ls -a / | tr '\\n' ' '", image=image_id)])
    app_id = sched.submit(check, {})
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
    listing = "".join(sched.log_iter(app_id, "c")).split()
    assert "pkg" in listing and "run.sh" in listing
    assert ".git" not in listing and not any("Dockerfile" in n for n in listing)
    sched.purge(app_id)

    with pytest.raises(ValueError, match="not present"):
        sched.build_workspace_image("shipyard-test/nope:1", str(ws))
    with pytest.raises(ValueError, match="workspace: expected an existing directory"):
        sched.build_workspace_image(IMAGE, str(tmp_path / "missing"))


def _registry_problem() -> str | None:
    try:
        urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=3).read()
    except Exception as e:
        return f"no registry on {REGISTRY} ({e})"
    return None


def test_workspace_image_is_pushed_to_the_loopback_registry(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path, built_images: set[str]
) -> None:
    require("docker", _registry_problem())
    (tmp_path / "hello.txt").write_text("pushed\n")
    repo = f"{REGISTRY}/shipyard-test/ws-{uuid.uuid4().hex[:8]}"
    app = AppDef("push", [Role("p", image=IMAGE, entrypoint="cat", args=["hello.txt"])])
    app_id = sched.submit(app, {"image_repo": repo, "quiet": True}, workspace=str(tmp_path))
    built_images.add(docker_client.api.inspect_container(f"{app_id}-p-0")["Image"])
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "p")) == ["pushed\n"]
    desc = sched.describe(app_id)
    assert desc is not None
    pushed = desc.roles[0].image
    assert pushed.startswith(f"{repo}:")
    config = docker_client.api.inspect_container(f"{app_id}-p-0")["Config"]
    assert config["Image"] == pushed
    tag = pushed.rsplit(":", 1)[1]
    path = repo.split("/", 1)[1]
    with urllib.request.urlopen(f"http://{REGISTRY}/v2/{path}/tags/list", timeout=10) as r:
        assert json.load(r)["tags"] == [tag]
    # the registry serves the manifest; delete it again (the registry allows deletes)
    manifest = f"http://{REGISTRY}/v2/{path}/manifests/{tag}"
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}
    head = urllib.request.Request(manifest, method="HEAD", headers=accept)
    with urllib.request.urlopen(head, timeout=10) as r:
        digest = r.headers["Docker-Content-Digest"]
    assert digest.startswith("sha256:")
    delete = urllib.request.Request(
        f"http://{REGISTRY}/v2/{path}/manifests/{digest}", method="DELETE"
    )
    with urllib.request.urlopen(delete, timeout=10) as r:
        assert r.status == 202
