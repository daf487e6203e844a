"""Local scheduler rows: submit, time to SUCCEEDED, describe, cancel and log_iter, each beside
``subprocess.Popen`` (or plain file reading) doing the same thing in the same run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import LOG_REGEX, Ctx, kill_groups, measure_lines, raw_popen, raw_read_split
from bench.harness import (
    MS,
    Row,
    Section,
    at_most_ms,
    fill,
    interleave,
    median,
    ratio,
    repeat_timed,
    wait_for,
)

SLEEP = shutil.which("sleep") or "/bin/sleep"
TRUE = shutil.which("true") or "/bin/true"
CAT = shutil.which("cat") or "/bin/cat"
POLL = 0.0005  # seconds between two polls of a state


def _app(name: str, entrypoint: str, args: list[str], n: int = 1) -> Any:
    from core.specs import AppDef, Role

    return AppDef(name, [Role("r", entrypoint=entrypoint, args=args, num_replicas=n)])


def _state(status: Any) -> Any:
    return None if status is None else status.state


def _app_dir(app_id: str) -> str:
    from core.schedulers.local_scheduler import state_dir

    return os.path.join(state_dir(), app_id)


def _quiesce(runner: Any, handle: str) -> None:
    """Waits until the app is terminal and its logs are collected, so that the background
    work of one trial (reaper, collector) does not run during the next one."""
    wait_for(lambda: (s := runner.status(handle)) is not None and s.is_terminal(), 30, handle)
    app_dir = _app_dir(handle.rsplit("/", 1)[1])
    wait_for(lambda: os.path.exists(os.path.join(app_dir, "logs_done")), 30, f"{handle} logs")


def run(ctx: Ctx) -> list[Row]:
    from core.runner import get_runner
    from core.specs import AppState

    sec = Section("local", ctx.runs, ctx.verbose)
    runner = get_runner("bench")
    raw_dir = os.path.join(ctx.tmp, "raw-local")
    counter = [0]

    def fresh_dir() -> str:
        counter[0] += 1
        return os.path.join(raw_dir, str(counter[0]))

    # -- submit ----------------------------------------------------------------------------
    for n in (1, 8, 32):

        def submit_row(row: Row, n: int = n) -> None:
            app = _app("bsub", "sleep", ["30"], n)

            def shipyard() -> float:
                t0 = time.perf_counter()
                h = runner.run(app, "local_cwd")
                dt = time.perf_counter() - t0
                runner.cancel(h)
                _quiesce(runner, h)
                return dt

            def raw() -> float:
                d = fresh_dir()
                t0 = time.perf_counter()
                procs = raw_popen([SLEEP, "30"], n, d)
                dt = time.perf_counter() - t0
                kill_groups(procs)
                return dt

            fill(
                row,
                interleave(
                    {"shipyard": shipyard, "raw": raw}, ctx.runs * {1: 4, 8: 2}.get(n, 1), warmup=2
                ),
            )

        sec.measure(
            sec.row(f"submit {n} replica(s) (sleep)", ratio(1.5), raw_name="Popen + log files"),
            submit_row,
        )

    sec.measure(
        sec.row("start gate: every one of 32 replicas started", ratio(1.1),
                raw_name="32 Popen + log files"),
        lambda row: _gate_row(row, runner, ctx.runs, fresh_dir),
    )  # fmt: skip

    # -- submit -> SUCCEEDED ----------------------------------------------------------------
    def succeeded_row(row: Row) -> None:
        app = _app("btrue", "true", [])

        def shipyard() -> float:
            t0 = time.perf_counter()
            h = runner.run(app, "local_cwd")
            while True:
                st = runner.status(h)
                if st is not None and st.state == AppState.SUCCEEDED:
                    break
                if st is not None and st.is_terminal():
                    raise AssertionError(f"{h} ended {st.state.name}")
                time.sleep(POLL)
            dt = time.perf_counter() - t0
            _quiesce(runner, h)
            return dt

        def raw() -> float:
            d = fresh_dir()
            t0 = time.perf_counter()
            (p,) = raw_popen([TRUE], 1, d)
            while p.poll() is None:
                time.sleep(POLL)
            return time.perf_counter() - t0

        fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs * 3, warmup=2))

    sec.measure(
        sec.row("trivial app: submit -> SUCCEEDED (polled)", at_most_ms(10), raw_name="Popen+poll"),
        succeeded_row,
    )

    # -- submit -> result (issue 19) ---------------------------------------------------------
    def result_row(row: Row) -> None:
        # both sides run the same app, which writes its JSON to $SHIPYARD_RESULT_FILE; only the
        # shipyard side reads it back (runner.result): the difference is what collecting costs
        sh = shutil.which("sh") or "/bin/sh"
        app = _app("bres", sh, ["-c", 'echo 1 > "$SHIPYARD_RESULT_FILE"'])

        def timed(read: bool) -> float:
            t0 = time.perf_counter()
            h = runner.run(app, "local_cwd")
            while not ((st := runner.status(h)) is not None and st.is_terminal()):
                time.sleep(POLL)
            if read and runner.result(h).get("r") != 1:
                raise AssertionError(f"{h}: result not read back")
            dt = time.perf_counter() - t0
            _quiesce(runner, h)
            return dt

        runs = ctx.runs * 30  # (a 0.1 ms difference on ~4 ms: fewer samples are all noise)
        fill(row, interleave({"shipyard": lambda: timed(True), "raw": lambda: timed(False)}, runs))

    sec.measure(
        sec.row(
            "trivial app: submit -> result (reads back its $SHIPYARD_RESULT_FILE)",
            ratio(1.05),
            raw_name="same app, result not read",
        ),
        result_row,
    )

    # -- a Python function as a job (issue 29) ------------------------------------------------
    sec.measure(
        sec.row(
            "run_function round trip: a function returning a dict",
            ratio(1.2),
            raw_name="run of the same work + result",
        ),
        lambda row: _function_row(row, runner, ctx.runs),
    )

    # -- describe from a fresh process ------------------------------------------------------
    def describe_row(row: Row, cold: bool) -> None:
        h = runner.run(_app("bdesc", "sleep", ["60"], 8), "local_cwd")
        try:
            wait_for(lambda: _state(runner.status(h)) == AppState.RUNNING, 10, "RUNNING")
            app_id = h.rsplit("/", 1)[1]
            out = subprocess.run(
                [ctx.python, "-m", "bench._worker", "local-describe", app_id,
                 str(ctx.runs * 4), "cold" if cold else "warm"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"worker failed: {out.stderr.strip()[-300:]}")
            fill(row, json.loads(out.stdout))
        finally:
            runner.cancel(h)
            _quiesce(runner, h)

    sec.measure(
        sec.row(
            "describe 8 replicas, fresh process, new scheduler per call",
            at_most_ms(1),
            raw_name="read app.json + kill(pid, 0) x8",
        ),
        lambda row: describe_row(row, cold=True),
    )
    sec.measure(
        sec.row(
            "describe 8 replicas, fresh process, same scheduler",
            at_most_ms(1),
            raw_name="read app.json + kill(pid, 0) x8",
        ),
        lambda row: describe_row(row, cold=False),
    )

    # -- describe from the submitting process (issue 31) ------------------------------------
    def submitter_row(row: Row) -> None:
        h = runner.run(_app("bdescin", "sleep", ["60"], 8), "local_cwd")
        procs = [subprocess.Popen(["sleep", "60"]) for _ in range(8)]
        try:
            wait_for(lambda: _state(runner.status(h)) == AppState.RUNNING, 10, "RUNNING")
            sched, app_id = runner.scheduler("local_cwd"), h.rsplit("/", 1)[1]

            def shipyard() -> float:
                return repeat_timed(lambda: sched.describe(app_id), 200)

            def raw() -> float:
                return repeat_timed(lambda: [p.poll() for p in procs], 200)

            fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs, warmup=2))
            row.note = "TorchX 0.7.0's in-memory describe took 0.067 ms in the issue's run"
        finally:
            for p in procs:
                p.kill()
                p.wait()
            runner.cancel(h)
            _quiesce(runner, h)

    sec.measure(
        sec.row(
            "describe 8 replicas, the submitting process (pidfds after the first look)",
            at_most_ms(0.067),
            raw_name="Popen.poll() x8 (in memory)",
        ),
        submitter_row,
    )

    # -- cancel ------------------------------------------------------------------------------
    for n in (1, 32):

        def cancel_row(row: Row, n: int = n) -> None:
            app = _app("bcancel", "sleep", ["30"], n)

            def shipyard() -> float:
                h = runner.run(app, "local_cwd")
                wait_for(lambda: _state(runner.status(h)) == AppState.RUNNING, 10, "RUNNING")
                time.sleep(0.1)  # the wrappers have exec'd their commands
                t0 = time.perf_counter()
                runner.cancel(h)
                while True:
                    st = runner.status(h)
                    if st is not None and st.state == AppState.CANCELLED:
                        break
                    if st is not None and st.is_terminal():
                        raise AssertionError(f"{h} ended {st.state.name}")
                    time.sleep(POLL)
                dt = time.perf_counter() - t0
                _quiesce(runner, h)
                return dt

            def raw() -> float:
                procs = raw_popen([SLEEP, "30"], n, fresh_dir())
                time.sleep(0.1)
                t0 = time.perf_counter()
                for p in procs:
                    os.killpg(p.pid, signal.SIGTERM)
                for p in procs:
                    p.wait()
                return time.perf_counter() - t0

            fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs, warmup=1))

        sec.measure(
            sec.row(f"cancel {n} replica(s) -> CANCELLED", at_most_ms(25), raw_name="killpg+wait"),
            cancel_row,
        )

    # -- log_iter ----------------------------------------------------------------------------
    def log_rows() -> None:
        from core.schedulers import get_scheduler_factories
        from core.schedulers.local.appdir import AppDir

        expected = ctx.log_lines()
        h = runner.run(_app("blog", "cat", [ctx.log_file()]), "local_cwd")
        st = runner.wait(h, wait_interval=0.05, timeout=120)
        if st is None or st.state != AppState.SUCCEEDED:
            raise RuntimeError(f"log app {h} ended {st}")
        app_id = h.rsplit("/", 1)[1]
        sched = get_scheduler_factories()["local_cwd"]("bench")
        # raw: the file the process wrote (log_iter reads the collected combined log)
        record = AppDir(*os.path.split(_app_dir(app_id))).read_record()
        assert record is not None
        path = record.replicas[0].stdout
        pat = re.compile(LOG_REGEX)

        for regex in (None, LOG_REGEX):
            row = sec.row(
                f"log_iter 200k lines{' with regex' if regex else ''}",
                ratio(3),
                raw_name="read + splitlines" + (" + re" if regex else ""),
            )

            def measure(row: Row, regex: str | None = regex) -> None:
                want = expected if regex is None else [x for x in expected if pat.search(x)]
                measure_lines(
                    row,
                    lambda: sched.log_iter(app_id, "r", 0, regex=regex),
                    lambda: raw_read_split(path, regex),
                    want,
                    ctx.runs,
                )

            sec.measure(row, measure)
        sched.close()

    try:
        log_rows()
    except Exception as e:
        r = sec.row("log_iter 200k lines", ratio(3))
        r.status, r.note = "ERROR", f"{type(e).__name__}: {e}"
        r.finish()
    sec.measure(
        sec.row(
            "a line after 2.5 s of silence reaches a combined-log follower",
            at_most_ms(300),
            raw_name="the line in its stdout file",
        ),  # fmt: skip
        lambda row: _pause_row(row, ctx.runs, ctx.tmp),
    )
    runner.close()
    shutil.rmtree(raw_dir, ignore_errors=True)
    return sec.rows


if __name__ == "__main__":
    sys.exit("run `python -m bench --only local`")


def _stamps(paths: list[str]) -> list[int]:
    out = []
    for path in paths:
        with open(path) as f:
            out.append(int(f.read().split()[0]))
    return out


def _gate_row(row: Row, runner: Any, runs: int, fresh_dir: Any) -> None:
    """From just before the submit until the last of 32 replicas has started its command (each
    prints the time it started: ``date +%s%N``, read from its log once all ended), beside 32
    ``Popen`` of the same command with their log files."""
    from core.schedulers.local.appdir import AppDir

    n, date = 32, shutil.which("date") or "/bin/date"
    app = _app("bgate", date, ["+%s%N"], n)

    phases: list[tuple[float, float, float]] = []  # spawn loop, record, after the gate

    def shipyard() -> float:
        t0 = time.time_ns()
        h = runner.run(app, "local_cwd")
        st = runner.wait(h, wait_interval=0.01, timeout=60)
        if st is None or st.state.name != "SUCCEEDED":
            raise AssertionError(f"{h} ended {st}")
        record = AppDir(*os.path.split(_app_dir(h.rsplit("/", 1)[1]))).read_record()
        assert record is not None
        last = max(_stamps([r.stdout for r in record.replicas])) / 1e9
        spawned = [r.spawned for r in record.replicas]
        phases.append((spawned[-1] - spawned[0], record.submit_time - spawned[-1],
                       last - record.submit_time))  # fmt: skip
        return last - t0 / 1e9

    def popen(cmd: list[str]) -> float:
        d = fresh_dir()
        t0 = time.time_ns()
        procs = raw_popen(cmd, n, d)
        for p in procs:
            p.wait()
        return (max(_stamps([os.path.join(d, f"{k}.stdout.log") for k in range(n)])) - t0) / 1e9

    # the least a replica costs that keeps a parent to record its exit code (what survives
    # the submitter): a shell that forks, execs the command and waits for it
    wrapped = ["/bin/sh", "-c", '("$@"); : "$?"', "sh", date, "+%s%N"]
    samples = interleave(
        {"shipyard": shipyard, "raw": lambda: popen([date, "+%s%N"]), "wrapped": lambda: popen(wrapped)},
        runs * 2,
        warmup=2,
    )  # fmt: skip
    fill(row, samples)
    ship, raw, w = (median(samples[k]) for k in ("shipyard", "raw", "wrapped"))
    loop, rec, after = (median([p[i] for p in phases]) * MS for i in range(3))
    row.note = (
        f"32 Popen of a waiting sh wrapper (fork, exec, wait): {w * MS:.1f} ms, {w / raw:.2f}x"
        f" raw; Shipyard {ship / w:.2f}x that: its spawn loop {loop:.1f} ms, the record"
        f" {rec:.1f} ms, then every replica's start after the gate {after:.1f} ms (nothing starts"
        " before the app is recorded, so the two are not overlapped as in raw). TorchX 0.7.0 was"
        " 1.3x Shipyard in the issue's run"
    )


def _pause_row(row: Row, runs: int, tmp: str) -> None:
    """A line printed after a pause long enough for the app's collector to sleep: the time
    until a follower of the combined log has it (the follower wakes the collector), beside the
    time until the line is in the replica's stdout file."""
    import queue
    import threading

    from core.schedulers import get_scheduler_factories
    from core.schedulers.local.appdir import AppDir

    sched = get_scheduler_factories()["local_cwd"]("bench")
    ship, raw = [], []
    for i in range(runs):
        gate = os.path.join(tmp, f"pause-gate-{i}")
        script = f"echo a; while [ ! -e {gate} ]; do sleep 0.005; done; echo b; sleep 60"
        app_id = sched.submit(_app("bpause", "sh", ["-c", script]), {})
        got: queue.Queue[tuple[float, str]] = queue.Queue()

        def follow(app_id: str = app_id, got: queue.Queue[tuple[float, str]] = got) -> None:
            for line in sched.log_iter(app_id, "r", 0, should_tail=True):
                got.put((time.perf_counter(), line))

        threading.Thread(target=follow, daemon=True).start()
        if got.get(timeout=30)[1] != "a\n":
            raise AssertionError("the first line is not 'a'")
        record = AppDir(*os.path.split(_app_dir(app_id))).read_record()
        assert record is not None
        stdout = record.replicas[0].stdout
        time.sleep(2.5)  # (the pause itself: the collector goes to sleep)
        t0 = time.perf_counter()
        with open(gate, "w"):
            pass
        out = Path(stdout)

        def printed(out: Path = out) -> bool:
            return b"b\n" in out.read_bytes()

        wait_for(printed, 10, "the line in stdout", 0.0002)
        raw.append(time.perf_counter() - t0)
        at, line = got.get(timeout=10)
        if line != "b\n":
            raise AssertionError(f"got {line!r}, expected 'b'")
        ship.append(at - t0)
        sched.cancel(app_id)
    sched.close()
    row.shipyard, row.raw = median(ship), median(raw)
    row.note = f"worst {max(ship) * 1000:.0f} ms"


def _square_dict(x: int) -> dict[str, int]:
    return {"x": x, "square": x * x}


#: the same work as ``_square_dict`` run as a plain app: this interpreter, cloudpickle
#: imported (a function job needs it too), the dict written to ``$SHIPYARD_RESULT_FILE``
_SAME_WORK = (
    "import cloudpickle, json, os; json.dump({'x': 7, 'square': 49},"
    " open(os.environ['SHIPYARD_RESULT_FILE'], 'w'))"
)


def _function_row(row: Row, runner: Any, runs: int) -> None:
    """``run_function`` + ``wait_function`` beside ``run`` + ``wait`` + ``result`` of an app
    doing the same in the same interpreter; the note gives the pickle's own cost."""
    import cloudpickle

    # (by value, as a script's function: by reference the job would import the bench itself)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = _app("bfn", sys.executable, ["-c", _SAME_WORK])

    def shipyard() -> float:
        t0 = time.perf_counter()
        h = runner.run_function(_square_dict, 7, scheduler="local_cwd")
        if runner.wait_function(h) != {"x": 7, "square": 49}:
            raise AssertionError(f"{h}: wrong value")
        return time.perf_counter() - t0

    def raw() -> float:
        t0 = time.perf_counter()
        h = runner.run(app, "local_cwd")
        runner.wait(h)
        if runner.result(h).get("r") != {"x": 7, "square": 49}:
            raise AssertionError(f"{h}: wrong result")
        return time.perf_counter() - t0

    fill(row, interleave({"shipyard": shipyard, "raw": raw}, runs * 2, warmup=2))
    t0 = time.perf_counter()
    for _ in range(100):
        cloudpickle.dumps((_square_dict, (7,), {}))
    row.note = f"pickling the call: {(time.perf_counter() - t0) * 10:.3f} ms"
