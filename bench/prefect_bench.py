"""Prefect rows, against the real server and Shipyard worker (scripts/start_prefect.sh).

* worker: flow run scheduled -> job submitted. From the Scheduled state the API gave the run when
  it was created to the worker's "Shipyard job ... submitted" record in the run's log (both
  timestamps from this host's clock). The physical limit is the worker's poll interval: a run
  created just after a poll waits for the next one; the target allows 1 s of work on top.
* worker: 100 concurrent flow runs, Slurm calls per poll. 100 flow runs of a deployment on the
  real Slurm cluster in flight at once, tracked by one worker; the Slurm commands that worker runs
  per poll of all its jobs (a call that asks about every one of them), beside the physical limit
  of one ``squeue`` for all of them. It counts
  the steady state: from the first poll of all 100 after the last job's first-watch polls (a
  newly watched job is polled on its own for about 3 s, its first state at once, see
  :mod:`core.watch.polling`). See :func:`_measure_tracking` for how the jobs are kept cheap and
  how the calls are counted.

``python -m bench.prefect_bench`` runs this section alone (``--runs N``; ``--row submit`` or
``--row track`` for one row).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.common import Ctx
from bench.harness import Row, Section, SkipRow, Target, exactly, median, wait_for

HOME = Path(os.environ.get("SHIPYARD_PREFECT_HOME", "/var/lib/shipyard-prefect"))
FLOW_DIR = Path(__file__).resolve().parent
ROW = "worker: flow run scheduled -> job submitted"
SUBMITTED = "Shipyard job "
#: flow runs in flight at once in the tracking row
N_RUNS = 100
#: polls of all of them that the tracking row counts the calls of
WINDOW_POLLS = 10
TRACK_ROW = f"worker: {N_RUNS} concurrent flow runs, Slurm calls per poll"
SLURM_CLI = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo")
#: the worker's per-poll debug record, with the record's time (see BenchWorker)
_POLL_RE = re.compile(r"^(\d+\.\d+) \| DEBUG\s*\| \S+ - poll (\d+): (\d+) Shipyard jobs")


def _problem() -> str | None:
    import urllib.request

    try:
        url = (HOME / "api_url").read_text().strip()
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return None if r.read().strip() == b"true" else "the API is not healthy"
    except OSError as e:
        return f"no Prefect deployment ({e}; start it with scripts/start_prefect.sh)"


def poll_interval() -> float:
    """The worker's poll interval (scripts/start_prefect.sh writes it next to the API URL)."""
    try:
        return float((HOME / "poll").read_text())
    except (OSError, ValueError):
        return 2.0


def _submitted_at(client: Any, flow_run_id: uuid.UUID) -> float | None:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs = client.read_logs(
        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
    )
    for log in logs:
        if log.message.startswith(SUBMITTED) and " submitted " in log.message:
            return float(log.timestamp.timestamp())
    return None


def _one_run(client: Any, deployment_id: uuid.UUID) -> float:
    """Seconds from a new run's Scheduled state to its job's submission; waits for the run."""
    run = client.create_flow_run_from_deployment(deployment_id)
    scheduled = run.state.timestamp.timestamp()
    submitted = wait_for(
        lambda: _submitted_at(client, run.id), 120, "the job's submission", interval=0.2
    )
    wait_for(
        lambda: (s := client.read_flow_run(run.id).state) is not None and s.is_final(),
        300,
        "the flow run to end",
        interval=0.5,
    )
    return float(submitted) - scheduled


def _measure(row: Row, runs: int) -> None:
    problem = _problem()
    if problem:
        raise SkipRow(problem)
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: (HOME / "api_url").read_text().strip()}):
        source = flow.from_source(source=str(FLOW_DIR), entrypoint="prefect_flow.py:noop")
        deployment_id = source.deploy(  # type: ignore[union-attr]
            name=f"bench-{uuid.uuid4().hex[:8]}",
            work_pool_name=(HOME / "pool").read_text().strip(),
            job_variables={"scheduler": "local_cwd"},
            print_next_steps=False,
        )
        with get_client(sync_client=True) as client:
            samples = [_one_run(client, deployment_id) for _ in range(runs)]  # type: ignore[arg-type]
    row.samples = {"shipyard": samples}
    row.shipyard = median(samples)
    row.note = f"poll interval {poll_interval():g} s; samples {[round(s, 2) for s in samples]}"


# -- 100 concurrent flow runs tracked by one worker ----------------------------------------------


def _slurm_problem() -> str | None:
    if not shutil.which("sinfo"):
        return "Slurm is not installed"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed ({e})"
    if p.returncode != 0:
        return f"no Slurm cluster ({p.stderr.strip()}); start it with scripts/start_slurm.sh"
    return None


@dataclass
class SlurmCall:
    """One Slurm command the worker ran: when (this host's clock), which, its arguments."""

    at: float
    name: str
    args: list[str]

    def job_ids(self) -> int:
        """How many jobs a ``squeue -j`` call asks about (0 for other calls)."""
        if self.name != "squeue" or "-j" not in self.args[:-1]:
            return 0
        return len(self.args[self.args.index("-j") + 1].split(","))


class SlurmWrappers:
    """A directory of wrappers for the Slurm commands, put first on the worker's ``PATH``: each
    appends ``<time> <name> <args>`` to a log, then runs the real command. ``sbatch`` also gets
    ``--begin=now+3600`` (the job stays PENDING: no flow engine starts, no node is used) and
    records the job ids it queued, so the bench cancels every one of them."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "slurm-bin"
        self.log = root / "slurm-calls.log"
        self.ids = root / "slurm-job-ids"
        self.dir.mkdir(parents=True)
        for name in SLURM_CLI:
            real = shutil.which(name)
            if real is not None:
                self._write(name, real)

    def _write(self, name: str, real: str) -> None:
        head = f'#!/bin/bash\necho "$EPOCHREALTIME {name} $*" >> "{self.log}"\n'
        if name == "sbatch":
            body = (
                f'out=$("{real}" --begin=now+3600 "$@")\nrc=$?\n'
                f'[ -z "$out" ] || echo "$out" >> "{self.ids}"\n'
                'printf "%s\\n" "$out"\nexit $rc\n'
            )
        else:
            body = f'exec "{real}" "$@"\n'
        path = self.dir / name
        path.write_text(head + body)
        path.chmod(0o755)

    def calls(self) -> list[SlurmCall]:
        """Every call so far, in order."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            at, name, *args = line.split(" ")
            out.append(SlurmCall(float(at), name, args))
        return out

    def cancel_all(self) -> None:
        """Cancels every job the wrappers queued (the real ``scancel``, once)."""
        if not self.ids.exists():
            return
        ids = re.findall(r"\d+", " ".join(x.split(";")[0] for x in self.ids.read_text().split()))
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=120)


class BenchWorker:
    """A Shipyard worker for the bench's own pool, started as users start one (``prefect worker
    start -p POOL -t shipyard --name NAME``) with the environment scripts/start_prefect.sh gives
    its worker, plus: the Slurm wrappers first on ``PATH``, and the worker loggers at DEBUG with
    each record's time as seconds since the epoch (Prefect's logging settings from the
    environment), so its ``poll N: M Shipyard jobs`` records say when each poll's status calls
    were done."""

    def __init__(self, root: Path, pool: str, api_url: str, wrappers: SlurmWrappers) -> None:
        self.name = f"bench-worker-{uuid.uuid4().hex[:8]}"
        self.root = root
        self.log = root / "worker.out"
        venv_bin = Path(sys.executable).parent
        self.argv = [str(venv_bin / "prefect"), "worker", "start", "-p", pool, "-t", "shipyard"]
        self.argv += ["--name", self.name]
        self.env = {
            "PATH": os.pathsep.join([str(wrappers.dir), str(venv_bin), "/usr/sbin:/usr/bin:/bin"]),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "PREFECT_HOME": str(root / "home"),
            "PREFECT_API_URL": api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "2",
            "SHIPYARD_STATE_DIR": str(root / "state"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # (the bench's own tree)
            "PREFECT_LOGGING_LOGGERS_PREFECT_WORKERS_LEVEL": "DEBUG",
            "PREFECT_LOGGING_FORMATTERS_STANDARD_FORMAT": (
                "%(created).6f | %(levelname)-7s | %(name)s - %(message)s"
            ),
        }
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> None:
        """Starts the worker; returns once it says it started."""
        (self.root / "work").mkdir(exist_ok=True)
        self._out = open(self.log, "wb")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.root / "work", stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for(self._started, 180, "the bench worker to start", interval=0.2)

    def _started(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise RuntimeError(f"the bench worker exited: {self.log.read_text()[-500:]}")
        return "started" in self.log.read_text(errors="replace")

    def polls(self) -> list[tuple[float, int, int]]:
        """``(time, poll number, jobs)`` of each poll so far."""
        text = self.log.read_text(errors="replace")
        found = (_POLL_RE.match(line) for line in text.splitlines())
        return [(float(m[1]), int(m[2]), int(m[3])) for m in found if m]

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 60 s); the worker leaves its jobs to the bench's clean-up."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(30)
        if self._out is not None:
            self._out.close()


def _runs(client: Any, deployment_id: uuid.UUID) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    flt = FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]))
    return list(client.read_flow_runs(flow_run_filter=flt))


def _keep_in_flight(client: Any, deployment_id: uuid.UUID, timeout: float) -> int:
    """Waits until N_RUNS unfinished runs of the deployment have a job (an infrastructure pid),
    replacing the runs that ended meanwhile (a busy server can fail the worker's submission of
    a run: Prefect marks it Crashed); returns how many were replaced."""
    replaced = 0
    deadline = time.monotonic() + timeout
    while True:
        live = [r for r in _runs(client, deployment_id) if not (r.state and r.state.is_final())]
        if sum(bool(r.infrastructure_pid) for r in live) >= N_RUNS:
            return replaced
        for _ in range(N_RUNS - len(live)):
            client.create_flow_run_from_deployment(deployment_id)
            replaced += 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"{timeout}s and not {N_RUNS} runs with a job: {len(live)} live")
        time.sleep(1.0)


def first_watch_ramp(interval: float) -> float:
    """Seconds a newly watched job is polled on its own before it joins the rounds of the
    others (:mod:`core.watch.polling`: FIRST_DELAY, doubling up to the poll interval)."""
    from core.watch.polling import FIRST_DELAY

    total, delay = 0.0, FIRST_DELAY
    while delay < interval:
        total, delay = total + delay, delay * 2
    return total


def _full_polls(worker: BenchWorker) -> list[tuple[float, int, int]] | None:
    """The first WINDOW_POLLS + 1 consecutive polls of N_RUNS jobs each, once there are and
    the last job's first-watch polls are over (the row counts the steady state)."""
    from prefect_tasks.worker import DEFAULT_POLL_INTERVAL

    ramp = first_watch_ramp(DEFAULT_POLL_INTERVAL)
    streak: list[tuple[float, int, int]] = []
    full_since: float | None = None
    for poll in worker.polls():
        if poll[2] != N_RUNS or (streak and poll[1] != streak[-1][1] + 1):
            streak, full_since = [], None
        if poll[2] == N_RUNS:
            full_since = poll[0] if full_since is None else full_since
            if poll[0] >= full_since + ramp:
                streak.append(poll)
        if len(streak) > WINDOW_POLLS:
            return streak
    return None


def _window(worker: BenchWorker, calls: SlurmWrappers) -> tuple[list[int], list[SlurmCall]]:
    """Waits for WINDOW_POLLS + 1 consecutive polls of all N_RUNS jobs (after the last one's
    first-watch polls); returns the Slurm calls between each poll's record and the next one's
    (that is, of polls 2 .. WINDOW_POLLS + 1), per poll, and all of them."""
    polls = wait_for(
        lambda: _full_polls(worker), 60 + 10 * WINDOW_POLLS, "the worker's polls", interval=0.5
    )
    all_calls = calls.calls()
    per_poll, in_window = [], []
    for (t0, _, _), (t1, _, _) in zip(polls, polls[1:], strict=False):
        these = [c for c in all_calls if t0 < c.at <= t1]
        per_poll.append(len(these))
        in_window += these
    return per_poll, in_window


def _start_runs(client: Any, pool: str) -> uuid.UUID:
    """Deploys the no-op flow to ``pool`` on Slurm and starts N_RUNS runs of it."""
    from prefect import flow

    source = flow.from_source(source=str(FLOW_DIR), entrypoint="prefect_flow.py:noop")
    deployment_id = source.deploy(  # type: ignore[union-attr]
        name=f"bench-track-{uuid.uuid4().hex[:8]}",
        work_pool_name=pool,
        job_variables={"scheduler": "slurm"},
        print_next_steps=False,
    )
    for _ in range(N_RUNS):
        client.create_flow_run_from_deployment(deployment_id)
    return deployment_id  # type: ignore[return-value]


def _fill_tracking(
    row: Row, per_poll: list[int], window: list[SlurmCall], took: float, replaced: int
) -> None:
    """Calls per poll of all the jobs: the Slurm calls of the window over those of them that
    asked about every one of the N_RUNS jobs (each such call is one poll of them all; any other
    call, or a poll split over several calls, counts above 1). Counted per poll of the worker's
    own loop instead, a window over two poll ticks read 2 now and then: the worker's loop (its
    poll interval plus its work) and the status poller's ticks drift apart."""
    whole = [c.at for c in window if c.job_ids() >= N_RUNS]
    sizes = sorted({c.job_ids() for c in window if c.name == "squeue"})
    by_name = dict(Counter(c.name for c in window))
    gaps = [b - a for a, b in zip(whole, whole[1:], strict=False)]
    row.samples = {"shipyard": [float(n) for n in per_poll]}
    row.shipyard = len(window) / len(whole) if whole else float("inf")
    row.raw = 1.0
    row.note = (
        f"{len(window)} Slurm calls, {len(whole)} of them for all {N_RUNS} pending jobs"
        f" ({by_name or 'none'}; jobs per squeue {sizes}; median {median(gaps) if gaps else 0:.2f}"
        f" s between them); per poll of the worker's loop {per_poll}; all {N_RUNS} tracked"
        f" {took:.0f} s after the runs were created"
        + (
            f" ({replaced} runs crashed by the server before submission, replaced)"
            if replaced
            else ""
        )
    )


def _clean_up(client: Any, pool: str, deployment_id: uuid.UUID | None) -> None:
    if deployment_id is not None:
        for run in _runs(client, deployment_id):
            client.delete_flow_run(run.id)
        client.delete_deployment(deployment_id)
    client.delete_work_pool(pool)


def _measure_tracking(row: Row, tmp: str) -> None:
    """100 flow runs of a deployment in flight at once, tracked by one worker; the Slurm
    commands that worker runs per poll.

    The jobs are kept cheap by keeping them queued: the worker's ``sbatch`` queues each with a
    start time an hour away (its wrapper adds ``--begin=now+3600``), so the runs stay Pending
    with their job's handle as infrastructure pid, no flow engine starts and no node is used,
    while the worker polls all 100 jobs. The worker is the bench's own (its own pool and name,
    started like scripts/start_prefect.sh's), so its ``PATH`` can hold the counting wrappers:
    every Slurm command it runs, for whatever reason, is counted, between the debug records it
    writes after each poll's status calls.
    """
    problem = _problem() or _slurm_problem()
    if problem:
        raise SkipRow(problem)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_tasks.worker import ShipyardWorker

    root = Path(tmp) / f"prefect-track-{uuid.uuid4().hex[:8]}"
    wrappers = SlurmWrappers(root)
    api_url = (HOME / "api_url").read_text().strip()
    pool = f"bench-{uuid.uuid4().hex[:8]}"
    worker = BenchWorker(root, pool, api_url, wrappers)
    deployment_id = None
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        template = ShipyardWorker.get_default_base_job_template()
        client.create_work_pool(
            WorkPoolCreate(name=pool, type="shipyard", base_job_template=template)
        )
        try:
            worker.start()
            t0 = time.monotonic()
            deployment_id = _start_runs(client, pool)
            replaced = _keep_in_flight(client, deployment_id, 900)
            took = time.monotonic() - t0
            per_poll, window = _window(worker, wrappers)
            _fill_tracking(row, per_poll, window, took, replaced)
        finally:
            worker.stop()
            wrappers.cancel_all()
            _clean_up(client, pool, deployment_id)
        shutil.rmtree(root, ignore_errors=True)


ROWS = ("submit", "track")


def run(ctx: Ctx, rows: tuple[str, ...] = ROWS) -> list[Row]:
    """The section's rows (``rows``: some of ROWS)."""
    sec = Section("prefect", ctx.runs, ctx.verbose)
    if "submit" in rows:
        poll = poll_interval()
        target = Target("abs", poll + 1, f"<= poll interval + 1 s ({poll + 1:g} s)")
        sec.measure(sec.row(ROW, target), lambda row: _measure(row, ctx.runs))
    if "track" in rows:
        sec.measure(
            sec.row(TRACK_ROW, exactly(1, "call per poll"), "calls", raw_name="1 squeue per poll"),
            lambda row: _measure_tracking(row, ctx.tmp),
        )
    return sec.rows


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    from bench.harness import table

    p = argparse.ArgumentParser(prog="python -m bench.prefect_bench")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--row", choices=ROWS, action="append", help="only this row (repeatable)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="shipyard-bench-")
    try:
        rows = run(Ctx(tmp=tmp, runs=args.runs), tuple(args.row or ROWS))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows))
    print(f"{time.monotonic() - t0:.1f}s")
    return 1 if any(r.status in ("MISS", "ERROR") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
