"""Time limits on the real Docker engine (issue 27): each replica runs under the script of
``core.schedulers.docker.timelimit``, which sends the checkpoint signal ``checkpoint_grace``
seconds before the limit, SIGTERM at it, and with ``requeue_on_timeout`` starts the command
again as the next attempt, in the same container, with the same checkpoint volume.

The replica is a training-like loop: one line per step done, its counter saved to
``$SHIPYARD_CHECKPOINT_DIR`` on the checkpoint signal, after which it does no more work until
the limit ends it; the next attempt resumes from the counter. It does at most 25 steps an
attempt, so that 60 steps take three attempts however loaded the machine is."""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.runner import Runner
from core.schedulers.docker_scheduler import DockerScheduler, create_scheduler
from core.specs import AppDef, AppState, Role
from tests.helpers import TRAINING, TRAINING_STEPS, wait_until
from tests.integration.local.test_cli import SHIPYARD

IMAGE = "shipyard-test/busybox:latest"


@pytest.fixture
def sched(docker_client: Any) -> Iterator[DockerScheduler]:
    """A scheduler on a session of its own; its apps are purged afterwards."""
    docker_client.images.get(IMAGE)
    scheduler = create_scheduler(f"pytest-{uuid.uuid4().hex[:8]}")
    yield scheduler
    for app in scheduler.list():
        scheduler.purge(app.app_id)
    scheduler.close()


def _run(sched: DockerScheduler, cfg: dict[str, Any], script: str = TRAINING) -> str:
    runner = Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})
    app = AppDef("train", [Role("train", image=IMAGE, entrypoint="sh", args=["-c", script])])
    handle = runner.run(app, "local_docker", {"stop_timeout": 2, **cfg})
    runner.wait(handle, wait_interval=0.2)
    return handle


def _lines(sched: DockerScheduler, handle: str) -> list[str]:
    runner = Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})
    return [x.rstrip("\n") for x in runner.log_lines(handle, "train", 0)]


def _status_json(handle: str) -> dict[str, Any]:
    """``shipyard status --json`` of the app, as a user runs it."""
    p = subprocess.run([SHIPYARD, "status", "--json", handle], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def _volume_file(docker_client: Any, volume: str, name: str) -> str:
    out = docker_client.containers.run(
        IMAGE, ["cat", f"/c/{name}"], volumes={volume: {"bind": "/c"}}, remove=True
    )
    return out.decode().strip()  # type: ignore[no-any-return]


def test_requeued_at_its_time_limit_it_resumes_and_does_every_step_once(
    sched: DockerScheduler, docker_client: Any
) -> None:
    cfg = {
        "time_limit": "6s",
        "checkpoint_signal": "USR1",
        "checkpoint_grace": 3,
        "max_requeues": 2,
        "requeue_on_timeout": True,
    }
    handle = _run(sched, cfg)
    status = _status_json(handle)
    assert status["state"] == "SUCCEEDED", status
    assert [(a["number"], a["reason"]) for a in status["attempts"]] == [
        (0, "timeout"),
        (1, "timeout"),
    ]
    lines = _lines(sched, handle)
    assert [int(x.split()[1]) for x in lines if x.startswith("step ")] == list(
        range(TRAINING_STEPS)
    )
    starts = [x.split()[1:] for x in lines if x.startswith("start ")]
    assert starts == [["0", "0"], ["1", "25"], ["2", "50"]], lines
    assert lines[-1] == "finished"
    # the signal came checkpoint_grace seconds before the SIGTERM of the limit, each attempt
    usr1 = [int(x.split()[2]) for x in lines if x.startswith("usr1 ")]
    term = [int(x.split()[2]) for x in lines if x.startswith("term ")]
    assert len(usr1) == len(term) == 2, lines
    assert all(2 <= t - u <= 4 for u, t in zip(usr1, term, strict=True)), lines
    assert sum("shipyard: attempt" in x for x in lines) == 2
    app_id = handle.rsplit("/", 1)[1]
    assert _volume_file(docker_client, f"{app_id}-checkpoint", "counter") == str(TRAINING_STEPS)


def test_over_its_time_limit_without_requeue_it_ends_timeout_after_the_signal(
    sched: DockerScheduler,
) -> None:
    cfg = {"time_limit": "4s", "checkpoint_signal": "USR1", "checkpoint_grace": 2}
    handle = _run(sched, cfg)
    status = _status_json(handle)
    assert status["state"] == "FAILED" and status["reason"] == "timeout", status
    replica = status["roles"][0]["replicas"][0]
    assert replica["reason"] == "timeout" and replica["exit_code"] == 124
    assert "reached its time limit of 4s" in status["msg"]
    assert status["attempts"] == []
    lines = _lines(sched, handle)
    assert [x.split()[:2] for x in lines if x.split()[0] in ("usr1", "term")] == [
        ["usr1", "0"],
        ["term", "0"],
    ], lines


def test_a_time_limited_replica_is_retried_by_its_script_and_cancelled_by_docker_stop(
    sched: DockerScheduler,
) -> None:
    fail_once = 'echo "try $SHIPYARD_ATTEMPT"; [ "$SHIPYARD_ATTEMPT" = 1 ] || exit 3'
    runner = Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})
    role = Role("train", image=IMAGE, entrypoint="sh", args=["-c", fail_once], max_retries=2)
    handle = runner.run(AppDef("retry", [role]), "local_docker", {"time_limit": "1h"})
    status = runner.wait(handle, wait_interval=0.1)
    assert status is not None and status.state == AppState.SUCCEEDED
    assert status.num_restarts == 1
    assert [(a.number, a.reason) for a in status.attempts] == [(0, "exit_code")]
    sleeper = Role("train", image=IMAGE, entrypoint="sleep", args=["600"])
    handle = runner.run(AppDef("stop", [sleeper]), "local_docker", {"time_limit": "1h"})
    wait_until(lambda: (runner.status(handle) or status).state == AppState.RUNNING)
    runner.cancel(handle)
    status = runner.wait(handle, wait_interval=0.1)
    assert status is not None and status.state == AppState.CANCELLED


def test_an_image_entrypoint_still_runs_the_command_under_a_time_limit(
    sched: DockerScheduler, docker_client: Any
) -> None:
    dockerfile = f'FROM {IMAGE}\nENTRYPOINT ["sh", "-c"]\n'
    docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag="shipyard-test/limit-ep:latest", rm=True
    )
    runner = Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})
    role = Role(
        "train", image="shipyard-test/limit-ep:latest", entrypoint="echo attempt=$SHIPYARD_ATTEMPT"
    )
    handle = runner.run(AppDef("ep", [role]), "local_docker", {"time_limit": "1h"})
    status = runner.wait(handle, wait_interval=0.1)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert [x.rstrip("\n") for x in runner.log_lines(handle, "train", 0)] == ["attempt=0"]


def test_preflight_names_an_image_without_a_shell_for_a_time_limit(
    sched: DockerScheduler, docker_client: Any
) -> None:
    docker_client.images.build(
        fileobj=io.BytesIO(b'FROM scratch\nCMD ["/run"]\n'),
        tag="shipyard-test/no-shell:latest",
        rm=True,
    )
    runner = Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})
    app = AppDef("bare", [Role("w", image="shipyard-test/no-shell:latest", entrypoint="/run")])
    problems = runner.preflight(app, "local_docker", {"pull": "never", "time_limit": "1h"})
    assert [p.field for p in problems if "/bin/sh" in p.message] == ["roles[0].image"], problems
    assert not any(
        "/bin/sh" in p.message for p in runner.preflight(app, "local_docker", {"pull": "never"})
    )


def test_the_checkpoint_volume_and_attempts_outlive_the_containers_until_record_retention(
    sched: DockerScheduler, docker_client: Any
) -> None:
    script = 'echo "$SHIPYARD_ATTEMPT" >>"$SHIPYARD_CHECKPOINT_DIR/seen"; sleep 300'
    cfg = {"time_limit": "2s", "max_requeues": 1, "requeue_on_timeout": True, "retention": 0}
    kept = _run(sched, cfg, script)
    gone = _run(sched, {**cfg, "record_retention": 0}, script)
    sched.sweep()  # (retention 0: logs archived, containers removed)
    sched.sweep()  # (record_retention 0: the records go too)
    runner = Runner(sched.session_name, {"local_docker": lambda session, **kw: sched})
    status = runner.status(kept)
    assert status is not None and "containers and network removed" in status.msg, status
    assert (status.state, status.reason) == (AppState.FAILED, "timeout")
    assert [(a.number, a.reason) for a in status.attempts] == [(0, "timeout")]
    kept_id, gone_id = kept.rsplit("/", 1)[1], gone.rsplit("/", 1)[1]
    assert _volume_file(docker_client, f"{kept_id}-checkpoint", "seen").split() == ["0", "1"]
    assert runner.status(gone) is None
    assert not docker_client.api.volumes(filters={"name": f"{gone_id}-checkpoint"})["Volumes"]
