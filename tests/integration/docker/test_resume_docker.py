"""A keyed submit killed halfway on the Docker scheduler (the real engine), then retried with its
key: the retry creates the containers the submitter had not and starts them all, so the work
runs once and at once (before, the app read PENDING until its 60 s deadline, then FAILED).

The submitter runs in a child process that reaches the engine through a proxy of the engine's
socket (:class:`StallingProxy`); the proxy never forwards the requests the test picks (every
container create after the first, or what follows the last create), so the child is SIGKILLed
at a known point: some or all containers exist and none started."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from core.runner import get_runner
from core.schedulers.docker.model import (
    LABEL_APP_ID,
    LABEL_IDEMPOTENCY_KEY,
    REQUEST_PREFIX,
    hash_key,
)
from core.schedulers.docker_scheduler import DockerScheduler, create_scheduler
from core.specs import AppDef, AppState, BindMount, Role
from tests.helpers import ROOT, wait_until

pytestmark = pytest.mark.docker

IMAGE = "shipyard-test/busybox:latest"
ENGINE_SOCKET = "/var/run/docker.sock"
REPLICAS = 3
CFG = {"stop_timeout": 1}
_CREATE = re.compile(r"^POST \S*/containers/create[ ?]")
_START = re.compile(r"^POST \S*/containers/[^/ ]+/start[ ?]")
_TAKE = re.compile(rf"^DELETE \S*/volumes/{REQUEST_PREFIX}")


class StallingProxy:
    """A Unix socket in front of the engine's: each request is forwarded and its answer relayed
    back, except those ``stall`` picks (by request line): they are never forwarded, and their
    sender waits for an answer for ever."""

    def __init__(self, path: str, stall: Callable[[str], bool]) -> None:
        self.path = path
        self.stalled: list[str] = []
        self._stall = stall
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._server = self._track(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        self._server.bind(path)
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stops relaying; the stalled requests are dropped, never forwarded."""
        self._closed.set()
        with self._lock:
            for s in self._sockets:
                s.close()

    def _track(self, s: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(s)
        return s

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(self._track(client),), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        engine = self._track(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        engine.connect(ENGINE_SOCKET)
        threading.Thread(target=_relay, args=(engine, client), daemon=True).start()
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                headers = head.decode("latin-1").split("\r\n")
                assert not any(h.lower().startswith("transfer-encoding") for h in headers)
                length = next(
                    (
                        int(h.split(":", 1)[1])
                        for h in headers
                        if h.lower().startswith("content-length")
                    ),
                    0,
                )
                while len(buf) < length:
                    buf += client.recv(65536)
                body, buf = buf[:length], buf[length:]
                with self._lock:
                    stall = self._stall(headers[0])
                    if stall:
                        self.stalled.append(headers[0])
                if stall:
                    self._closed.wait()
                    return
                engine.sendall(head + b"\r\n\r\n" + body)
        except OSError:
            return
        finally:
            engine.close()


def _relay(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        dst.close()


def stall_creates_after_the_first() -> Callable[[str], bool]:
    """Forwards the first container create only, and no start."""
    creates: list[str] = []

    def stall(line: str) -> bool:
        if _CREATE.match(line):
            creates.append(line)
            return len(creates) > 1
        return bool(_START.match(line))

    return stall


def stall_before_starting() -> Callable[[str], bool]:
    """Forwards every container create, not the removal of the saved request that comes next
    (whoever removes it starts the containers), and no start."""
    return lambda line: bool(_TAKE.match(line) or _START.match(line))


SUBMIT = textwrap.dedent(
    """
    import sys
    from tests.integration.docker.test_resume_docker import records_app
    from core.runner import get_runner
    session, key, out = sys.argv[1:4]
    with get_runner(session) as runner:
        runner.run(records_app(out), "local_docker", {"stop_timeout": 1}, idempotency_key=key)
    """
)


def records_app(out: str | Path) -> AppDef:
    """Each replica appends a line to its own file of ``out`` (a bind mount) each time it runs."""
    script = "echo ran >> /out/$SHIPYARD_REPLICA_ID"
    mount = BindMount(str(out), "/out")
    role = Role(
        "w", IMAGE, entrypoint="sh", args=["-c", script], num_replicas=REPLICAS, mounts=[mount]
    )
    return AppDef("resume", [role])


def runs(out: Path) -> dict[str, int]:
    """How many times each replica ran."""
    return {f.name: len(f.read_text().splitlines()) for f in sorted(out.iterdir())}


def key_containers(api: Any, key: str) -> list[dict[str, Any]]:
    return api.containers(all=True, filters={"label": f"{LABEL_IDEMPOTENCY_KEY}={hash_key(key)}"})


@pytest.fixture
def sched(docker_client: Any) -> Iterator[DockerScheduler]:
    session = f"resume-{uuid.uuid4().hex[:8]}"
    scheduler = create_scheduler(session)
    yield scheduler
    for app in scheduler.list():
        scheduler.purge(app.app_id)
    scheduler.close()


def kill_submit_halfway(
    session: str, key: str, out: Path, stall: Callable[[str], bool], api: Any, created: int
) -> str:
    """Runs the keyed submit in a child process that reaches the engine through a
    :class:`StallingProxy`, SIGKILLs it once it waits on a stalled request with ``created``
    containers made, and returns the id of the app it left (none of its containers started)."""
    with tempfile.TemporaryDirectory(prefix="sy-proxy-") as tmp:
        proxy = StallingProxy(f"{tmp}/engine.sock", stall)
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", SUBMIT, session, key, str(out)],
                cwd=ROOT,
                env={**_environ(), "DOCKER_HOST": f"unix://{proxy.path}"},
            )
            try:
                wait_until(
                    lambda: proxy.stalled and len(key_containers(api, key)) == created,
                    60,
                    f"the submitter to stall with {created} container(s) created",
                )
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
        finally:
            proxy.close()
    left = key_containers(api, key)
    assert len(left) == created and {c["State"] for c in left} == {"created"}, left
    assert runs(out) == {}
    return str(left[0]["Labels"][LABEL_APP_ID])


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}


@pytest.mark.parametrize(
    ("stall", "created"),
    [(stall_creates_after_the_first, 1), (stall_before_starting, REPLICAS)],
    ids=["killed-after-its-first-create", "killed-after-its-last-create"],
)
def test_a_keyed_retry_completes_a_submit_killed_halfway(
    sched: DockerScheduler,
    docker_client: Any,
    tmp_path: Path,
    stall: Callable[[], Callable[[str], bool]],
    created: int,
) -> None:
    key = f"resume-{uuid.uuid4().hex}"
    app_id = kill_submit_halfway(
        sched.session_name, key, tmp_path, stall(), docker_client.api, created
    )
    with get_runner(sched.session_name) as runner:
        sub = runner.attach_or_submit(records_app(tmp_path), "local_docker", CFG, key=key)
        assert sub.attached and sub.handle == f"local_docker://{sched.session_name}/{app_id}"
        status = runner.wait(sub.handle, timeout=120)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert runs(tmp_path) == {str(i): 1 for i in range(REPLICAS)}
    assert len(key_containers(docker_client.api, key)) == REPLICAS


def test_racing_keyed_retries_complete_it_once(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path
) -> None:
    key = f"resume-{uuid.uuid4().hex}"
    app_id = kill_submit_halfway(
        sched.session_name, key, tmp_path, stall_creates_after_the_first(), docker_client.api, 1
    )
    barrier = threading.Barrier(3)

    def retry(_: int) -> str:
        with get_runner(sched.session_name) as runner:  # (a scheduler of its own)
            barrier.wait()
            return runner.run(records_app(tmp_path), "local_docker", CFG, idempotency_key=key)

    with ThreadPoolExecutor(3) as pool:
        handles = set(pool.map(retry, range(3)))
    assert handles == {f"local_docker://{sched.session_name}/{app_id}"}
    with get_runner(sched.session_name) as runner:
        status = runner.wait(handles.pop(), timeout=120)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert runs(tmp_path) == {str(i): 1 for i in range(REPLICAS)}
    assert len(key_containers(docker_client.api, key)) == REPLICAS


def test_a_cancelled_half_submitted_app_is_not_completed(
    sched: DockerScheduler, docker_client: Any, tmp_path: Path
) -> None:
    key = f"resume-{uuid.uuid4().hex}"
    app_id = kill_submit_halfway(
        sched.session_name, key, tmp_path, stall_creates_after_the_first(), docker_client.api, 1
    )
    handle = f"local_docker://{sched.session_name}/{app_id}"
    with get_runner(sched.session_name) as runner:
        runner.cancel(handle)
        assert runner.run(records_app(tmp_path), "local_docker", CFG, idempotency_key=key) == handle
        status = runner.status(handle)
    assert status is not None and status.state == AppState.CANCELLED, status
    assert key_containers(docker_client.api, key) == []
    assert runs(tmp_path) == {}
