"""Issue 19 on the local scheduler: results through the runner, usage from wait4 rusage (within
20% of what the replica measured itself), named OOM kills, and pre-flight checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from core.reports import MAX_RESULT_BYTES, Problem, ResultError, oom_message, over_requests
from core.runner import Runner, get_runner
from core.schedulers.local.appdir import AppDir, apps_root
from core.schedulers.local.outcome import apply_usage, response
from core.schedulers.local.records import AppRecord, FinalState, ReplicaRecord, RoleRecord
from core.specs import (
    AppDef,
    AppState,
    AppStatus,
    ReplicaStatus,
    Resource,
    ResourceUsage,
    Role,
    is_terminal,
)
from tests.integration.docker.usage_probe import measure

MEASURE = measure(150, 0.8)  # (a local replica's usage is exact: no need to run long)


def _py(name: str, code: str, n: int = 1, **kw: object) -> Role:
    return Role(name, entrypoint=sys.executable, args=["-c", code], num_replicas=n, **kw)  # type: ignore[arg-type]


def _status_with_usage(runner: Runner, handle: str, timeout: float = 10.0) -> AppStatus:
    """The status once every replica's usage is recorded (the reaper records it just after
    the replica's exit code)."""
    deadline = time.monotonic() + timeout
    while True:
        status = runner.status(handle)
        assert status is not None
        if all(r.usage is not None for rs in status.roles for r in rs.replicas):
            return status
        assert time.monotonic() < deadline, f"no usage recorded for {handle}: {status}"
        time.sleep(0.01)


def test_result_comes_back_through_the_runner(runner: Runner) -> None:
    code = "import json,os; json.dump({'loss': 0.25, 'k': os.environ['SHIPYARD_REPLICA_ID']}, open(os.environ['SHIPYARD_RESULT_FILE'], 'w'))"
    app = AppDef("res", [_py("trainer", code, n=2), Role("quiet", entrypoint="true")])
    handle = runner.run(app, "local_cwd")
    assert runner.wait(handle, wait_interval=0.05).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    result = runner.result(handle)
    assert result.get("trainer") == {"loss": 0.25, "k": "0"}
    assert result.get("quiet") is None  # wrote nothing
    assert [r.name for r in result.replicas] == ["trainer/0", "quiet/0"]  # replica 0 only
    assert result.errors == []
    with pytest.raises(ResultError, match="trainer/1"):
        result.get("trainer", 1)


def test_every_replica_with_result_replicas_all(runner: Runner) -> None:
    code = "import json,os; json.dump(int(os.environ['SHIPYARD_REPLICA_ID']), open(os.environ['SHIPYARD_RESULT_FILE'], 'w'))"
    handle = runner.run(
        AppDef("all", [_py("w", code, n=3)]), "local_cwd", {"result_replicas": "all"}
    )
    runner.wait(handle, wait_interval=0.05)
    assert runner.result(handle).values() == {"w": {0: 0, 1: 1, 2: 2}}


def test_bad_result_option_names_the_field(runner: Runner) -> None:
    with pytest.raises(ValueError, match="cfg.result_replicas"):
        runner.run(
            AppDef("x", [Role("a", entrypoint="true")]), "local_cwd", {"result_replicas": "some"}
        )


def test_invalid_and_oversized_results_name_the_replica(runner: Runner) -> None:
    bad = "import os; open(os.environ['SHIPYARD_RESULT_FILE'], 'w').write('{not json')"
    big = f"import os; open(os.environ['SHIPYARD_RESULT_FILE'], 'w').write('\"' + 'x' * {MAX_RESULT_BYTES} + '\"')"
    handle = runner.run(AppDef("bad", [_py("bad", bad), _py("big", big)]), "local_cwd")
    status = runner.wait(handle, wait_interval=0.05)  # (the wait is not affected)
    assert status is not None and status.state == AppState.SUCCEEDED
    result = runner.result(handle)
    errors = result.errors
    assert len(errors) == 2
    assert errors[0].startswith("bad/0: result file is not valid JSON")
    assert errors[1].startswith(f"big/0: result file is {MAX_RESULT_BYTES + 2} bytes, more than")
    with pytest.raises(ResultError, match="big/0"):
        result.get("big")


# submits the app from a small process that waits for it (and so reaps its replica)
SUBMIT_AND_WAIT = r"""
import sys
from core.runner import get_runner
from core.specs import AppDef, Resource, Role
with get_runner("outcome") as runner:
    role = Role("m", entrypoint=sys.executable, args=["-c", sys.argv[1]],
                resource=Resource(1, 0, 4096))
    handle = runner.run(AppDef("use", [role]), "local_cwd")
    runner.wait(handle, wait_interval=0.05)
    print(handle)
"""


def _submitted_from(script: str, runner: Runner) -> tuple[str, ResourceUsage, Any]:
    """Runs ``script`` (it submits MEASURE and prints the handle) in a process of its own; the
    handle, the replica's usage once recorded, and what the replica measured of itself."""
    handle = subprocess.run(
        [sys.executable, "-c", script, MEASURE],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip()  # fmt: skip
    usage = _status_with_usage(runner, handle).roles[0].replicas[0].usage
    assert usage is not None
    return handle, usage, runner.result(handle).get("m")


def test_usage_within_20_percent_of_what_the_replica_measured(runner: Runner) -> None:
    """Submitted from a small process: a replica's wrapper is spawned sharing its submitter's
    memory until it execs, and the kernel counts that memory in the wrapper's peak, so a
    submitter larger than the replica (this test process, late in a run) hides its peak."""
    handle, usage, own = _submitted_from(SUBMIT_AND_WAIT, runner)
    assert usage.cpu_time == pytest.approx(own["cpu"], rel=0.2)
    assert usage.peak_memory == pytest.approx(own["maxrss"], rel=0.2)
    assert usage.wall_time == pytest.approx(own["wall"], rel=0.2)
    assert usage.requested_memory == 4096 << 20
    flagged = over_requests(_status_with_usage(runner, handle).roles)
    assert len(flagged) == 1 and re.fullmatch(r"m/0: requested 4 GiB, peak 1\d\d MiB", flagged[0])
    # in the JSON form of the status too
    assert runner.status(handle).to_json()["roles"][0]["replicas"][0]["usage"]["cpu_time"] > 0  # type: ignore[union-attr]


# submits the app from a process that exits at once (no process then reaps its replica)
SUBMIT_AND_EXIT = r"""
import sys
from core.runner import get_runner
from core.specs import AppDef, Role
with get_runner("outcome") as runner:
    role = Role("m", entrypoint=sys.executable, args=["-c", sys.argv[1]])
    print(runner.run(AppDef("orphan", [role]), "local_cwd"))
"""


def test_a_replica_that_outlives_its_submitter_still_reports_cpu_and_wall_time(
    runner: Runner,
) -> None:
    """No process reaps its wrapper with its rusage: the wrapper's own record stands in, its CPU
    time to the shell's 10 ms and its end; the peak memory stays unknown."""
    handle, usage, own = _submitted_from(SUBMIT_AND_EXIT, runner)
    assert usage.cpu_time == pytest.approx(own["cpu"], rel=0.2)
    assert usage.wall_time == pytest.approx(own["wall"], rel=0.2)
    assert usage.peak_memory is None and not usage.oom_killed
    assert over_requests(runner.status(handle).roles) == []  # (no peak to compare)


# A stand-in for a replica's wrapper, watched by the real background thread of a process that
# then exits: it records its exit code as a wrapper does, then takes a moment to exit (a loaded
# host), which is when a submitter that saw the exit code goes on to exit.
EXIT_WHILE_A_WRAPPER_ENDS = r"""
import os, subprocess, sys
from core.schedulers.local.appdir import AppDir
from core.schedulers.local.background import BACKGROUND
app = AppDir(*os.path.split(sys.argv[1]))
script = 'echo "0 0" >> "$1/exits"; exec sleep 0.5'
wrapper = subprocess.Popen(["sh", "-c", script, "sh", app.path])
BACKGROUND.submitted(app, [wrapper.pid], 1.0, None)
while 0 not in app.exits():
    os.sched_yield()
"""


def test_a_submitter_that_exits_once_the_exit_code_is_on_record_records_the_usage() -> None:
    """Usage is recorded as a wrapper is reaped: a process that exits between its replica's
    exit code and the wrapper's end (a waiting ``shipyard run``) first reaps it."""
    app = AppDir(apps_root(), f"reap-{os.getpid()}-{time.monotonic_ns()}")
    os.makedirs(apps_root(), mode=0o700, exist_ok=True)
    app.create()
    try:
        subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_A_WRAPPER_ENDS, app.path], check=True, timeout=60
        )
        assert app.exits() == {0: 0}
        assert list(app.usages()) == [0]  # on record by the time the submitter is gone
    finally:
        app.remove()


def test_oom_killed_replica_is_named_with_its_peak(tmp_path: object) -> None:
    """The OOM killer cannot be set off safely on a shared host: the recorded usage of a
    replica the reaper saw killed while the kernel counted an OOM kill is given to describe."""
    app = AppDir(apps_root(), f"oom-{os.getpid()}-{time.monotonic_ns()}")
    os.makedirs(apps_root(), mode=0o700, exist_ok=True)
    app.create()
    try:
        rep = ReplicaRecord(0, "w", 0, 1, 1, time.time() - 2.0, "o", "e", "c")
        record = AppRecord(app.app_id, "oom", "local_cwd", "s", time.time(), app.path,
                           [RoleRecord("w", 1, resource=(1, 0, 512))], [rep])  # fmt: skip
        app.record_usage(
            0, json.dumps({"end": time.time(), "cpu": 1.5, "maxrss": 511 << 20, "oom": True})
        )
        resp = response(
            app.app_id, record, FinalState("FAILED", [137], ["FAILED"], "w/0 exited with code 137")
        )
        apply_usage(resp, app.usages(), record)
        replica: ReplicaStatus = resp.roles_statuses[0].replicas[0]
        assert replica.usage is not None and replica.usage.oom_killed
        assert (
            replica.structured_error_msg
            == "w/0 killed: out of memory (peak 511 MiB of 512 MiB requested)"
        )
        assert resp.msg.startswith("w/0 killed: out of memory (peak 511 MiB of 512 MiB requested)")
    finally:
        app.remove()
    assert (
        oom_message(3 << 30, 64 << 30) == "killed: out of memory (peak 3 GiB of 64 GiB requested)"
    )


def test_preflight_reports_every_problem_at_once(
    runner: Runner, tmp_path: os.PathLike[str]
) -> None:
    app = AppDef(
        "pre",
        [
            Role("a", entrypoint="no-such-command-shipyard"),
            Role("b", entrypoint="/no/such/file"),
            Role("c", entrypoint="echo"),
        ],
    )
    problems = runner.preflight(app, "local_cwd")
    assert [p.field for p in problems] == ["roles[0].entrypoint", "roles[1].entrypoint"]
    assert "was not found on PATH" in problems[0].message
    assert "does not exist" in problems[1].message
    assert runner.preflight(AppDef("ok", [Role("c", entrypoint="echo")]), "local_cwd") == []
    # local_dir: a missing image directory, and a log_dir that is a file
    afile = os.path.join(tmp_path, "f")
    open(afile, "w").close()
    problems = runner.preflight(
        AppDef("d", [Role("a", image="/no/such/dir", entrypoint="echo")]),
        "local_dir",
        {"log_dir": os.path.join(afile, "logs")},
    )
    assert [p.field for p in problems] == ["roles[0].image", "cfg.log_dir"]
    # nothing was started
    assert all(isinstance(p, Problem) and p.is_error for p in problems)


def test_preflight_counts_the_gpus_auto_set_cuda_visible_devices_hands_out(
    runner: Runner, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """This host has no GPU: an nvidia-smi listing one stands in for a GPU host."""
    app = AppDef(
        "g",
        [Role("t", entrypoint="echo", num_replicas=2, resource=Resource(1, 1, 0)),
         Role("cpu", entrypoint="echo")],
    )  # fmt: skip
    cfg = {"auto_set_cuda_visible_devices": True}
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path), os.defpath]))
    problems = runner.preflight(app, "local_cwd", cfg)  # no nvidia-smi: no GPU
    assert [str(p) for p in problems] == [
        "cfg.auto_set_cuda_visible_devices: the replicas ask for 2 GPUs (t: 2 x 1) but this"
        " host has 0"
    ]
    smi = os.path.join(tmp_path, "nvidia-smi")
    with open(smi, "w") as f:
        f.write("#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\n")
    os.chmod(smi, 0o755)
    assert "this host has 1" in runner.preflight(app, "local_cwd", cfg)[0].message
    app.roles[0].num_replicas = 1
    assert runner.preflight(app, "local_cwd", cfg) == []
    assert runner.preflight(app, "local_cwd") == []  # not asked to hand GPUs out


def test_an_app_seen_ending_by_its_submitter_shows_what_the_reaper_recorded(runner: Runner) -> None:
    """The first describe that sees an app of this process end waits for its wrappers'
    reaping (they exit right after their exit codes): every replica's usage is then the
    reaper's, not the wrappers' own fallback (which has no peak memory, and whose end is the
    file clock's, a tick behind: an `echo` once showed a wall time of 0)."""
    app = AppDef("reaped", [Role("r", entrypoint="true", num_replicas=4)])
    # the submitting runner's scheduler, and another's in the same process (as a shared
    # status poller's): the wrappers are this process's either way
    with get_runner("reaped-watch") as other:
        scheds = [runner.scheduler("local_cwd"), other.scheduler("local_cwd")]
        for i in range(10):
            _described_at_its_end(runner, app, scheds[i % 2])


def _described_at_its_end(runner: Runner, app: AppDef, sched: Any) -> None:
    app_id = runner.run(app, "local_cwd").rsplit("/", 1)[1]
    while (desc := sched.describe(app_id)) is not None and not is_terminal(desc.state):
        pass  # (no sleep: the look right after the last exit code is the one at stake)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert sorted(AppDir(apps_root(), app_id).usages()) == [0, 1, 2, 3]
    replicas = [r for rs in desc.roles_statuses for r in rs.replicas]
    assert all(r.usage is not None and r.usage.wall_time > 0 for r in replicas), replicas
