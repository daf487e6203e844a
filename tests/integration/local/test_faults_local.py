"""Faults on the local scheduler: the submitting process SIGKILLed mid-run, replicas and their
wrappers killed by signals from outside, and log directories that are unwritable or full.

All with real processes; apps are addressed afterwards from new runners and new processes, as a
retried Airflow task or the CLI would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.api import Stream
from core.specs import AppDef, AppState, Role, is_terminal, parse_app_handle
from tests.helpers import ROOT, pid_alive, wait_until

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def procs_with(token: str) -> list[int]:
    """Pids of live processes whose command line contains ``token``."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if token.encode() in cmd and pid_alive(int(d)):
            found.append(int(d))
    return found


@pytest.fixture
def runner() -> Iterator[Runner]:
    """A runner that cancels, at teardown, every app the test ran through it."""
    with get_runner("faults") as r:
        launched: list[str] = []
        run = r.run

        def tracking_run(*args: Any, **kwargs: Any) -> str:
            handle = run(*args, **kwargs)
            launched.append(handle)
            return handle

        r.run = tracking_run  # type: ignore[method-assign]
        yield r
        for handle in launched:
            r.cancel(handle)


def wait_final(runner: Runner, handle: str, timeout: float = 60.0) -> object:
    def done() -> object:
        st = runner.status(handle)
        assert st is not None, f"{handle} is not known"
        return st if is_terminal(st.state) else None

    return wait_until(done, timeout, f"{handle} to end")


# --------------------------------------------------------------------------------------------
# the submitting process is SIGKILLed
# --------------------------------------------------------------------------------------------

# Each replica writes "<pid>" into started.<app>.<k>, waits for the go file, prints N lines to
# stdout and N/2 to stderr, then exits with the given code.
# ("$$" reaches the shell as written: only ${macro}s are substituted)
WORK = (
    'echo $$ > "$0.$1"; while [ ! -e "$2" ]; do sleep 0.02; done;'
    ' seq 1 "$3"; seq 1 $(( $3 / 2 )) >&2; exit "$4"'
)
SUBMITTER = """
import json, os, signal, sys, time
from core.runner import get_runner
from core.specs import AppDef, Role
tmp, work = sys.argv[1], sys.argv[2]
def role(name, n, lines, code):
    return Role(name, entrypoint="sh", num_replicas=n,
                args=["-c", work, f"{tmp}/started.{name}", "${replica_id}", f"{tmp}/go", str(lines), str(code)])
with get_runner("faults") as runner:
    handles = {
        "ok": runner.run(AppDef("killed-submitter-ok", [role("ok", 2, 300, 0)]), "local_cwd"),
        "bad": runner.run(AppDef("killed-submitter-bad", [role("bad", 1, 40, 5)]), "local_cwd"),
        "cancel": runner.run(AppDef("killed-submitter-cancel", [role("cancel", 2, 10, 0)]), "local_cwd"),
    }
    print(json.dumps(handles), flush=True)
    if sys.argv[3] == "now":
        os.kill(os.getpid(), signal.SIGKILL)  # before the log collectors may have started
    time.sleep(600)
"""


@pytest.mark.parametrize("when", ["right-after-submit", "while-running"])
def test_submitter_sigkilled_apps_keep_running_and_are_addressable(
    tmp_path: Path, runner: Runner, when: str
) -> None:
    handles: dict[str, str] = {}
    try:
        _submitter_sigkilled(tmp_path, runner, when, handles)
    finally:  # whatever failed: nothing of this test keeps running
        (tmp_path / "go").touch()
        for h in handles.values():
            runner.cancel(h)


def _submitter_sigkilled(
    tmp_path: Path, runner: Runner, when: str, handles: dict[str, str]
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SUBMITTER, str(tmp_path), WORK,
         "now" if when == "right-after-submit" else "later"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        handles.update(json.loads(proc.stdout.readline()))
        starts = {
            "ok": [tmp_path / "started.ok.0", tmp_path / "started.ok.1"],
            "bad": [tmp_path / "started.bad.0"],
            "cancel": [tmp_path / "started.cancel.0", tmp_path / "started.cancel.1"],
        }
        every = [p for ps in starts.values() for p in ps]
        wait_until(lambda: all(p.exists() and p.read_text().strip() for p in every), what="starts")
        if when == "while-running":
            proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    pids = {name: [int(p.read_text()) for p in ps] for name, ps in starts.items()}
    # the apps outlived their submitter and are RUNNING to a runner in another process
    assert all(pid_alive(pid) for ps in pids.values() for pid in ps)
    for handle in handles.values():
        st = runner.status(handle)
        assert st is not None and st.state == AppState.RUNNING, (handle, st)

    # cancel from a new process (the CLI)
    c = subprocess.run(
        [SHIPYARD, "cancel", handles["cancel"], "--wait", "--timeout", "60"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert c.returncode == 0 and c.stdout.strip() == f"{handles['cancel']} CANCELLED", c
    wait_until(
        lambda: not any(pid_alive(p) for p in pids["cancel"]), what="cancelled replicas gone"
    )

    # let the others finish: right final states, exit codes and complete logs
    (tmp_path / "go").touch()
    ok = wait_final(runner, handles["ok"])
    bad = wait_final(runner, handles["bad"])
    assert ok.state == AppState.SUCCEEDED and ok.exit_codes() == {"ok": [0, 0]}  # type: ignore[attr-defined]
    assert bad.state == AppState.FAILED and bad.exit_codes() == {"bad": [5]}  # type: ignore[attr-defined]
    assert "bad/0 exited with code 5" in bad.msg  # type: ignore[attr-defined]
    for name, n, k in (("ok", 300, 0), ("ok", 300, 1), ("bad", 40, 0)):
        out = list(runner.log_lines(handles[name], name, k, streams=Stream.STDOUT))
        assert out == [f"{j}\n" for j in range(1, n + 1)], (name, k, len(out))
        comb = list(runner.log_lines(handles[name], name, k))
        assert sorted(comb) == sorted(out + [f"{j}\n" for j in range(1, n // 2 + 1)])
    # and from yet another process: the CLI sees the same
    st = subprocess.run([SHIPYARD, "status", handles["bad"], "--json"], capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    data = json.loads(st.stdout)
    assert data["state"] == "FAILED" and data["roles"][0]["replicas"][0]["exit_code"] == 5


# --------------------------------------------------------------------------------------------
# replicas (and their wrappers) killed by signals from outside
# --------------------------------------------------------------------------------------------


def _sleeper(tmp_path: Path, n: int = 2) -> Role:
    # replica k writes its pid to pid.k, then becomes `sleep`
    return Role(
        "w",
        entrypoint="sh",
        args=["-c", 'echo $$ > "$0.$1"; exec sleep 300', str(tmp_path / "pid"), "${replica_id}"],
        num_replicas=n,
    )


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM])
def test_replica_killed_by_an_outside_signal_fails_the_app_naming_the_signal(
    tmp_path: Path, runner: Runner, sig: signal.Signals
) -> None:
    handle = runner.run(AppDef("sigkilled", [_sleeper(tmp_path)]), "local_cwd")
    pid_files = [tmp_path / "pid.0", tmp_path / "pid.1"]
    wait_until(lambda: all(p.exists() and p.read_text().strip() for p in pid_files), what="pids")
    pids = [int(p.read_text()) for p in pid_files]
    os.kill(pids[1], sig)
    st = wait_final(runner, handle)
    assert st.state == AppState.FAILED, st  # type: ignore[attr-defined]
    replicas = st.roles[0].replicas  # type: ignore[attr-defined]
    assert replicas[1].exit_code == -sig.value and replicas[1].state == AppState.FAILED
    assert f"w/1 was killed by signal {sig.value} ({sig.name})" in st.msg  # type: ignore[attr-defined]
    # the other replica was terminated with it (gang), nothing is left running
    assert replicas[0].state != AppState.SUCCEEDED
    wait_until(lambda: not any(pid_alive(p) for p in pids), what="replicas gone")


def test_replica_wrapper_sigkilled_app_ends_and_nothing_is_left(
    tmp_path: Path, runner: Runner
) -> None:
    """The /bin/sh wrapper that records the exit code is killed: the app must still end (not
    stay RUNNING forever) and the replica it started must not be left behind."""
    handle = runner.run(AppDef("wrapper-killed", [_sleeper(tmp_path, 1)]), "local_cwd")
    pid_file = tmp_path / "pid.0"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="pid")
    replica = int(pid_file.read_text())
    state_dir = Path(os.environ["SHIPYARD_STATE_DIR"]) / "local" / parse_app_handle(handle).app_id
    wrapper = json.loads((state_dir / "app.json").read_text())["replicas"][0]["pid"]
    assert wrapper != replica
    os.kill(wrapper, signal.SIGKILL)
    st = wait_final(runner, handle)
    assert st.state == AppState.FAILED, st  # type: ignore[attr-defined]
    wait_until(lambda: not pid_alive(replica), what="the orphaned replica to be terminated")


# --------------------------------------------------------------------------------------------
# log directory unwritable or full at submit
# --------------------------------------------------------------------------------------------


def _canary_app(tmp_path: Path, token: str) -> AppDef:
    """An app whose replicas would create ``ran.<k>`` and sleep (``token`` marks them)."""
    return AppDef(
        "logdir-fault",
        [
            Role(
                "r",
                entrypoint="sh",
                args=["-c", 'touch "$0.$1"; echo hello; exec sleep 300', str(tmp_path / "ran"),
                      "${replica_id}", token],
                num_replicas=2,
            )
        ],
    )  # fmt: skip


def _assert_nothing_started(tmp_path: Path, token: str, runner: Runner, before: set[str]) -> None:
    assert not procs_with(token), "a replica of the rejected app is running"
    assert not list(tmp_path.glob("ran.*")), "a replica of the rejected app ran"
    after = {a.app_id for a in runner.list("local_cwd")}
    assert after == before, f"the rejected app is listed: {after - before}"


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted for this test (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill_up(fs: Path) -> None:
    """Writes a file into ``fs`` until the file system is full."""
    fd = os.open(fs / "fill", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    assert os.statvfs(fs).f_bavail == 0


def _submit_expecting_clear_error(
    runner: Runner, tmp_path: Path, log_dir: str, token: str
) -> BaseException:
    before = {a.app_id for a in runner.list("local_cwd")}
    with pytest.raises(Exception) as e:
        runner.run(_canary_app(tmp_path, token), "local_cwd", {"log_dir": log_dir})
    msg = str(e.value)
    assert isinstance(e.value, ValueError | OSError), repr(e.value)
    assert log_dir in msg or "log_dir" in msg, f"error does not name the log dir: {msg!r}"
    _assert_nothing_started(tmp_path, token, runner, before)
    return e.value


def test_log_dir_under_a_file_is_a_clear_error_and_nothing_starts(
    tmp_path: Path, runner: Runner
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _submit_expecting_clear_error(runner, tmp_path, str(blocker / "logs"), "tok-notdir-3f9a")


def test_read_only_log_dir_is_a_clear_error_and_nothing_starts(
    tmp_path: Path, runner: Runner, tiny_tmpfs: Path
) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    _submit_expecting_clear_error(runner, tmp_path, str(tiny_tmpfs / "logs"), "tok-rofs-81c2")


def test_full_log_dir_is_a_clear_error_and_nothing_starts(
    tmp_path: Path, runner: Runner, tiny_tmpfs: Path
) -> None:
    _fill_up(tiny_tmpfs)
    _submit_expecting_clear_error(runner, tmp_path, str(tiny_tmpfs / "logs"), "tok-full-5d07")


def _state_dir_on(
    tiny_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:  # the local apps' state under the tiny file system
    state = tiny_tmpfs / "state"
    (state / "local").mkdir(parents=True)
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(state))
    return state


def _submit_expecting_state_dir_error(
    runner: Runner, tmp_path: Path, token: str, what: str
) -> None:
    before = {a.app_id for a in runner.list("local_cwd")}
    with pytest.raises(ValueError, match=rf"^state directory: cannot {what} "):
        runner.run(_canary_app(tmp_path, token), "local_cwd")
    # the replicas may have been spawned, but never past their start gate
    wait_until(lambda: not procs_with(token), what="gated replicas to be killed")
    _assert_nothing_started(tmp_path, token, runner, before)


def test_read_only_state_dir_is_a_clear_error_and_nothing_starts(
    tmp_path: Path, runner: Runner, tiny_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _state_dir_on(tiny_tmpfs, monkeypatch)
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    _submit_expecting_state_dir_error(runner, tmp_path, "tok-rostate-4b21", "create")


def test_full_state_dir_is_a_clear_error_and_nothing_starts(
    tmp_path: Path, runner: Runner, tiny_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's directory can still be made (a tmpfs directory takes no data pages) but its
    record cannot be written: the replicas, spawned and waiting at their gate, are killed."""
    state = _state_dir_on(tiny_tmpfs, monkeypatch)
    _fill_up(tiny_tmpfs)
    _submit_expecting_state_dir_error(runner, tmp_path, "tok-fullstate-9c3e", "write")
    assert list((state / "local").iterdir()) == [], "the rejected app left its directory"


def test_failure_while_starting_replicas_leaves_nothing_half_started(
    tmp_path: Path, runner: Runner
) -> None:
    """The second role cannot be started (an argument the OS cannot take): the first role's
    replicas, already started, must be gone when submit raises."""
    token = "tok-half-7e11"
    app = _canary_app(tmp_path, token)
    app.roles.append(Role("b", entrypoint="echo", args=["\ud800"]))
    before = {a.app_id for a in runner.list("local_cwd")}
    with pytest.raises(ValueError):
        runner.run(app, "local_cwd")
    wait_until(lambda: not procs_with(token), what="started replicas to be terminated")
    after = {a.app_id for a in runner.list("local_cwd")}
    assert after == before


def test_background_thread_failure_is_survived_by_the_next_submit(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that ends the local scheduler's background thread (injected: reaping raises) is
    logged, and the next submit starts a new thread that reaps and collects as before."""
    from core.schedulers.local import background
    from core.schedulers.local_scheduler import state_dir

    bg = background.BACKGROUND
    runner.run(AppDef("bg-warm", [Role("r", entrypoint="true")]), "local_cwd")
    old = wait_until(lambda: bg.thread, what="the background thread")
    assert isinstance(old, threading.Thread)

    reaped = background._Child.reaped

    def broken(child: background._Child, pidfd: int = -1) -> bool:
        # only bg-dies's wrapper: bg-warm's may be reaped after this is in place
        if child.app is not None and os.path.basename(child.app.path).startswith("bg-dies-"):
            raise RuntimeError("injected")
        return reaped(child, pidfd)

    monkeypatch.setattr(background._Child, "reaped", broken)
    first = runner.run(AppDef("bg-dies", [Role("r", entrypoint="true")]), "local_cwd")
    wait_until(lambda: not old.is_alive(), what="the background thread to end")
    assert bg.thread is None
    monkeypatch.undo()

    handle = runner.run(
        AppDef("bg-after", [Role("r", entrypoint="echo", args=["hi"])]), "local_cwd"
    )
    new = bg.thread
    assert new is not None and new is not old and new.is_alive()
    st = wait_final(runner, handle)
    assert st.state == AppState.SUCCEEDED  # type: ignore[attr-defined]
    assert list(runner.log_lines(handle, "r", 0)) == ["hi\n"]
    app_dir = os.path.join(state_dir(), parse_app_handle(handle).app_id)
    wait_until(lambda: os.path.exists(os.path.join(app_dir, "logs_done")), what="log collection")
    # the app whose watch was lost still ends and its logs can be read
    assert wait_final(runner, first).state == AppState.SUCCEEDED  # type: ignore[attr-defined]
    assert list(runner.log_lines(first, "r", 0)) == []
