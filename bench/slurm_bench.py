"""Slurm rows: submit, describe (one job, 100 jobs), the CLI calls each costs, and log_iter,
beside raw ``sbatch``/``squeue`` runs of the same script and query in the same run.

CLI calls are counted by a directory of wrappers put first on ``PATH`` (each appends its name to
a file, then execs the real command), so the count is what actually reached the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from bench.common import LOG_REGEX, Ctx, measure_lines, raw_read_split
from bench.harness import (
    Row,
    Section,
    SkipRow,
    Target,
    exactly,
    fill,
    interleave,
    ratio,
    repeat_timed,
    wait_for,
)

SESSION = "benchslurm"
N_HANDLES = 100
N_ARRAY = 1000  # (Slurm's default MaxArraySize is 1001: indices 0..1000)
ARRAY_CAP = 8
CLI = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo")


def problem() -> str | None:
    if not shutil.which("sinfo"):
        return "Slurm is not installed"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed ({e})"
    if out.returncode != 0:
        return f"no Slurm cluster ({out.stderr.strip()}); start it with scripts/start_slurm.sh"
    if not any(s.rstrip("*").startswith(("idle", "alloc", "mix")) for s in out.stdout.split()):
        return f"no usable Slurm nodes ({out.stdout.split()})"
    return None


class CallCounter:
    """Wrappers for the Slurm CLI, first on PATH while :meth:`counting` is active."""

    def __init__(self, tmp: str) -> None:
        self.dir = os.path.join(tmp, "slurm-bin")
        self.log = os.path.join(tmp, "slurm-calls.log")
        os.makedirs(self.dir, exist_ok=True)
        for name in CLI:
            real = shutil.which(name)
            if real is None:
                continue
            path = os.path.join(self.dir, name)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\necho {name} >> "{self.log}"\nexec "{real}" "$@"\n')
            os.chmod(path, 0o755)

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        """Counts the CLI calls made inside the block (the Counter is filled on exit)."""
        open(self.log, "w").close()
        old = os.environ["PATH"]
        os.environ["PATH"] = f"{self.dir}{os.pathsep}{old}"
        counts: Counter[str] = Counter()
        try:
            yield counts
        finally:
            os.environ["PATH"] = old
            with open(self.log) as f:
                counts.update(line.strip() for line in f if line.strip())


def _array_submit_row(ctx: Ctx, sec: Section, runner: Any, sched: Any) -> None:
    """``run_array`` of N_ARRAY elements (one native array: one sbatch) beside ``sbatch`` of the
    same script; each array cancelled, and its driver gone, before the next trial."""
    from core.arrays import open_array
    from core.arrays.spec import array_template, make_spec
    from core.specs import parse_app_handle

    app = make_app("bsarr", ["sh", "-c", "sleep 600 # ${array_index}"])

    def shipyard() -> float:
        t0 = time.perf_counter()
        h = runner.run_array(app, "slurm", size=N_ARRAY, max_parallel=ARRAY_CAP)
        dt = time.perf_counter() - t0
        runner.cancel(h)
        p = parse_app_handle(h)
        adir = open_array(p.scheduler_backend, p.session_name, p.app_id)
        end = runner.wait(h, wait_interval=0.1, timeout=120)
        if adir is None or end is None or not end.is_terminal():
            raise AssertionError(f"{h}: did not end after its cancel")
        wait_for(lambda: not adir.driver_alive(), 60, "the array's driver to exit")
        return dt

    def raw() -> float:
        indices = list(range(N_ARRAY))
        spec = make_spec(app, size=N_ARRAY, max_parallel=ARRAY_CAP)
        template, values = array_template(app, spec, indices, "slurm://benchslurm/raw")
        req = sched.submit_dryrun(template, {}).request
        req.array, req.array_values = f"0-{N_ARRAY - 1}%{ARRAY_CAP}", values
        script = req.materialize()  # the same script
        t0 = time.perf_counter()
        job = sbatch(script)
        dt = time.perf_counter() - t0
        scancel([job])
        return dt

    def measure(row: Row) -> None:
        fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs, warmup=1))
        row.note = (
            "validation of every element, the array's record, one sbatch, its driver started;"
            " each array cancelled and its driver gone before the next trial"
        )

    sec.measure(
        sec.row(
            f"array submit: run_array of {N_ARRAY:,} elements (native sbatch --array)",
            ratio(1.5),
            raw_name="sbatch --array of the same script",
        ),
        measure,
    )


def make_app(name: str, args: list[str], n: int = 1) -> Any:
    from core.specs import AppDef, Role

    return AppDef(name, [Role("r", entrypoint=args[0], args=args[1:], num_replicas=n)])


def sbatch(script: str, *extra: str) -> str:
    p = subprocess.run(["sbatch", "--parsable", *extra], input=script, capture_output=True,
                       text=True, check=False)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"sbatch failed: {p.stderr.strip()}")
    return p.stdout.strip().split(";")[0]


def scancel(ids: list[str]) -> None:
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)


ROWS: list[tuple[str, Target | None, str]] = [
    ("submit 1 replica", ratio(2), "ms"),
    ("submit 3 replicas (het job)", ratio(2), "ms"),
    (f"array submit: run_array of {N_ARRAY:,} elements (native sbatch --array)", ratio(1.5),
     "ms"),
    ("describe an active job", ratio(2), "ms"),
    ("describe an active job: CLI calls", exactly(1, "call"), "calls"),
    ("describe a job squeue forgot: CLI calls", exactly(2, "calls"), "calls"),
    (f"describe {N_HANDLES} active handles at once: CLI calls per poll", exactly(1, "call"),
     "calls"),
    ("log_iter 200k lines", ratio(3), "ms"),
    ("log_iter 200k lines with regex", ratio(3), "ms"),
]  # fmt: skip


def run(ctx: Ctx) -> list[Row]:
    sec = Section("slurm", ctx.runs, ctx.verbose)
    why = problem()
    if why:
        sec.skip_all(why, ROWS)
        return sec.rows
    workdir = os.path.join(ctx.tmp, "slurm-jobs")
    os.makedirs(workdir, exist_ok=True)
    old_cwd = os.getcwd()
    os.chdir(workdir)  # jobs without a job_dir run (and write their logs) here
    try:
        _run(ctx, sec)
    finally:
        os.chdir(old_cwd)
    return sec.rows


def _run(ctx: Ctx, sec: Section) -> None:
    from core.runner import get_runner
    from core.schedulers import get_scheduler_factories
    from core.schedulers.slurm.jobinfo import SQUEUE_FORMAT
    from core.specs import AppState, is_terminal

    runner = get_runner(SESSION)
    sched = get_scheduler_factories()["slurm"](SESSION)
    counter = CallCounter(ctx.tmp)

    def squeue_raw(ids: list[str]) -> subprocess.CompletedProcess[str]:
        # the query shipyard makes, run directly
        return subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FORMAT],
            capture_output=True, text=True, check=True,
        )  # fmt: skip

    # -- submit --------------------------------------------------------------------------------
    for n in (1, 3):

        def submit_row(row: Row, n: int = n) -> None:
            app = make_app("bssub", ["sleep", "600"], n)

            def shipyard() -> float:
                t0 = time.perf_counter()
                h = runner.run(app, "slurm")
                dt = time.perf_counter() - t0
                scancel([h.rsplit("/", 1)[1]])
                return dt

            def raw() -> float:
                script = sched.submit_dryrun(app, {}).request.materialize()  # the same script
                t0 = time.perf_counter()
                job = sbatch(script)
                dt = time.perf_counter() - t0
                scancel([job])
                return dt

            fill(row, interleave({"shipyard": shipyard, "raw": raw}, ctx.runs * 2, warmup=1))

        name = "submit 1 replica" if n == 1 else f"submit {n} replicas (het job)"
        sec.measure(sec.row(name, ratio(2), raw_name="sbatch of the same script"), submit_row)

    _array_submit_row(ctx, sec, runner, sched)

    # -- describe one active job ---------------------------------------------------------------
    h = runner.run(make_app("bsdesc", ["sleep", "600"]), "slurm")
    job = h.rsplit("/", 1)[1]
    try:
        active = (AppState.PENDING, AppState.RUNNING, AppState.SUBMITTED)

        def describe_row(row: Row) -> None:
            def ship_once() -> None:
                d = sched.describe(job)
                assert d is not None and d.state in active, d

            def raw_once() -> None:
                assert job in squeue_raw([job]).stdout

            fill(row, interleave({"shipyard": lambda: repeat_timed(ship_once, 3),
                                  "raw": lambda: repeat_timed(raw_once, 3)},
                                 ctx.runs * 2, warmup=1))  # fmt: skip

        sec.measure(
            sec.row("describe an active job", ratio(2), raw_name="1 squeue of the same query"),
            describe_row,
        )

        def calls_row(row: Row) -> None:
            with counter.counting() as calls:
                d = sched.describe(job)
            assert d is not None and d.state in active, d
            row.shipyard = float(sum(calls.values()))
            row.raw = 1.0
            row.note = ", ".join(f"{k} {v}" for k, v in sorted(calls.items()))
            if calls["sacct"]:
                row.status = "MISS"
                row.note += " (sacct for a job squeue knows)"

        sec.measure(
            sec.row("describe an active job: CLI calls", exactly(1, "call (squeue)"), "calls",
                    raw_name="1 squeue"),
            calls_row,
        )  # fmt: skip
    finally:
        scancel([job])

    # -- describe a job the controller forgot ------------------------------------------------
    def forgotten_row(row: Row) -> None:
        acct = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-S", "now-7days", "-o", "JobID,State"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        ended = [
            line.split("|")[0]
            for line in acct.stdout.splitlines()
            if line.split("|")[0].isdigit() and not line.split("|")[1].startswith(("RUNNING", "PENDING"))
        ]  # fmt: skip
        if acct.returncode != 0 or not ended:
            raise SkipRow("no ended job in accounting")
        known = set(
            subprocess.run(
                ["squeue", "-h", "-t", "all", "-o", "%i"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()  # fmt: skip
        )
        forgotten = [j for j in ended if j not in known]
        if not forgotten:
            raise SkipRow("every ended job is still known to squeue (MinJobAge)")
        old = forgotten[-1]
        with counter.counting() as calls:
            d = sched.describe(old)
        assert d is not None and is_terminal(d.state), d
        row.shipyard = float(sum(calls.values()))
        row.raw = 2.0
        row.note = f"job {old}: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items()))
        if calls["squeue"] != 1 or calls["sacct"] != 1:
            row.status = "MISS"

    sec.measure(
        sec.row("describe a job squeue forgot: CLI calls", exactly(2, "calls (squeue+sacct)"),
                "calls", raw_name="squeue + sacct"),
        forgotten_row,
    )  # fmt: skip

    # -- describe 100 active handles at once ------------------------------------------------------
    def many_rows() -> None:
        # held jobs: active (PENDING) for as long as the row runs, without taking the cluster's
        # nodes from anyone else; submitted with shipyard's own script
        script = sched.submit_dryrun(make_app("bsmany", ["sleep", "600"]), {}).request.materialize()
        jobs: list[str] = []
        try:
            for _ in range(N_HANDLES):
                jobs.append(sbatch(script, "--hold"))
            handles = [f"slurm://{SESSION}/{j}" for j in jobs]

            def calls(row: Row) -> None:
                polls = ctx.runs
                with counter.counting() as c:
                    for _ in range(polls):
                        st = runner.status_many(handles)
                        assert all(s is not None and s.state == AppState.PENDING
                                   for s in st.values()), st  # fmt: skip
                row.shipyard = sum(c[k] for k in ("squeue", "sacct", "scontrol")) / polls
                row.raw = 1.0
                row.note = f"{polls} polls: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))

            sec.measure(
                sec.row(f"describe {N_HANDLES} active handles at once: CLI calls per poll",
                        exactly(1, "call"), "calls", raw_name="1 squeue"),
                calls,
            )  # fmt: skip

            def triggers(row: Row) -> None:
                import importlib.util

                if importlib.util.find_spec("airflow") is None:  # (importing it sets up logging)
                    raise SkipRow("apache-airflow is not installed")
                handles_file = os.path.join(ctx.tmp, "handles.txt")
                with open(handles_file, "w") as f:
                    f.write("\n".join(handles))
                with counter.counting() as c:
                    p = subprocess.run(
                        [ctx.python, "-m", "bench._worker", "airflow-triggers", handles_file, "3"],
                        capture_output=True, text=True, timeout=300, check=False,
                    )  # fmt: skip
                if p.returncode != 0:
                    raise RuntimeError(f"trigger worker failed: {p.stderr.strip()[-300:]}")
                res = json.loads(p.stdout)
                if res["events"] or not res["polls"]:
                    raise RuntimeError(f"unexpected trigger run: {res}")
                row.shipyard = sum(c[k] for k in ("squeue", "sacct", "scontrol")) / res["polls"]
                row.raw = 1.0
                row.note = f"{res['triggers']} triggers, {res['polls']} poll ticks: " + ", ".join(
                    f"{k} {v}" for k, v in sorted(c.items())
                )

            sec.measure(
                sec.row(f"{N_HANDLES} Airflow triggers on {N_HANDLES} jobs: CLI calls per tick",
                        exactly(1, "call"), "calls", raw_name="1 squeue"),
                triggers,
            )  # fmt: skip

            def timing(row: Row) -> None:
                fill(row, interleave({
                    "shipyard": lambda: repeat_timed(lambda: runner.status_many(handles), 2),
                    "raw": lambda: repeat_timed(lambda: squeue_raw(jobs), 2),
                }, ctx.runs, warmup=1))  # fmt: skip

            sec.measure(
                sec.row(f"describe {N_HANDLES} active handles at once: time per poll", ratio(2),
                        raw_name="1 squeue of the 100 ids"),
                timing,
            )  # fmt: skip
        finally:
            for i in range(0, len(jobs), 50):
                scancel(jobs[i : i + 50])

    try:
        many_rows()
    except Exception as e:
        r = sec.row(f"describe {N_HANDLES} active handles at once", None)
        r.status, r.note = "ERROR", f"{type(e).__name__}: {e}"

    # -- log_iter ------------------------------------------------------------------------------
    expected = ctx.log_lines()
    h = runner.run(make_app("bslog", ["cat", ctx.log_file()]), "slurm")
    job = h.rsplit("/", 1)[1]
    st = wait_for(
        lambda: (s := runner.status(h)) is not None and is_terminal(s.state) and s, 300, "log job"
    )
    if st.state != AppState.SUCCEEDED:
        raise RuntimeError(f"log job {job} ended {st.state.name}: {st.msg}")
    path = os.path.join(os.getcwd(), f"slurm-{job}-r-0.out")
    pat = re.compile(LOG_REGEX)
    list(sched.log_iter(job, "r", 0))  # the scheduler learns the job's directory once
    for regex in (None, LOG_REGEX):

        def log_row(row: Row, regex: str | None = regex) -> None:
            want = expected if regex is None else [x for x in expected if pat.search(x)]
            measure_lines(
                row,
                lambda: sched.log_iter(job, "r", 0, regex=regex),
                lambda: raw_read_split(path, regex),
                want,
                ctx.runs,
            )

        sec.measure(
            sec.row(f"log_iter 200k lines{' with regex' if regex else ''}", ratio(3),
                    raw_name="read + splitlines" + (" + re" if regex else "")),
            log_row,
        )  # fmt: skip
    runner.close()
