"""The command-line users of the soak: each submits jobs with ``shipyard run`` in turn on local
processes, Slurm and Docker (with an idempotency key, submitted again with it after exit 75 as
the README says), follows them with ``shipyard status``, cancels every other one with
``shipyard cancel`` once it printed, and reads its lines with ``shipyard log``."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

from tests.helpers import wait_until
from tests.soak.common import Outcome, Plan, shipyard

BACKENDS = ("local_cwd", "slurm", "local_docker")
IMAGE = "shipyard-test/busybox:latest"
#: a job run to its end prints LINES lines; one to be cancelled would print CANCEL_LINES
LINES, CANCEL_LINES, EVERY = 20, 1200, 0.5
FULL = 3
#: exit code of a backend that could not be reached (the job's fate unknown: ask again)
UNREACHABLE = 75
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def want(n: int) -> list[str]:
    return [f"line {i} of replica 0" for i in range(1, n + 1)]


class User:
    """One command-line user: their state directory, working directory and jobs."""

    def __init__(self, plan: Plan, number: int) -> None:
        self.plan, self.number = plan, number
        self.state_dir = plan.workdir / "state"
        self.cwd = plan.workdir / "work"
        self.outcomes: list[Outcome] = []

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return shipyard(list(args), self.state_dir, self.cwd, timeout)

    def again(self, args: list[str], what: str, timeout: float = 240) -> str:
        """Runs ``shipyard ARGS`` again while it exits 75; returns its output."""

        def once() -> str | None:
            proc = self.cli(*args)
            if proc.returncode == UNREACHABLE:
                return None
            if proc.returncode != 0:
                raise RuntimeError(f"shipyard {what}: exit {proc.returncode}: {proc.stderr[-800:]}")
            return proc.stdout or " "

        return str(wait_until(once, timeout, f"shipyard {what} to answer", max_delay=2.0))

    def run(self) -> None:
        """Submits jobs until the soak's window closes."""
        n = 0
        while self.plan.now() < self.plan.window:
            backend = BACKENDS[n % len(BACKENDS)]
            cancel = (n // len(BACKENDS)) % 2 == 1
            name = f"{self.plan.tag}c{self.number}x{n}"
            outcome = Outcome(f"cli-{backend}", name, "CANCELLED" if cancel else "SUCCEEDED")
            self.outcomes.append(outcome)
            try:
                self.job(outcome, backend, cancel)
            except Exception as e:
                outcome.fail(f"{type(e).__name__}: {e}")
            n += 1

    def job(self, outcome: Outcome, backend: str, cancel: bool) -> None:
        lines = CANCEL_LINES if cancel else LINES
        script = f": {outcome.name}; " + (
            f'for i in $(seq 1 {lines}); do echo "line $i of replica ${{replica_id}}"; '
            f"sleep {EVERY}; done"
        )
        args = ["run", "-s", backend, "--json", "--name", outcome.name]
        args += ["--role-name", outcome.name, "--idempotency-key", outcome.name]
        if backend == "local_docker":
            args += ["--image", IMAGE]
        out = self.again([*args, "--", "sh", "-c", script], f"run {outcome.name}")
        outcome.handle = json.loads(out)["app_handle"]
        if cancel:
            first = f"{outcome.name}'s first lines"
            wait_until(lambda: len(self.lines(outcome.handle)) >= 3, 300, first, max_delay=1.0)
            self.again(["cancel", outcome.handle, "--wait", "--json"], f"cancel {outcome.handle}")
        outcome.state = self.final_state(outcome.handle)
        if outcome.state != outcome.expected:
            outcome.fail(f"{outcome.handle} {outcome.state}")
        got = self.lines(outcome.handle)
        outcome.lines = len(got)
        if got != want(lines if not cancel else len(got)):
            outcome.fail(f"{len(got)} lines, not 1..n once each in order: {got[:5]}..")

    def final_state(self, handle: str) -> str:
        def ended() -> str | None:
            proc = self.cli("status", handle, "--json")
            if proc.returncode != 0:
                return None
            state = str(json.loads(proc.stdout)["state"])
            return state if state in TERMINAL else None

        return str(wait_until(ended, 600, f"{handle} to end", max_delay=1.0))

    def lines(self, handle: str) -> list[str]:
        proc = self.cli("log", handle)
        return proc.stdout.splitlines() if proc.returncode == 0 else []


def duplicates(plan: Plan, users: list[User]) -> list[str]:
    """Names of the users' jobs that the backends hold more than once (or not at all)."""
    names = Counter[str]()
    for backend in ("local_cwd", "local_docker"):
        proc = users[0].cli("list", "-s", backend, "--json")
        for app in json.loads(proc.stdout or "[]"):
            names[str(app["app_id"]).rsplit("-", 1)[0]] += 1
    for job_name in slurm_job_names(plan):
        names[job_name.rsplit("-", 1)[0]] += 1
    wanted = [o.name for u in users for o in u.outcomes if o.handle]
    return [f"{n}: {names[n]} jobs" for n in wanted if names[n] != 1]


def slurm_job_names(plan: Plan) -> list[str]:
    """The names of this soak's Slurm jobs, from accounting (each job once)."""
    proc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", "now-1days", "--format=JobName,JobID"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    jobs = {line.split("|")[1]: line.split("|")[0] for line in proc.stdout.splitlines() if line}
    return [name for name in jobs.values() if name.startswith(plan.tag)]


def workdirs(plan: Plan) -> None:
    for sub in ("state", "work"):
        Path(plan.workdir / sub).mkdir(parents=True, exist_ok=True)
