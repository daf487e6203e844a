"""The local scheduler across processes: apps submitted by one process are described, followed
and cancelled from others; process trees are ended whole; nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.schedulers.api import Stream
from core.schedulers.local_scheduler import LocalScheduler, create_cwd_scheduler, state_dir
from core.specs import AppDef, AppState, Role, is_terminal
from tests.helpers import PROCESS_TREE, ROOT, live_processes, pid_alive, wait_until

PY = sys.executable


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=os.environ.copy(),
    )


def submit_in_other_process(app_code: str) -> str:
    """Submits the AppDef built by ``app_code`` (defining ``app``) in a process that then exits."""
    code = f"""
        from core.schedulers.local_scheduler import create_cwd_scheduler
        from core.specs import AppDef, Role
        {textwrap.indent(textwrap.dedent(app_code), " " * 8).strip()}
        s = create_cwd_scheduler("other")
        print(s.submit(app, {{}}), flush=True)
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def describe_elsewhere(app_id: str) -> dict[str, object]:
    out = run_python(
        f"""
        import json
        from core.schedulers.local_scheduler import create_cwd_scheduler
        d = create_cwd_scheduler("third").describe({app_id!r})
        print(json.dumps(None if d is None else {{
            "state": d.state.name,
            "msg": d.msg,
            "codes": {{f"{{rs.role}}/{{r.id}}": r.exit_code for rs in d.roles_statuses for r in rs.replicas}},
            "states": {{f"{{rs.role}}/{{r.id}}": r.state.name for rs in d.roles_statuses for r in rs.replicas}},
        }}))
        """
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def sched() -> Iterator[LocalScheduler]:
    s = create_cwd_scheduler("here", grace=2.0)
    yield s
    s.close()


def test_app_of_another_process_is_described_followed_and_fails_with_its_exit_code(
    sched: LocalScheduler, tmp_path: Path
) -> None:
    trigger = tmp_path / "fail-now"
    app_id = submit_in_other_process(
        f"""
        trainer = (
            'for i in 0 1 2 3 4; do echo "trainer $SHIPYARD_REPLICA_ID tick $i"; sleep 0.05; done;'
            ' exec sleep 60'
        )
        ps = (
            'if [ "$SHIPYARD_REPLICA_ID" = 2 ]; then'
            ' while [ ! -e {trigger} ]; do sleep 0.02; done; echo failing >&2; exit 3; fi;'
            ' exec sleep 60'
        )
        app = AppDef("xproc", [
            Role("trainer", entrypoint="sh", args=["-c", trainer], num_replicas=4),
            Role("ps", entrypoint="sh", args=["-c", ps], num_replicas=4),
        ])
        """
    )
    # the submitting process has exited; the app runs on
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    assert [(rs.role, len(rs.replicas)) for rs in desc.roles_statuses] == [
        ("trainer", 4),
        ("ps", 4),
    ]
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.extend(sched.log_iter(app_id, "trainer", 1, should_tail=True))
    )
    follower.start()
    wait_until(
        lambda: len(list(sched.log_iter(app_id, "trainer", 1, streams=Stream.STDOUT))) == 5,
        what="trainer output",
    )
    assert follower.is_alive()  # following until the app ends
    trigger.touch()
    follower.join(30)
    assert not follower.is_alive()
    assert followed == [f"trainer 1 tick {i}\n" for i in range(5)]
    other = describe_elsewhere(app_id)
    assert other["state"] == "FAILED"
    assert "ps/2 exited with code 3" in str(other["msg"])
    codes = other["codes"]
    assert isinstance(codes, dict)
    assert codes["ps/2"] == 3
    assert all(code == -15 for replica, code in codes.items() if replica != "ps/2")
    assert list(sched.log_iter(app_id, "ps", 2, streams=Stream.STDERR)) == ["failing\n"]
    assert not live_processes(app_id)  # replicas and collector are gone


def test_app_of_another_process_is_cancelled_from_here(sched: LocalScheduler) -> None:
    app_id = submit_in_other_process(
        """
        app = AppDef("xcancel", [
            Role("a", entrypoint="sh", args=["-c", "echo up; exec sleep 60"], num_replicas=4),
            Role("b", entrypoint="sleep", args=["60"], num_replicas=4),
        ])
        """
    )
    wait_until(
        lambda: all(list(sched.log_iter(app_id, "a", k, streams=Stream.STDOUT)) for k in range(4)),
        what="output",
    )
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.extend(sched.log_iter(app_id, "a", 0, should_tail=True))
    )
    follower.start()
    sched.cancel(app_id)
    follower.join(30)
    assert not follower.is_alive() and followed == ["up\n"]
    other = describe_elsewhere(app_id)
    assert other["state"] == "CANCELLED"
    states = other["states"]
    assert isinstance(states, dict) and set(states.values()) == {"CANCELLED"}
    wait_until(lambda: not live_processes(app_id), what="collector exit")


def test_exit_codes_are_recorded_after_the_submitter_exited(sched: LocalScheduler) -> None:
    app_id = submit_in_other_process(
        """
        app = AppDef("later", [
            Role("r", entrypoint="sh", args=["-c", "sleep 0.5; exit $((SHIPYARD_REPLICA_ID + 4))"], num_replicas=2),
        ])
        """
    )
    wait_until(lambda: is_terminal(sched.describe(app_id).state), what="app end")  # type: ignore[union-attr]
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED
    codes = [r.exit_code for r in desc.roles_statuses[0].replicas]
    # each replica exits 4 + its id, unless the other one failed first and it was terminated
    assert codes[0] in (4, -15) and codes[1] in (5, -15) and codes != [-15, -15]
    assert any(f"r/{k} exited with code {4 + k}" in desc.msg for k in (0, 1) if codes[k] == 4 + k)
    states = [r.state for r in desc.roles_statuses[0].replicas]
    assert states == [AppState.FAILED if c > 0 else AppState.CANCELLED for c in codes]


TREE = PROCESS_TREE


def tree_app(marker: str, pids_file: Path, n: int = 2) -> AppDef:
    return AppDef(
        "tree",
        [
            Role(
                "r",
                entrypoint=PY,
                args=["-c", TREE, marker, str(pids_file) + ".${replica_id}"],
                num_replicas=n,
            )
        ],
    )


def test_cancel_ends_the_whole_process_tree(tmp_path: Path) -> None:
    marker = f"tree-{time.time_ns()}"
    s = create_cwd_scheduler("tree", grace=1.0)
    try:
        app_id = s.submit(tree_app(marker, tmp_path / "pids"), {})
        files = [tmp_path / f"pids.{k}" for k in range(2)]
        wait_until(lambda: all(f.exists() for f in files), what="grandchildren")
        pids = [int(p) for f in files for p in f.read_text().split()]
        assert all(pid_alive(p) for p in pids)
        assert len(live_processes(marker)) >= 8
        s.cancel(app_id)
        assert s.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
        # the replicas' process groups are gone when cancel returns
        assert not pid_alive(pids[0]) and not pid_alive(pids[3])
        # what left its process group is found (by its inherited marker) right after
        wait_until(lambda: not any(pid_alive(p) for p in pids), what="escaped grandchildren")
        assert live_processes(marker) == []
        wait_until(lambda: not live_processes(app_id), what="collector exit")
    finally:
        s.close()


def test_cancel_from_several_threads(sched: LocalScheduler) -> None:
    app_id = sched.submit(
        AppDef("threads", [Role("r", entrypoint="sleep", args=["60"], num_replicas=4)]), {}
    )
    errors: list[BaseException] = []

    def cancel() -> None:
        try:
            sched.cancel(app_id)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=cancel) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
    wait_until(lambda: not live_processes(app_id), what="collector exit")


SUBMIT_AND_WAIT = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # (the test's view of a hang)
from pathlib import Path
from core.schedulers.local_scheduler import create_cwd_scheduler
from core.specs import AppDef, Role
tree, marker, pids = sys.argv[1], sys.argv[2], sys.argv[3]
s = create_cwd_scheduler("victim", grace=1.0)
app = AppDef("victim", [Role("r", entrypoint=sys.executable, args=["-c", tree, marker, pids + ".${replica_id}"], num_replicas=2)])
print(s.submit(app, {}), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signalled_submitter_leaves_nothing_behind(tmp_path: Path, sig: signal.Signals) -> None:
    marker = f"victim-{time.time_ns()}"
    proc = subprocess.Popen(
        [PY, "-c", SUBMIT_AND_WAIT, TREE, marker, str(tmp_path / "pids")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        app_id = proc.stdout.readline().strip()
        files = [tmp_path / f"pids.{k}" for k in range(2)]
        wait_until(lambda: all(f.exists() for f in files), what="grandchildren")
        pids = [int(p) for f in files for p in f.read_text().split()]
        proc.send_signal(sig)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # every thread's stack to its stderr
            time.sleep(1.0)
            proc.kill()
            pytest.fail(f"no exit 60 s after {sig.name}:\n{proc.communicate()[1][-6000:]}")
        # (an exited submitter whose pipes stay open: a process it left holds them)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "SignalException" in err
    assert not any(pid_alive(p) for p in pids)
    assert live_processes(marker) == []
    assert live_processes(app_id) == []  # the collector is gone too
    s = create_cwd_scheduler("check")
    try:
        desc = s.describe(app_id)
        assert desc is not None and desc.state == AppState.CANCELLED
    finally:
        s.close()


def test_logs_survive_a_killed_collector(sched: LocalScheduler) -> None:
    script = "for i in $(seq 1 30); do echo line $i; echo err $i >&2; sleep 0.1; done"
    app_id = sched.submit(
        AppDef("orphanlogs", [Role("r", entrypoint="sh", args=["-c", script])]), {}
    )
    app_dir = os.path.join(state_dir(), app_id)
    collector = wait_until(
        lambda: [p for p, cmd in live_processes(app_dir) if "collect" in cmd], what="collector"
    )
    assert isinstance(collector, list)
    os.kill(collector[0], signal.SIGKILL)
    lines = list(sched.log_iter(app_id, "r", 0, should_tail=True))
    assert sorted(lines) == sorted(
        [f"line {i}\n" for i in range(1, 31)] + [f"err {i}\n" for i in range(1, 31)]
    )
    assert [x for x in lines if x.startswith("line")] == [f"line {i}\n" for i in range(1, 31)]
    assert sched.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]


def test_cache_size_bounds_the_finished_apps_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(tmp_path))
    s = create_cwd_scheduler("cache", cache_size=3)
    try:
        ids = []
        for _ in range(7):
            app_id = s.submit(AppDef("c", [Role("r", entrypoint="true")]), {})
            wait_until(lambda a=app_id: s.describe(a).state == AppState.SUCCEEDED, what="success")  # type: ignore[misc]
            ids.append(app_id)
        running = s.submit(AppDef("c", [Role("r", entrypoint="sleep", args=["60"])]), {})

        def kept() -> set[str]:
            return {n for n in os.listdir(tmp_path / "local") if not n.startswith(".")}

        wait_until(lambda: len(kept()) == 4, what="eviction")
        assert kept() == {*ids[-3:], running}  # the oldest finished apps went first
        assert s.describe(ids[0]) is None
        s.cancel(running)
    finally:
        s.close()


def test_cancel_right_after_submit(sched: LocalScheduler) -> None:
    marker = f"instant-{time.time_ns()}"
    for _ in range(3):
        app_id = sched.submit(
            AppDef(
                "instant",
                [Role("r", entrypoint="sh", args=["-c", "sleep 60; :", marker], num_replicas=8)],
            ),
            {},
        )
        sched.cancel(app_id)
        desc = sched.describe(app_id)
        assert desc is not None and desc.state == AppState.CANCELLED
        assert len(desc.roles_statuses[0].replicas) == 8
    wait_until(lambda: not live_processes(marker), what="no replica left")
