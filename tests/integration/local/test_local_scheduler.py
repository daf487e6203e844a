"""The local scheduler (local_cwd, local_dir) with real processes."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from core.schedulers import get_scheduler_factories
from core.schedulers.api import Stream
from core.schedulers.local.appdir import AppDir
from core.schedulers.local.records import ExitCode
from core.schedulers.local.supervise import final_state, identities, observe, settle
from core.schedulers.local_scheduler import (
    CWDImageProvider,
    LocalDirectoryImageProvider,
    LocalScheduler,
    LogIterator,
    PopenRequest,
    ReplicaParam,
    SignalException,
    create_cwd_scheduler,
    create_scheduler,
    state_dir,
)
from core.specs import AppDef, AppState, Resource, Role, is_terminal, macros
from tests.helpers import wait_until

PY = sys.executable


def wait_terminal(sched: LocalScheduler, app_id: str, timeout: float = 30.0) -> AppState:
    def check() -> AppState | None:
        desc = sched.describe(app_id)
        assert desc is not None
        return desc.state if is_terminal(desc.state) else None

    return wait_until(check, timeout, f"{app_id} to end")  # type: ignore[return-value]


def sh(script: str, name: str = "r", n: int = 1, **kw: object) -> Role:
    return Role(name, entrypoint="sh", args=["-c", script], num_replicas=n, **kw)  # type: ignore[arg-type]


@pytest.fixture
def sched() -> Iterator[LocalScheduler]:
    s = create_cwd_scheduler("test", grace=2.0)
    yield s
    s.close()


# -------------------------------------------------------------------------------- registration


def test_registered_as_local_cwd_and_local_dir() -> None:
    factories = get_scheduler_factories()
    cwd = factories["local_cwd"]("s")
    d = factories["local_dir"]("s")
    try:
        assert isinstance(cwd, LocalScheduler) and cwd.backend == "local_cwd"
        assert isinstance(d, LocalScheduler) and d.backend == "local_dir"
    finally:
        cwd.close()
        d.close()


def test_run_opts_match_the_seed(sched: LocalScheduler) -> None:
    opts = sched.run_opts()
    # the seed's options, plus result_replicas (issue 19: whose results Runner.result reads)
    # and the time limit's and requeue's (issue 27)
    seed = {"log_dir", "prepend_cwd", "auto_set_cuda_visible_devices"}
    limits = {"time_limit", "checkpoint_signal", "checkpoint_grace", "max_requeues",
              "requeue_on_timeout"}  # fmt: skip
    assert {name for name, _ in opts} == seed | {"result_replicas"} | limits
    assert opts.get("result_replicas").default == "first"  # type: ignore[union-attr]
    assert opts.get("prepend_cwd").default is False  # type: ignore[union-attr]
    assert opts.get("log_dir").default is None  # type: ignore[union-attr]


def test_state_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHIPYARD_STATE_DIR", str(tmp_path / "a"))
    assert state_dir() == str(tmp_path / "a" / "local")
    monkeypatch.delenv("SHIPYARD_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert state_dir() == str(tmp_path / "x" / "shipyard" / "local")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert state_dir() == str(tmp_path / "h" / ".local" / "state" / "shipyard" / "local")


# -------------------------------------------------------------------------------- image providers


def test_cwd_image_provider_ignores_the_image() -> None:
    p = CWDImageProvider({})
    assert p.fetch("/tmp/foobar") == os.getcwd()
    assert p.fetch("foobar:latest") == os.getcwd()
    assert p.get_cwd("whatever") == os.getcwd()


def test_local_directory_image_provider(tmp_path: Path) -> None:
    p = LocalDirectoryImageProvider({})
    assert p.fetch(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="absolute"):
        p.fetch("foobar")
    with pytest.raises(ValueError, match="does not exist"):
        p.fetch(str(tmp_path / "does" / "not_exist"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        p.fetch(str(tmp_path / "file"))
    role = Role("r", image=str(tmp_path), entrypoint="run.sh")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    assert p.get_entrypoint(str(tmp_path), role) == str(tmp_path / "run.sh")
    role.entrypoint = "/bin/echo"
    assert p.get_entrypoint(str(tmp_path), role) == "/bin/echo"
    param = p.get_replica_param(str(tmp_path), role, stdout="o", stderr="e", combined="c")
    assert isinstance(param, ReplicaParam)
    assert param.cwd == str(tmp_path) and param.args == ["/bin/echo"]
    assert (param.stdout, param.stderr, param.combined) == ("o", "e", "c")


# -------------------------------------------------------------------------------- dry run


def test_dryrun_builds_a_popen_request(sched: LocalScheduler, tmp_path: Path) -> None:
    app = AppDef(
        "dry",
        [
            Role(
                "trainer",
                entrypoint="echo",
                args=["id=" + macros.app_id, "r=" + macros.replica_id, macros.rank0_env],
                env={"WHO": macros.replica_id},
                num_replicas=2,
            )
        ],
    )
    info = sched.submit_dryrun(app, {"log_dir": str(tmp_path)})
    req = info.request
    assert isinstance(req, PopenRequest)
    assert req.app_id.startswith("dry-")
    assert req.log_dir == str(tmp_path / req.app_id)
    params = req.role_params["trainer"]
    assert len(params) == 2
    assert params[1].args[0].endswith("/echo") and os.path.isabs(params[1].args[0])
    assert params[1].args[1:] == [f"id={req.app_id}", "r=1", "SHIPYARD_RANK0_HOST"]
    assert params[1].env["WHO"] == "1"
    assert params[1].env["SHIPYARD_REPLICA_ID"] == "1"
    assert params[1].stdout == str(tmp_path / req.app_id / "trainer.1.stdout.log")
    assert req.role_log_dirs["trainer"][0] == str(tmp_path / req.app_id)
    text = str(info)
    assert req.app_id in text and "trainer/1" in text
    # nothing started, nothing written
    assert not sched.exists(req.app_id)


def test_missing_entrypoint_is_rejected_before_anything_starts(sched: LocalScheduler) -> None:
    before = set(os.listdir(state_dir())) if os.path.isdir(state_dir()) else set()
    app = AppDef("bad", [sh("true", "ok"), Role("b", entrypoint="no-such-binary-xyz")])
    with pytest.raises(ValueError, match=r"roles\[1\]\.entrypoint"):
        sched.submit(app, {})
    after = set(os.listdir(state_dir())) if os.path.isdir(state_dir()) else set()
    assert not {a for a in after - before if a.startswith("bad-")}


def test_bad_cfg_is_rejected(sched: LocalScheduler) -> None:
    with pytest.raises(ValueError, match="cfg.prepend_cwd"):
        sched.submit_dryrun(AppDef("x", [sh("true")]), {"prepend_cwd": "maybe"})
    with pytest.raises(ValueError, match="cfg: unknown option"):
        sched.submit_dryrun(AppDef("x", [sh("true")]), {"nope": 1})


# -------------------------------------------------------------------------------- running


def test_multi_role_app_with_a_failing_replica(sched: LocalScheduler) -> None:
    app = AppDef(
        "multi",
        [
            sh('echo "w $SHIPYARD_REPLICA_ID"; exec sleep 30', "worker", 4),
            sh(
                'if [ "$SHIPYARD_REPLICA_ID" = 2 ]; then sleep 0.3; exit 3; fi; exec sleep 30',
                "ps",
                4,
            ),
        ],
    )
    app_id = sched.submit(app, {})
    desc = sched.describe(app_id)
    assert desc is not None
    # every replica is listed from the moment submit returns
    assert [(rs.role, [r.id for r in rs.replicas]) for rs in desc.roles_statuses] == [
        ("worker", [0, 1, 2, 3]),
        ("ps", [0, 1, 2, 3]),
    ]
    assert [r.name for r in desc.roles] == ["worker", "ps"]
    assert wait_terminal(sched, app_id) == AppState.FAILED
    desc = sched.describe(app_id)
    assert desc is not None
    assert "ps/2 exited with code 3" in desc.msg
    codes = {(rs.role, r.id): r.exit_code for rs in desc.roles_statuses for r in rs.replicas}
    assert codes[("ps", 2)] == 3
    # gang semantics: the others were terminated
    assert all(c == -15 for key, c in codes.items() if key != ("ps", 2))
    states = {(rs.role, r.id): r.state for rs in desc.roles_statuses for r in rs.replicas}
    assert states[("ps", 2)] == AppState.FAILED
    assert all(s == AppState.CANCELLED for key, s in states.items() if key != ("ps", 2))
    assert list(sched.log_iter(app_id, "worker", 3)) == ["w 3\n"]


def test_success_and_exit_codes(sched: LocalScheduler) -> None:
    app_id = sched.submit(AppDef("ok", [sh("echo hi", "a", 2), sh("true", "b")]), {})
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    desc = sched.describe(app_id)
    assert desc is not None and desc.msg in ("", "<NONE>")
    assert all(
        r.state == AppState.SUCCEEDED and r.exit_code == 0
        for rs in desc.roles_statuses
        for r in rs.replicas
    )


def test_replica_killed_by_signal_reports_negative_exit_code(sched: LocalScheduler) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    app_id = sched.submit(AppDef("sig", [Role("r", entrypoint=PY, args=["-c", code])]), {})
    assert wait_terminal(sched, app_id) == AppState.FAILED
    desc = sched.describe(app_id)
    assert desc is not None
    assert desc.roles_statuses[0].replicas[0].exit_code == -9
    assert "signal 9" in desc.msg


def test_replica_environment(sched: LocalScheduler, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "mytool"
    tool.write_text("#!/bin/sh\necho from-extra-path\n")
    tool.chmod(0o755)
    s = create_cwd_scheduler("env", extra_paths=[str(bindir)])
    try:
        script = (
            'echo "$SHIPYARD_APP_ID $SHIPYARD_ROLE_NAME $SHIPYARD_REPLICA_ID'
            ' $SHIPYARD_NUM_REPLICAS $SHIPYARD_RANK0_HOST $FOO"; mytool'
        )
        app = AppDef(
            "envapp",
            [
                Role(
                    "r",
                    entrypoint="sh",
                    args=["-c", script],
                    env={"FOO": macros.replica_id},
                    num_replicas=2,
                )
            ],
        )
        app_id = s.submit(app, {})
        assert wait_terminal(s, app_id) == AppState.SUCCEEDED
        assert list(s.log_iter(app_id, "r", 1)) == [
            f"{app_id} r 1 2 localhost 1\n",
            "from-extra-path\n",
        ]
    finally:
        s.close()


def test_prepend_cwd(
    sched: LocalScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "only-in-cwd"
    tool.write_text("#!/bin/sh\necho found-in-cwd\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    app = AppDef("pcwd", [Role("r", entrypoint="only-in-cwd")])
    with pytest.raises(ValueError, match=r"roles\[0\]\.entrypoint"):
        sched.submit(app, {})
    app_id = sched.submit(app, {"prepend_cwd": True})
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0)) == ["found-in-cwd\n"]


def test_local_dir_runs_in_the_image_directory(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text('#!/bin/sh\necho "in $(pwd) img=$1"\n')
    (tmp_path / "run.sh").chmod(0o755)
    s = create_scheduler("dir")
    try:
        app = AppDef(
            "dirapp", [Role("r", image=str(tmp_path), entrypoint="run.sh", args=[macros.img_root])]
        )
        app_id = s.submit(app, {})
        assert wait_terminal(s, app_id) == AppState.SUCCEEDED
        assert list(s.log_iter(app_id, "r", 0)) == [f"in {tmp_path} img={tmp_path}\n"]
        with pytest.raises(ValueError, match="image"):
            s.submit(AppDef("x", [Role("r", image="relative/dir", entrypoint="true")]), {})
    finally:
        s.close()


def test_auto_set_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = create_cwd_scheduler("gpu")
    try:
        app = AppDef(
            "gpu",
            [
                Role(
                    "a", entrypoint="true", num_replicas=2, resource=Resource(cpu=1, gpu=1, memMB=1)
                ),
                Role("b", entrypoint="true", num_replicas=1),
                Role(
                    "c", entrypoint="true", num_replicas=2, resource=Resource(cpu=1, gpu=3, memMB=1)
                ),
            ],
        )
        cfg = {"auto_set_cuda_visible_devices": True}

        def visible(devices: int, cfg: dict[str, bool] = cfg) -> dict[str, list[str | None]]:
            # no GPU machine here: the device count (nvidia-smi -L) is the only thing faked
            monkeypatch.setattr(s, "_get_gpu_device_count", lambda: devices)
            req = s.submit_dryrun(app, cfg).request
            return {
                role: [p.env.get("CUDA_VISIBLE_DEVICES") for p in ps]
                for role, ps in req.role_params.items()
            }

        # gpu=N: N devices of its own per replica; gpu=1: one each; no gpu: none
        expected = {"a": ["0", "1"], "b": [None], "c": ["2,3,4", "5,6,7"]}
        assert visible(8) == expected
        assert visible(16) == expected
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert visible(7) == {"a": [None, None], "b": [None], "c": [None, None]}
        assert [r.getMessage() for r in caplog.records] == [
            "auto_set_cuda_visible_devices: the replicas ask for 8 GPUs (a: 2 x 1, c: 2 x 3) but"
            " this host has 7; CUDA_VISIBLE_DEVICES is not set, so every replica sees all of them"
        ]
        assert visible(8, {}) == {"a": [None, None], "b": [None], "c": [None, None]}
    finally:
        s.close()


# -------------------------------------------------------------------------------- describe / list


def test_unknown_app(sched: LocalScheduler) -> None:
    assert sched.describe("no-such-app-123") is None
    assert sched.describe("../etc") is None
    assert not sched.exists("no-such-app-123")
    with pytest.raises(ValueError, match="no local app"):
        list(sched.log_iter("no-such-app-123", "r"))
    sched.cancel("no-such-app-123")  # no error


def test_list_and_idempotency_key(sched: LocalScheduler) -> None:
    a = sched.submit(AppDef("lst", [sh("true")]), {}, idempotency_key="key-1")
    b = sched.submit(AppDef("lst", [sh("sleep 30")]), {}, idempotency_key="key-2")
    try:
        ids = [r.app_id for r in sched.list()]
        assert ids.index(b) < ids.index(a)
        assert sched.find_by_idempotency_key("key-1") == a
        assert sched.find_by_idempotency_key("key-2") == b
        assert sched.find_by_idempotency_key("key-3") is None
        states = {r.app_id: r.state for r in sched.list()}
        assert states[b] == AppState.RUNNING
    finally:
        sched.cancel(b)


# -------------------------------------------------------------------------------- logs


def test_streams_and_whitespace(sched: LocalScheduler, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = (
        f"while [ ! -e {go} ]; do sleep 0.01; done;"
        r" printf 'out1\n'; sleep 0.2; printf '  err1 \t\n' >&2; sleep 0.2; printf 'a\rb\n';"
        r" printf 'tail-no-newline'"
    )
    app_id = sched.submit(AppDef("streams", [sh(script)]), {})
    # combined.log has the arrival order of what its collector saw arrive: wait for it to run
    wait_until(lambda: AppDir(state_dir(), app_id).collector_alive(), what="collector")
    go.touch()
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == [
        "out1\n",
        "a\rb\n",
        "tail-no-newline",
    ]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDERR)) == ["  err1 \t\n"]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.COMBINED)) == [
        "out1\n",
        "  err1 \t\n",
        "a\rb\n",
        "tail-no-newline",
    ]
    assert list(sched.log_iter(app_id, "r", 0, regex="err|b$")) == ["  err1 \t\n", "a\rb\n"]
    with pytest.raises(ValueError, match="streams"):
        sched.log_iter(app_id, "r", 0, streams="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no replica 5"):
        sched.log_iter(app_id, "r", 5)
    it = sched.log_iter(app_id, "r", 0)
    assert isinstance(it, LogIterator)


def test_should_tail_follows_until_the_app_ends(sched: LocalScheduler) -> None:
    script = "for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done; echo last"
    app_id = sched.submit(AppDef("tail", [sh(script)]), {})
    lines = list(sched.log_iter(app_id, "r", 0, should_tail=True))
    assert lines == [f"line {i}\n" for i in range(1, 6)] + ["last\n"]
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED


def test_should_tail_holds_a_partial_line_until_its_newline(sched: LocalScheduler) -> None:
    script = "printf 'par'; sleep 0.4; printf 'tial\\n'; sleep 0.2; printf 'x'"
    app_id = sched.submit(AppDef("partial", [sh(script)]), {})
    for stream in (Stream.STDOUT, Stream.COMBINED):
        lines = list(sched.log_iter(app_id, "r", 0, should_tail=True, streams=stream))
        assert lines == ["partial\n", "x"], stream


def test_since_until(sched: LocalScheduler) -> None:
    script = "echo early; sleep 1.5; echo late1; echo late2 >&2"
    app_id = sched.submit(AppDef("window", [sh(script)]), {})
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    # the combined log is complete once the collector finished
    all_lines = list(sched.log_iter(app_id, "r", 0, should_tail=True))
    assert all_lines == ["early\n", "late1\n", "late2\n"]
    desc_time = datetime.now()
    index = Path(state_dir(), app_id, "logs", "idx.0").read_text().split("\n")[0]
    first_seen = datetime.fromtimestamp(float(index.split()[0]))
    middle = first_seen + timedelta(seconds=0.7)
    assert list(sched.log_iter(app_id, "r", 0, since=middle)) == ["late1\n", "late2\n"]
    assert list(sched.log_iter(app_id, "r", 0, until=middle)) == ["early\n"]
    assert list(sched.log_iter(app_id, "r", 0, since=middle, streams=Stream.STDOUT)) == ["late1\n"]
    assert list(sched.log_iter(app_id, "r", 0, since=desc_time)) == []
    assert list(sched.log_iter(app_id, "r", 0, until=first_seen - timedelta(seconds=5))) == []


def test_log_dir_option(sched: LocalScheduler, tmp_path: Path) -> None:
    app_id = sched.submit(
        AppDef("logdir", [sh("echo to-log-dir", "r", 2)]), {"log_dir": str(tmp_path)}
    )
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    assert (tmp_path / app_id / "r.1.stdout.log").read_text() == "to-log-dir\n"
    assert list(sched.log_iter(app_id, "r", 1)) == ["to-log-dir\n"]
    wait_until(lambda: (tmp_path / app_id / "r.1.combined.log").exists(), what="combined.log")


def test_large_log_is_read_completely_in_order(sched: LocalScheduler) -> None:
    n = 200_000
    code = f"import sys\nfor i in range({n}): sys.stdout.write(f'line {{i}} ' + 'x' * (i % 50) + '\\n')"
    app_id = sched.submit(AppDef("big", [Role("r", entrypoint=PY, args=["-c", code])]), {})
    tailed = list(sched.log_iter(app_id, "r", 0, should_tail=True))
    assert len(tailed) == n
    assert all(line == f"line {i} " + "x" * (i % 50) + "\n" for i, line in enumerate(tailed))
    for stream in (Stream.STDOUT, Stream.COMBINED):
        lines = list(sched.log_iter(app_id, "r", 0, streams=stream))
        assert lines == tailed
    matched = list(sched.log_iter(app_id, "r", 0, regex=r"^line \d*7 "))
    assert matched == [line for line in tailed if line.split()[1].endswith("7")]
    assert len(matched) == n // 10


# -------------------------------------------------------------------------------- cancel


def test_cancel(sched: LocalScheduler) -> None:
    app_id = sched.submit(AppDef("cancel", [sh("echo started; sleep 60", "r", 3)]), {})
    wait_until(lambda: list(sched.log_iter(app_id, "r", 2, streams=Stream.STDOUT)), what="output")
    sched.cancel(app_id)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert all(r.state == AppState.CANCELLED for r in desc.roles_statuses[0].replicas)
    sched.cancel(app_id)  # idempotent
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]


def test_cancel_right_after_submit_is_never_missed() -> None:
    """A cancel that comes while the replicas' wrappers are still starting: each command either
    never starts or gets the SIGTERM (it may have started just before the cancel). A missed
    signal would leave it running until the SIGKILL after the grace period, recorded as -9."""
    s = create_cwd_scheduler("instant-cancel", grace=3.0)
    try:
        app = AppDef("instant", [Role("r", entrypoint="sleep", args=["60"], num_replicas=2)])
        for _ in range(60):
            app_id = s.submit(app, {})
            s.cancel(app_id)
            desc = s.describe(app_id)
            assert desc is not None and desc.state == AppState.CANCELLED
            # every replica's end is known right away, and it was the SIGTERM
            assert [r.exit_code for r in desc.roles_statuses[0].replicas] == [-15, -15], app_id
    finally:
        s.close()


def test_an_observer_that_looked_before_a_cancel_still_sees_it(sched: LocalScheduler) -> None:
    """The log collector observes while a cancel runs in another process: it read the markers,
    then the cancel marked the app and killed its replicas, then it found them dead. It must
    take the SIGTERMs as the cancel's, not as failures (CI saw a cancelled app end FAILED)."""
    app_id = sched.submit(AppDef("raced", [sh("echo started; sleep 60", "r", 2)]), {})
    wait_until(lambda: list(sched.log_iter(app_id, "r", 1, streams=Stream.STDOUT)), what="output")
    app = AppDir(state_dir(), app_id)
    record = app.read_record()
    assert record is not None

    def cancel_then_look(indices: list[int]) -> list[bool]:
        # (the cancel's own describe would write the final state; the race is before that)
        app.mark(AppDir.CANCELLED, json.dumps(time.time()))
        for g in indices:
            identities(record)[g].signal_group(signal.SIGTERM)
        wait_until(lambda: not any(identities(record)[g].alive() for g in indices), what="ends")
        return [False for _ in indices]

    obs = observe(app, record, alive=cancel_then_look)
    assert obs is not None and obs.cancelled and not obs.running
    assert final_state(app, record, obs).state == "CANCELLED"
    assert wait_terminal(sched, app_id) == AppState.CANCELLED


def test_an_observer_that_listed_before_a_cancel_and_read_codes_after_still_sees_it(
    sched: LocalScheduler,
) -> None:
    """The other order of the same race: the observer listed the markers, then the cancel
    marked the app and its replicas ended and recorded their codes, then it read the codes
    (CI saw a cancelled app end FAILED, "killed by signal 15")."""
    app_id = sched.submit(AppDef("raced", [sh("echo started; sleep 60", "r", 2)]), {})
    wait_until(lambda: list(sched.log_iter(app_id, "r", 1, streams=Stream.STDOUT)), what="output")
    app = AppDir(state_dir(), app_id)
    record = app.read_record()
    assert record is not None
    read_codes = app.exits

    def cancel_then_read() -> dict[int, ExitCode]:
        app.exits = read_codes  # type: ignore[method-assign]
        app.mark(AppDir.CANCELLED, json.dumps(time.time()))
        for ident in identities(record).values():
            ident.signal_group(signal.SIGTERM)
        wait_until(lambda: len(read_codes()) == 2, what="both exit codes")
        return read_codes()

    app.exits = cancel_then_read  # type: ignore[method-assign]
    obs = observe(app, record)
    assert obs is not None and obs.cancelled and not obs.running
    assert final_state(app, record, obs).state == "CANCELLED"
    assert wait_terminal(sched, app_id) == AppState.CANCELLED


def test_the_first_final_state_recorded_is_the_one_everybody_gets(sched: LocalScheduler) -> None:
    """Two observers that both saw every replica end may compute different final states (one
    looked before a cancel's marker): the first one recorded stays, the second gets it back."""
    app_id = sched.submit(AppDef("twice", [sh("exit 0")]), {})
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    app = AppDir(state_dir(), app_id)
    record = app.read_record()
    obs = observe(app, record) if record is not None else None
    assert record is not None and obs is not None and obs.done is not None
    stale = dataclasses.replace(obs, done=None, cancelled=True)  # would make it CANCELLED

    assert settle(app, record, stale, grace=2.0) == obs.done
    assert app.read_final() == obs.done
    assert not [n for n in os.listdir(app.path) if n.endswith(".tmp")]


def test_an_ended_app_described_from_memory_is_still_gone_once_removed(
    sched: LocalScheduler,
) -> None:
    app_id = sched.submit(AppDef("kept", [sh("exit 3", n=2)]), {})
    assert wait_terminal(sched, app_id) == AppState.FAILED
    # (the reaper's usage lines: a wrapper's own record, shown until then, is not kept)
    wait_until(lambda: len(AppDir(state_dir(), app_id).usages()) == 2,
               what="usage of both replicas")  # fmt: skip
    sched.describe(app_id)  # (reads those lines from disk, and keeps the ended app in memory)
    first = sched.describe(app_id)  # (from memory now: its final state and usage are known)
    again = sched.describe(app_id)
    assert first == again and first is not again
    assert first is not None
    # the first to exit 3 ends the app; the other exits 3 too, or is stopped (SIGTERM) first
    codes = [r.exit_code for r in first.roles_statuses[0].replicas]
    assert 3 in codes and set(codes) <= {3, -15}, codes
    AppDir(state_dir(), app_id).remove()  # (another process's retention sweep)
    assert sched.describe(app_id) is None


def test_cancel_escalates_to_sigkill(tmp_path: Path) -> None:
    s = create_cwd_scheduler("kill", grace=0.5)
    try:
        marker = tmp_path / "ready"
        script = f"trap '' TERM; touch {marker}; while true; do sleep 0.05; done"
        app_id = s.submit(AppDef("stubborn", [sh(script)]), {})
        wait_until(marker.exists, what="trap installed")
        s.cancel(app_id)
        desc = s.describe(app_id)
        assert desc is not None and desc.state == AppState.CANCELLED
    finally:
        s.close()


def test_log_iterator_reads_a_log_file_directly(sched: LocalScheduler) -> None:
    app_id = sched.submit(AppDef("direct", [sh(r"printf 'a\nb\nc'")]), {})
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    path = Path(state_dir(), app_id, "logs", "r.0.stdout.log")
    assert list(LogIterator(app_id, "", str(path), sched, should_tail=False)) == ["a\n", "b\n", "c"]
    assert list(LogIterator(app_id, "b|c", str(path), sched, should_tail=True)) == ["b\n", "c"]
    it = LogIterator(app_id, "", str(path), sched)
    assert next(it) == "a\n" and next(it) == "b\n"


def test_tail_with_a_time_window(sched: LocalScheduler) -> None:
    script = "i=0; while [ $i -lt 40 ]; do echo tick $i; i=$((i+1)); sleep 0.05; done"
    app_id = sched.submit(AppDef("tailwin", [sh(script)]), {})
    until = datetime.now() + timedelta(seconds=0.6)
    head = list(sched.log_iter(app_id, "r", 0, should_tail=True, until=until))
    # it stopped at `until`, before the app ended
    assert sched.describe(app_id).state == AppState.RUNNING  # type: ignore[union-attr]
    assert 2 <= len(head) < 40
    assert head == [f"tick {i}\n" for i in range(len(head))]
    since = datetime.now() + timedelta(seconds=0.3)
    rest = list(sched.log_iter(app_id, "r", 0, should_tail=True, since=since))
    assert sched.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert rest and rest[-1] == "tick 39\n"
    first = int(rest[0].split()[1])
    assert rest == [f"tick {i}\n" for i in range(first, 40)]
    assert first > len(head)


def test_failed_submit_leaves_nothing_running(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    marker = f"half-submitted-{time.time_ns()}"
    s = create_scheduler("half")
    try:
        app = AppDef(
            "half",
            [
                Role(
                    "a", image=str(first), entrypoint="sleep", args=["60", marker], num_replicas=2
                ),
                Role("b", image=str(second), entrypoint="sleep", args=["60"]),
            ],
        )
        info = s.submit_dryrun(app, {})
        second.rmdir()  # role b cannot start any more: caught before anything starts
        with pytest.raises(ValueError, match=r"roles\[1\]: working directory"):
            s.schedule(info)
        assert not s.exists(info.request.app_id)
        assert not os.path.exists(os.path.join(state_dir(), info.request.app_id))
        assert not _live_with(marker)
    finally:
        s.close()


def _live_with(marker: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            out.append(int(name))
    return out


def test_close_keeps_apps_running_and_restores_signal_handlers() -> None:
    import signal

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    s = create_cwd_scheduler("closing")
    assert signal.getsignal(signal.SIGTERM) is not before[0]
    app_id = s.submit(AppDef("closing", [sh("sleep 0.5; echo finished")]), {})
    s.close()
    s.close()  # idempotent
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    other = create_cwd_scheduler("after-close")
    try:
        assert wait_terminal(other, app_id) == AppState.SUCCEEDED
        assert list(other.log_iter(app_id, "r", 0)) == ["finished\n"]
        assert other.describe_many([app_id, "nope-1"])["nope-1"] is None
    finally:
        other.close()


def test_macros_are_substituted_like_macros_values_apply(sched: LocalScheduler) -> None:
    args = ["${app_id}/${replica_id}", "$$x", "${img_root}", "$unknown ${rank0_env}", "plain"]
    env = {"A": "${replica_id}", "B": "$${app_id}", "C": "${base_img_root}"}
    app = AppDef("mac", [Role("r", entrypoint="echo", args=args, env=env, num_replicas=2)])
    req = sched.submit_dryrun(app, {}).request
    for k, param in enumerate(req.role_params["r"]):
        want = macros.Values(
            img_root=os.getcwd(),
            app_id=req.app_id,
            replica_id=str(k),
            rank0_env="SHIPYARD_RANK0_HOST",
        ).apply(app.roles[0])
        assert param.args[1:] == want.args
        assert {key: param.env[key] for key in env} == want.env
    assert app.roles[0].args == args  # the app itself is untouched


def test_fast_large_output_is_collected_whole(sched: LocalScheduler, tmp_path: Path) -> None:
    # ~14 MB written in one burst (more than one read of the collector), multi-byte characters
    # and lines longer than the read buffer, so that boundaries fall inside lines and characters
    words = ["alpha", "λambda", "✓ ok", "épsilon", "loss=0.125"]
    lines = [
        f"{i:06d} " + " ".join(words[(i + j) % 5] for j in range(i % 40)) + "\n"
        for i in range(150_000)
    ]
    lines[1000] = "long " + "é" * (3 << 20) + "\n"  # a 6 MB line
    src = tmp_path / "big.txt"
    src.write_text("".join(lines), encoding="utf-8")
    app_id = sched.submit(AppDef("burst", [Role("r", entrypoint="cat", args=[str(src)])]), {})
    assert list(sched.log_iter(app_id, "r", 0, should_tail=True)) == lines
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    for stream in (Stream.COMBINED, Stream.STDOUT):
        assert list(sched.log_iter(app_id, "r", 0, streams=stream)) == lines, stream
    assert list(sched.log_iter(app_id, "r", 0, regex="^long ")) == [lines[1000]]


def test_replicas_start_with_default_signal_dispositions(sched: LocalScheduler) -> None:
    import signal

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # ignored here (Python ignores SIGPIPE)
    try:
        app_id = sched.submit(
            AppDef("sigs", [Role("r", entrypoint="grep", args=["^Sig[IB]", "/proc/self/status"])]),
            {},
        )
    finally:
        signal.signal(signal.SIGHUP, old)
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    got = dict(line.split(":") for line in sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT))
    standard = (1 << 31) - 1  # signals 1-31 (glibc reserves 32 and 33 for itself)
    assert int(got["SigIgn"], 16) & standard == 0 and int(got["SigBlk"], 16) == 0, got


def test_signal_handler_is_installed_again_after_a_framework_replaced_it() -> None:
    import signal

    first = create_cwd_scheduler("first")

    def framework_handler(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGTERM, framework_handler)  # e.g. Airflow's task runner
    try:
        second = create_cwd_scheduler("second")
        assert signal.getsignal(signal.SIGTERM) is not framework_handler
        second.close()
        first.close()
        assert signal.getsignal(signal.SIGTERM) is framework_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_signal_handler_chained_back_to_itself_does_not_recurse() -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    first = create_cwd_scheduler("chain-1")
    ours = signal.getsignal(signal.SIGTERM)
    calls: list[int] = []

    def framework_handler(signum: int, frame: object) -> None:  # chains to what it replaced
        calls.append(signum)
        ours(signum, frame)  # type: ignore[operator]

    signal.signal(signal.SIGTERM, framework_handler)
    second = create_cwd_scheduler("chain-2")  # re-installs ours over the framework's
    try:
        with pytest.raises(SignalException):
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # type: ignore[operator]
        assert calls == [signal.SIGTERM]
    finally:
        second.close()
        first.close()
        signal.signal(signal.SIGTERM, before)


def test_start_gate_is_not_held_by_a_forked_child(tmp_path: Path) -> None:
    # the submitter lets the replicas go with one line each, not with end-of-file: a child
    # forked meanwhile that keeps the write end open does not hold them
    from core.schedulers.local.spawn import Gate

    gate = Gate()
    pid = os.fork()
    if pid == 0:  # the child keeps the write end open until the parent's check is done
        time.sleep(5)
        os._exit(0)
    try:
        reader = subprocess.Popen(["sh", "-c", "read _; echo through"], stdin=os.dup(gate.read_fd),
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        gate.open(1)
        out, _ = reader.communicate(timeout=3)
        assert out == "through\n"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_replicas_start_once_every_replica_was_spawned(sched: LocalScheduler) -> None:
    # the gate opens after the spawn loop: no replica's command starts before the last
    # wrapper was spawned, and every one of them runs
    app = AppDef("gate", [Role("r", entrypoint="sh", args=["-c", "date +%s.%N"], num_replicas=16)])
    app_id = sched.submit(app, {})
    assert wait_terminal(sched, app_id) == AppState.SUCCEEDED
    record = AppDir(state_dir(), app_id).read_record()
    assert record is not None
    last_spawn = max(r.spawned for r in record.replicas)
    starts = [float("".join(sched.log_iter(app_id, "r", k)).strip()) for k in range(16)]
    assert min(starts) >= last_spawn
