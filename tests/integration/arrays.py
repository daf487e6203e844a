"""The checks every backend's array tests make (``Runner.run_array`` on the real service).

Each element records what it did in a directory the test reads afterwards: at its start it adds
a file under ``running/`` and writes down how many are there (itself included), at its end it
removes it. How many ran at once (at most: never fewer than the truth, for each start counts
every element that started before it and has not ended), and how often each element ran, come
from what the elements did, not from what Shipyard says. (Busybox's ``date`` has no ``%N``: no
timestamps.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.runner import Runner
from core.specs import AppDef, AppState, AppStatus, Role
from tests.helpers import ROOT, wait_until

#: makes a role named "w" running ``script`` (sh -c) on the backend, ``records`` reachable by it
RoleFactory = Callable[[str], Role]


def recording(records: str, body: str) -> str:
    """A script that records its start and end around ``body``."""
    me, dir_ = "$SHIPYARD_ARRAY_INDEX", f"{records}/running"
    return (
        f"mkdir -p {dir_}; touch {dir_}/{me}.$$; n=$(ls {dir_} | wc -l);"
        f' echo "{me} start $n" >> {records}/log; {{ {body}; }}; rc=$?; rm {dir_}/{me}.$$;'
        f' echo "{me} end 0" >> {records}/log; exit $rc'
    )


def events(records: str) -> list[tuple[int, str, int]]:
    """``(index, start|end, elements running at the start)`` of every record, in order."""
    path = Path(records) / "log"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(int(i), what, int(n)) for i, what, n in (ln.split() for ln in lines if ln)]


def most_at_once(records: str) -> int:
    """How many elements ran at the same time, at most (see the module's docstring)."""
    return max((n for _, what, n in events(records) if what == "start"), default=0)


def runs(records: str) -> dict[int, int]:
    """How many times each element started."""
    out: dict[int, int] = {}
    for i, what, _ in events(records):
        if what == "start":
            out[i] = out.get(i, 0) + 1
    return out


def final(runner: Runner, handle: str, timeout: float = 240) -> AppStatus:
    """The final status of an array (or an app)."""
    status = runner.wait(handle, wait_interval=0.2, timeout=timeout)
    assert status is not None
    return status


def check_cap_and_once(
    runner: Runner,
    backend: str,
    cfg: dict[str, Any],
    role: RoleFactory,
    records: str,
    n: int,
    seconds: float = 0.2,
) -> AppStatus:
    """``n`` elements of ``seconds`` each, at most 4 at once: each runs once, sees its index
    and params. Elements 0 and 1 wait (up to 60 s) until two elements run: they start in the
    driver's first look, so a run that never had two at once fails, however slow the submits."""
    body = (
        'echo "got $SHIPYARD_ARRAY_INDEX ${params.word} ${array_index}";'
        f" if [ $SHIPYARD_ARRAY_INDEX -lt 2 ]; then t=0; while [ $(ls {records}/running | wc -l)"
        f" -lt 2 ] && [ $t -lt 600 ]; do sleep 0.1; t=$((t + 1)); done; fi; sleep {seconds}"
    )
    app = AppDef("arr", [role(recording(records, body))])
    params = [{"word": f"w{i}"} for i in range(n)]
    handle = runner.run_array(app, backend, cfg, params=params, max_parallel=4)
    status = final(runner, handle)
    assert status.state == AppState.SUCCEEDED, status
    assert status.counts() == {"SUCCEEDED": n}
    assert runs(records) == dict.fromkeys(range(n), 1)
    peak = most_at_once(records)
    assert 1 < peak <= 4, f"{peak} elements ran at once"
    for i in (0, n - 1):
        assert list(runner.log_lines(f"{handle}[{i}]", "w", 0)) == [f"got {i} w{i} {i}\n"]
    return status


def check_cancel(
    runner: Runner, backend: str, cfg: dict[str, Any], role: RoleFactory, records: str
) -> None:
    """Cancelling mid-array ends what runs and starts nothing more."""
    # (ends at SIGTERM: a container's PID 1 shell would ignore it for the engine's stop timeout)
    body = "trap 'exit 143' TERM; sleep 300 & wait"
    app = AppDef("arrcancel", [role(recording(records, body))])
    handle = runner.run_array(app, backend, cfg, size=10, max_parallel=2)

    running: set[int] = set()

    def two_running() -> bool:
        s = runner.status(handle)
        running.clear()
        running.update(e.index for e in (s.elements or []) if e.state == AppState.RUNNING)
        return len(running) == 2

    wait_until(two_running, 120, "two elements to run")
    runner.cancel(handle)
    status = final(runner, handle)
    assert status.state == AppState.CANCELLED, status
    assert status.elements is not None
    assert all(e.state == AppState.CANCELLED for e in status.elements)
    # (an element waiting for a slot has no app yet, or, in a native array, a cancelled one)
    for e in status.elements:
        s = runner.status(e.handle) if e.handle else None
        assert e.handle is None or (s is not None and s.state == AppState.CANCELLED), (e, s)
    # (no other element ran; a Slurm job RUNNING may be cancelled before its script's first line)
    assert set(runs(records)) <= running


def check_retry_failed(
    runner: Runner, backend: str, cfg: dict[str, Any], role: RoleFactory, records: str
) -> None:
    """Elements 1 and 4 fail at first; retry_failed runs exactly those again."""
    body = f"[ -e {records}/ran.$SHIPYARD_ARRAY_INDEX ] || {{ touch {records}/ran.$SHIPYARD_ARRAY_INDEX; case $SHIPYARD_ARRAY_INDEX in 1|4) exit 3;; esac; }}"
    app = AppDef("arrretry", [role(recording(records, body))])
    handle = runner.run_array(app, backend, cfg, size=6, max_parallel=3)
    status = final(runner, handle)
    assert status.state == AppState.FAILED
    assert "2 of 6 elements failed: [1] exit 3, [4] exit 3" in status.msg
    assert runner.retry_failed(handle) == [1, 4]
    status = final(runner, handle)
    assert status.state == AppState.SUCCEEDED, status
    assert status.elements is not None
    assert [e.attempts for e in status.elements] == [1, 2, 1, 1, 2, 1]
    assert runs(records) == {0: 1, 1: 2, 2: 1, 3: 1, 4: 2, 5: 1}


_SUBMITTER = """
import json, sys, time
from core.runner import get_runner
from core.appfile import app_from_dict
spec = json.loads(sys.argv[1])
with get_runner(spec["session"]) as r:
    h = r.run_array(app_from_dict(spec["app"]), spec["backend"], spec["cfg"], size=spec["size"],
                    max_parallel=spec["cap"])
    print(h, flush=True)
    time.sleep(600)
"""


def check_submitter_killed(
    runner: Runner, backend: str, cfg: dict[str, Any], role: RoleFactory, records: str, n: int
) -> None:
    """SIGKILL of the submitting process right after run_array returns changes nothing."""
    import json

    from core.appfile import app_to_dict

    app = AppDef("arrkill", [role(recording(records, "sleep 0.3"))])
    spec = {
        "session": runner.session_name,
        "app": app_to_dict(app),
        "backend": backend,
        "cfg": cfg,
        "size": n,
        "cap": 3,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _SUBMITTER, json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        # (the test's directory: jobs of this host's Slurm write their logs where submitted)
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        handle = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert handle, "the submitter printed no handle"
    status = final(runner, handle)
    assert status.state == AppState.SUCCEEDED, status
    assert runs(records) == dict.fromkeys(range(n), 1)
    assert most_at_once(records) <= 3


def check_chain(
    runner: Runner, backend: str, cfg: dict[str, Any], role: RoleFactory, records: str
) -> None:
    """A -> B (ok) -> C run in order; when A fails, B and then C end CANCELLED, each naming
    its dependency, and never run."""
    log = f"{records}/order"

    def step(name: str, code: int = 0) -> AppDef:
        return AppDef(name, [role(f"sleep 0.3; echo {name} >> {log}; exit {code}")])

    a = runner.run(step("a"), backend, cfg)
    b = runner.run(step("b"), backend, cfg, after=[a])
    c = runner.run(step("c"), backend, cfg, after=[b])
    pending = runner.status(c)
    assert pending is not None and pending.state == AppState.PENDING
    assert final(runner, c).state == AppState.SUCCEEDED
    assert Path(log).read_text().split() == ["a", "b", "c"]
    assert list(runner.log_lines(c, "w", 0)) == []  # (its own app: the line went to the file)

    Path(log).unlink()
    a = runner.run(step("a", 3), backend, cfg)
    b = runner.run(step("b"), backend, cfg, after=[a])
    c = runner.run(step("c"), backend, cfg, after=[b])
    ended = runner.wait(c, wait_interval=0.2, timeout=240)
    assert ended is not None and ended.state == AppState.CANCELLED, ended
    assert f"dependency {b} ended CANCELLED (after_condition ok)" in ended.msg
    assert ended.reason == "dependency"
    b_status = runner.status(b)
    assert b_status is not None and b_status.state == AppState.CANCELLED
    assert f"dependency {a} ended FAILED (after_condition ok)" in b_status.msg
    assert Path(log).read_text().split() == ["a"]
