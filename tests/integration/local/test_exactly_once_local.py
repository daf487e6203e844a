"""Exactly once, nothing lost, on the local scheduler: racing submitters with one idempotency
key, a submitter SIGKILLed at any instant, pid reuse, state directories that are not the user's
alone, a log disk filling while the app runs, a command line over the system's limit, and very
long lines while following. Real processes throughout; each case failed before the local
backend was rebuilt (see docs/reliability.md)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.runner import Runner, get_runner
from core.schedulers.local.appdir import AppDir, UnsafeStateError
from core.schedulers.local.processes import MARKER_ENV, proc_stat
from core.schedulers.local_scheduler import state_dir
from core.specs import AppDef, AppState, Role, parse_app_handle
from tests.helpers import ROOT, wait_until
from tests.integration.local.test_faults_local import _fill_up, tiny_tmpfs  # noqa: F401 (a fixture)

PY = sys.executable


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner("once") as r:
        yield r


def _marked(prefix: str) -> dict[str, list[int]]:
    """Live processes carrying the replica marker of apps whose id starts with ``prefix``,
    by app id."""
    found: dict[str, list[int]] = {}
    needle = f"{MARKER_ENV}={prefix}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st is None or st[0] in ("Z", "X"):
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(needle):
                app_id = var.split(b"=", 1)[1].rsplit(b":", 1)[0].decode()
                found.setdefault(app_id, []).append(int(name))
    return found


SUBMIT = """
import json, os, sys
from core.runner import get_runner
from core.specs import AppDef, Role
name, key, marker, gate = sys.argv[1:5]
app = AppDef(name, [Role("w", entrypoint="sh", args=["-c", f"echo $$ >> {marker}; sleep 30"],
                         num_replicas=2)])
with get_runner("once") as runner:
    if gate:
        open(f"{gate}.ready.{os.getpid()}", "w").close()
        while not os.path.exists(gate):
            pass
    print(runner.run(app, "local_cwd", idempotency_key=key or None), flush=True)
"""


def _submitter(name: str, key: str, marker: Path, gate: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([PY, "-c", SUBMIT, name, key, str(marker), gate],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def test_racing_submitters_with_one_key_start_one_app(tmp_path: Path, runner: Runner) -> None:
    name, key = f"race-{uuid.uuid4().hex[:8]}", f"airflow:d:r:t:-1:{uuid.uuid4().hex}"
    marker, gate = tmp_path / "ran", tmp_path / "go"
    procs = [_submitter(name, key, marker, str(gate)) for _ in range(6)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == len(procs), 60, "the submitters")
    gate.touch()
    handles = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        handles.append(out.strip())
    assert len(set(handles)) == 1, handles
    app_id = parse_app_handle(handles[0]).app_id
    wait_until(lambda: marker.exists() and len(marker.read_text().split()) == 2, what="2 replicas")
    assert list(_marked(name)) == [app_id]  # one app's processes, none of another
    assert [a for a in os.listdir(state_dir()) if a.startswith(name)] == [app_id]
    assert runner.find("local_cwd", key) == handles[0]
    runner.cancel(handles[0])
    assert runner.wait(handles[0], timeout=30).state == AppState.CANCELLED  # type: ignore[union-attr]


def test_a_submitter_killed_at_any_instant_leaves_nothing_unrecorded(
    tmp_path: Path, runner: Runner
) -> None:
    rng = random.Random(1234)
    name = f"kill-{uuid.uuid4().hex[:8]}"
    recorded = 0
    for i in range(30):
        key = f"{name}-key-{i}"
        marker = tmp_path / f"ran-{i}"
        p = _submitter(f"{name}-{i}", key, marker)
        wait_until(lambda p=p: Path(f"/proc/{p.pid}").exists(), what="the submitter")
        time.sleep(rng.uniform(0.15, 0.45))  # (an instant of its submit: it imports ~0.2 s)
        p.kill()
        p.communicate()
        apps = _marked(f"{name}-{i}-")
        for app_id in apps:  # whatever runs is an app every process sees
            desc = runner.status(f"local_cwd://once/{app_id}")
            assert desc is not None, f"{app_id} runs without a record"
            assert app_id in {a.app_id for a in runner.list("local_cwd")}
            recorded += 1
        # the retry with the same key: re-attaches, or starts the one and only app
        handle = runner.run(
            AppDef(f"{name}-{i}", [Role("w", entrypoint="sh",
                                        args=["-c", f"echo $$ >> {marker}; sleep 30"],
                                        num_replicas=2)]),
            "local_cwd", idempotency_key=key,
        )  # fmt: skip
        if apps:
            assert parse_app_handle(handle).app_id in apps
        wait_until(lambda m=marker: m.exists() and len(m.read_text().split()) >= 2, what="replicas")
        assert len(_marked(f"{name}-{i}-")) == 1  # never a second copy
        assert len(marker.read_text().split()) == 2  # each replica's command ran once
        runner.cancel(handle)


PAUSED = """
import os, sys, time
from core.runner import get_runner
from core.schedulers.local.appdir import AppDir
from core.schedulers.local.spawn import Gate
from core.specs import AppDef, Role
name, key, marker, where = sys.argv[1:5]
target = (AppDir, "write_record") if where == "record" else (Gate, "open")
real = getattr(*target)
def paused(self, *args):
    open(marker + ".paused", "w").close()  # the replicas are spawned, at the gate
    time.sleep(60)  # (killed here)
    return real(self, *args)
setattr(*target, paused)
app = AppDef(name, [Role("w", entrypoint="sh", args=["-c", f"echo $$ >> {marker}; sleep 30"],
                         num_replicas=2)])
with get_runner("once") as runner:
    runner.run(app, "local_cwd", idempotency_key=key)
"""


@pytest.mark.parametrize("where", ["record", "gate"])
def test_a_submitter_killed_before_and_after_recording(
    where: str, tmp_path: Path, runner: Runner
) -> None:
    """Killed with the replicas spawned but the app not recorded yet, nothing runs and the
    retry starts the one and only app; killed once it is recorded (the replicas still at the
    start gate), the app runs and every process sees it."""
    name, key = f"paused-{where}-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    marker = tmp_path / "ran"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([PY, "-c", PAUSED, name, key, str(marker), where], env=env)
    wait_until(lambda: Path(f"{marker}.paused").exists(), 60, "the submitter to pause")
    p.kill()
    p.wait()
    if where == "record":
        wait_until(lambda: not _marked(name), what="the unrecorded replicas to exit")
        assert not marker.exists(), "a replica ran its command without a record"
        assert not [a for a in runner.list("local_cwd") if a.app_id.startswith(name)]
    else:
        apps = wait_until(lambda: _marked(name), what="the recorded app's replicas")
        wait_until(
            lambda: marker.exists() and len(marker.read_text().split()) == 2, what="replicas"
        )
        assert [a.app_id for a in runner.list("local_cwd") if a.app_id.startswith(name)] == list(
            apps
        )
    retry = runner.run(AppDef(name, [Role("w", entrypoint="sh", args=["-c", f"echo $$ >> {marker}; sleep 30"],
                                          num_replicas=2)]), "local_cwd", idempotency_key=key)  # fmt: skip
    wait_until(lambda: marker.exists() and len(marker.read_text().split()) == 2, what="2 replicas")
    assert list(_marked(name)) == [parse_app_handle(retry).app_id]
    runner.cancel(retry)


def _reuse_pid(pid: int, tries: int = 50) -> subprocess.Popen[bytes] | None:
    """Starts an unrelated ``sleep`` under ``pid`` (root: the kernel hands out the pid after
    the one written to ns_last_pid), or None if another process took it first."""
    for _ in range(tries):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        p = subprocess.Popen(["sleep", "60"])
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def test_a_reused_pid_is_never_reported_nor_signalled(runner: Runner, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("forcing pid reuse writes /proc/sys/kernel/ns_last_pid (root)")
    app = AppDef(
        "reuse", [Role("quick", entrypoint="true"), Role("slow", entrypoint="sleep", args=["30"])]
    )
    handle = runner.run(app, "local_cwd")
    app_id = parse_app_handle(handle).app_id
    record = AppDir(state_dir(), app_id).read_record()
    assert record is not None
    quick = record.replica("quick", 0)
    assert quick is not None
    wait_until(
        lambda: proc_stat(quick.pid) is None, what="the quick replica's wrapper to be reaped"
    )
    stranger = _reuse_pid(quick.pid)
    if stranger is None:
        pytest.fail(f"could not get pid {quick.pid} again")
    try:
        status = runner.status(handle)
        assert status is not None
        states = {rs.role: rs.replicas[0].state for rs in status.roles}
        assert states == {"quick": AppState.SUCCEEDED, "slow": AppState.RUNNING}  # recorded wins
        runner.cancel(handle)
        assert runner.wait(handle, timeout=30).state == AppState.CANCELLED  # type: ignore[union-attr]
        assert stranger.poll() is None, "cancel signalled a process that is not a replica"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_state_dir_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "local").mkdir(mode=0o777)
    os.chmod(shared / "local", 0o777)
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(shared))
    app = AppDef("shared", [Role("w", entrypoint="true")])
    with get_runner("once") as runner, pytest.raises(UnsafeStateError) as e:
        runner.run(app, "local_cwd")
    assert "writable by others" in str(e.value) and str(shared / "local") in str(e.value)
    assert os.listdir(shared / "local") == []  # nothing was made, nothing started


def test_a_swapped_app_directory_is_refused_and_nothing_is_signalled(
    tmp_path: Path, runner: Runner
) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing the directory to another user needs root")
    victim = subprocess.Popen(["sleep", "60"])
    handle = runner.run(AppDef("swap", [Role("w", entrypoint="sleep", args=["30"])]), "local_cwd")
    app = AppDir(state_dir(), parse_app_handle(handle).app_id)
    try:
        # another user's copy of the directory, whose record names the victim's process
        text = json.loads((Path(app.path) / "app.json").read_text())
        real = dict(text["replicas"][0])
        st = proc_stat(victim.pid)
        assert st is not None
        text["replicas"][0].update(pid=victim.pid, start_ticks=st[4])
        (Path(app.path) / "app.json").write_text(json.dumps(text))
        os.chown(app.path, 65534, 65534)
        fresh = get_runner("other")
        with pytest.raises(UnsafeStateError, match="belongs to uid 65534"):
            fresh.status(handle)
        with pytest.raises(UnsafeStateError):
            fresh.cancel(handle)
        assert victim.poll() is None
        os.chown(app.path, 0, 0)
        os.chmod(app.path, 0o777)
        with pytest.raises(UnsafeStateError, match="writable by others"):
            fresh.cancel(handle)
        assert victim.poll() is None
    finally:
        os.chmod(app.path, 0o700)
        text["replicas"][0] = real
        (Path(app.path) / "app.json").write_text(json.dumps(text))
        get_runner("other").cancel(handle)
        victim.kill()
        victim.wait()


def test_a_log_disk_that_fills_while_the_app_runs_loses_nothing_written(
    tmp_path: Path,
    tiny_tmpfs: Path,  # noqa: F811
    runner: Runner,
) -> None:
    logs = tiny_tmpfs / "logs"
    script = (
        "for i in $(seq 1 20); do echo line $i; done; echo err line >&2;"
        " while :; do echo filler-filler-filler-filler-filler || break; done"
    )
    app = AppDef("full", [Role("w", entrypoint="sh", args=["-c", script])])
    handle = runner.run(app, "local_cwd", {"log_dir": str(logs)})
    status = runner.wait(handle, timeout=60)
    assert status is not None and status.is_terminal()
    combined = list(runner.log_lines(handle, "w", 0))  # the default stream: no raw OSError
    assert combined[:20] == [f"line {i}\n" for i in range(1, 21)]
    assert "err line\n" in combined
    out = subprocess.run([str(Path(PY).with_name("shipyard")), "log", f"{handle}/w/0"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout.splitlines()[:20] == [f"w/0 line {i}" for i in range(1, 21)] or (
        out.stdout.splitlines()[:20] == [f"line {i}" for i in range(1, 21)]
    ), out.stdout[:500]
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) <= 1 and all(str(logs) in e for e in errors), out.stderr


def test_a_command_line_over_the_limit_is_a_clear_error_before_anything_starts(
    runner: Runner,
) -> None:
    before = set(os.listdir(state_dir())) if os.path.isdir(state_dir()) else set()
    huge = ["x" * 100_000] * 40  # 4 MB of arguments
    with pytest.raises(ValueError, match=r"roles\[1\].*ARG_MAX"):
        runner.run(
            AppDef("big", [Role("ok", entrypoint="true"), Role("w", entrypoint="echo", args=huge)]),
            "local_cwd",
        )
    with pytest.raises(ValueError, match=r"roles\[0\].*bytes each"):
        runner.run(
            AppDef("long", [Role("w", entrypoint="echo", args=["y" * 200_000])]), "local_cwd"
        )
    after = set(os.listdir(state_dir())) if os.path.isdir(state_dir()) else set()
    assert after - before <= {".keys"}


LONG_LINES = textwrap.dedent(
    """
    import sys, time
    for n in (1024, 16 * 1024 + 1, 1 << 20, 8 << 20):
        sys.stdout.write("%d:" % n + "x" * n + "\\n")
        sys.stdout.flush()
        time.sleep(0.05)
    sys.stdout.write("end\\n")
    """
)


def test_long_lines_arrive_whole_while_following(runner: Runner) -> None:
    app = AppDef("long", [Role("w", entrypoint=PY, args=["-c", LONG_LINES], num_replicas=2)])
    handle = runner.run(app, "local_cwd")
    want = [len(f"{n}:") + n + 1 for n in (1024, 16 * 1024 + 1, 1 << 20, 8 << 20)] + [4]
    tailed = list(runner.log_lines(handle, "w", 0, should_tail=True))
    assert [len(line) for line in tailed] == want and tailed[-1] == "end\n"
    streamed: dict[int, list[int]] = {}
    for line in runner.stream_logs(handle):
        streamed.setdefault(line.replica, []).append(len(line.line))
    assert streamed == {0: want, 1: want}
