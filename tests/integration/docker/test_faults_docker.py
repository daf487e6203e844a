"""The Docker engine restarted while a job runs: describe never lies during the outage and reports
the right states afterwards; a waiter and log followers started before the outage take it as
passing (the end, each line once); the ended app's network is freed; jobs submitted after the
restart work.

The test runs its own ``dockerd`` (own socket, data root, containerd namespace; started and
stopped by the test, by pid), so the engine the other tests use is never touched. The test image
is copied into it with ``docker save | docker load`` (nothing is pulled). Two engine
configurations: the default one (the engine stops running containers when it stops) and
``--live-restore`` (they keep running through the restart).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.api import Stream
from core.specs import AppDef, AppState, BindMount, Role, is_terminal
from tests.helpers import wait_until

IMAGE = os.environ.get("SHIPYARD_TEST_IMAGE", "shipyard-test/busybox:latest")


class PrivateDockerd:
    """A dockerd of the test's own; ``stop()``/``start()`` restart it with the same state."""

    def __init__(self, root: Path, live_restore: bool, extra: tuple[str, ...] = ()) -> None:
        self.root = root
        self.sock = f"unix://{root}/d.sock"
        self.pidfile = root / "d.pid"
        # containerd namespaces allow single separators only; mkdtemp names may have "-_"
        ns = f"shipyard-fault-{os.getpid()}-{re.sub('[^A-Za-z0-9]', '', root.name)}"
        # Own network namespace: this dockerd's bridge must not replace the host engine's docker0
        # (`--bridge=none` deletes it). unshare execs dockerd, so self.proc is dockerd itself.
        self.cmd = [
            "unshare", "--net", "--",
            "dockerd", "--host", self.sock, "--data-root", str(root / "data"),
            "--exec-root", str(root / "x"), "--pidfile", str(self.pidfile),
            "--iptables=false", "--ip-forward=false",
            "--containerd-namespace", ns, "--containerd-plugins-namespace", ns + "-p",
        ] + (["--live-restore"] if live_restore else []) + list(extra)  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def _ping(self) -> bool:
        p = subprocess.run(["docker", "-H", self.sock, "info"], capture_output=True, timeout=30)
        return p.returncode == 0

    def start(self) -> None:
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        wait_until(self._ping, 60, "the private dockerd to answer")

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.proc = None


@pytest.fixture(params=["default", "live-restore"])
def engine(request: pytest.FixtureRequest, docker_client: Any) -> Iterator[PrivateDockerd]:
    with private_dockerd(live_restore=request.param == "live-restore") as d:
        yield d


@contextlib.contextmanager
def private_dockerd(
    live_restore: bool = False, extra: tuple[str, ...] = ()
) -> Iterator[PrivateDockerd]:
    """A private engine with the test image loaded; everything it ran is removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        pytest.skip("a private dockerd needs root and the dockerd binary")
    # short path: containerd's sockets live under the exec root (unix socket paths <= 108 bytes)
    root = Path(tempfile.mkdtemp(prefix="sy-dk-", dir="/tmp"))
    d = PrivateDockerd(root, live_restore=live_restore, extra=extra)
    d.start()
    try:
        save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "-H", d.sock, "load", "-q"], stdin=save.stdout,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert save.wait(timeout=60) == 0
        assert load.returncode == 0, load.stderr
        yield d
    finally:
        if d.proc is None:
            d.start()  # to remove what the test left
        subprocess.run(
            ["sh", "-c", f'ids=$(docker -H {d.sock} ps -aq); [ -z "$ids" ] || docker -H {d.sock} rm -f $ids'],
            capture_output=True, timeout=120,
        )  # fmt: skip
        d.stop()
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Unmounts what dockerd left mounted under ``root`` (its data root is a bind mount)."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


@pytest.fixture
def runner(engine: PrivateDockerd, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.setenv("DOCKER_HOST", engine.sock)
    with get_runner("dfault") as r:
        yield r


def _app(name: str, script: str, shared: Path) -> AppDef:
    return AppDef(
        name,
        [Role("w", image=IMAGE, entrypoint="sh", args=["-c", script, "${replica_id}"],
              num_replicas=2, mounts=[BindMount(str(shared), "/x")])],
    )  # fmt: skip


def test_dockerd_restart_while_a_job_runs(
    engine: PrivateDockerd, runner: Runner, tmp_path: Path
) -> None:
    live = "--live-restore" in engine.cmd
    # `done` finishes before the restart; `job` runs through it (until /x/go appears)
    done = runner.run(_app("before", 'echo "done $0"', tmp_path), "local_docker")
    job = runner.run(
        _app("through", 'echo "up $0"; touch /x/up.$0; while [ ! -e /x/go ]; do sleep 0.1; done;'
             ' echo "finished $0"', tmp_path),
        "local_docker",
    )  # fmt: skip
    st = runner.wait(done, wait_interval=0.2, timeout=120)
    assert st is not None and st.state == AppState.SUCCEEDED
    wait_until(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists(), what="up")
    assert runner.status(job).state == AppState.RUNNING  # type: ignore[union-attr]
    # a waiter and a follower of each replica, through the outage
    waited: dict[str, Any] = {}
    followed: dict[int, Any] = {}
    threads = [threading.Thread(target=_wait_into, args=(runner, job, waited))] + [
        threading.Thread(target=_follow_into, args=(runner, job, k, followed)) for k in (0, 1)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: all(followed.get(k) == [f"up {k}\n"] for k in (0, 1)), what="following")

    engine.stop()
    # engine down: describe fails loudly, it does not say "no such app" or a made-up state
    for handle in (done, job):
        try:
            st = runner.status(handle)
        except Exception as e:  # the engine is unreachable: an error is the honest answer
            assert "connect" in str(e).lower() or "connection" in repr(e).lower(), repr(e)
        else:
            pytest.fail(f"describe of {handle} with the engine down answered {st}")
    engine.start()

    # afterwards: the finished app is as it was; the running one is what really happened to it
    st = runner.status(done)
    assert st is not None and st.state == AppState.SUCCEEDED and st.exit_codes() == {"w": [0, 0]}
    if live:
        st = runner.status(job)
        assert st is not None and st.state == AppState.RUNNING, st
        (tmp_path / "go").touch()
        st = runner.wait(job, wait_interval=0.2, timeout=120)
        assert (
            st is not None and st.state == AppState.SUCCEEDED and st.exit_codes() == {"w": [0, 0]}
        )
        want_lines = {0: ["up 0\n", "finished 0\n"], 1: ["up 1\n", "finished 1\n"]}
    else:
        # the engine stopped the containers when it stopped: they were killed, not successful
        st = wait_until(lambda: (s := runner.status(job)) is not None and is_terminal(s.state) and s,
                      what="the stopped job to be terminal")  # fmt: skip
        assert st.state == AppState.FAILED, st
        codes = st.exit_codes()["w"]
        assert all(c is not None and c != 0 for c in codes), codes
        want_lines = {0: ["up 0\n"], 1: ["up 1\n"]}
    for k, lines in want_lines.items():
        assert list(runner.log_lines(job, "w", k, streams=Stream.STDOUT)) == lines
    for t in threads:
        t.join(120)
    # the waiter and the followers took the outage as passing: the end, each line once
    assert waited.get("status") is not None, waited
    assert (waited["status"].state, waited["status"].exit_codes()) == (st.state, st.exit_codes())
    assert followed == want_lines, followed
    # nothing left over: the ended app's network is freed, its two containers kept for its logs
    app_id = job.rsplit("/", 1)[1]
    assert _labelled(engine, "network", app_id) == []
    assert len(_labelled(engine, "container", app_id)) == 2

    # and the engine takes new jobs
    again = runner.run(_app("after", 'echo "after $0"', tmp_path), "local_docker")
    st = runner.wait(again, wait_interval=0.2, timeout=120)
    assert st is not None and st.state == AppState.SUCCEEDED
    for h in (done, job, again):
        runner.cancel(h)


def _wait_into(runner: Runner, handle: str, out: dict[str, Any]) -> None:
    try:
        out["status"] = runner.wait(handle, wait_interval=0.2, timeout=240)
    except Exception as e:  # noqa: BLE001 - looked at by the test
        out["error"] = e


def _follow_into(runner: Runner, handle: str, k: int, out: dict[int, Any]) -> None:
    out[k] = lines = []
    try:
        for line in runner.log_lines(handle, "w", k, should_tail=True, streams=Stream.STDOUT):
            lines.append(line)
    except Exception as e:  # noqa: BLE001 - looked at by the test
        out[k] = e


def _labelled(engine: PrivateDockerd, kind: str, app_id: str) -> list[str]:
    """The ids of the engine's ``kind`` (container, network, volume) labelled with ``app_id``."""
    ls = ["ps", "-a"] if kind == "container" else [kind, "ls"]
    p = subprocess.run(
        ["docker", "-H", engine.sock, *ls, "-q", "--filter", f"label=shipyard.app_id={app_id}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return p.stdout.split()
