"""What the soak may not leave behind: processes of its jobs, Docker containers still running,
networks, submit-request volumes, Slurm jobs still queued or running."""

from __future__ import annotations

import os
import subprocess

from tests.helpers import live_processes, wait_until
from tests.soak.common import Plan


def lines_of(*cmd: str) -> list[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=True)
    return [line for line in proc.stdout.splitlines() if line.strip()]


def processes(plan: Plan) -> list[str]:
    mine = {os.getpid(), os.getppid()}
    return [f"pid {p}: {c[:120]}" for p, c in live_processes(plan.tag) if p not in mine]


def containers(plan: Plan) -> list[str]:
    rows = lines_of(
        "docker", "ps", "--filter", "label=shipyard.app_id", "--format",
        '{{.Names}} {{.Label "shipyard.app_id"}} {{.State}}',
    )  # fmt: skip
    return [f"container {r}" for r in rows if plan.tag in r]


def networks(plan: Plan) -> list[str]:
    rows = lines_of("docker", "network", "ls", "--format", "{{.Name}}")
    return [f"network {r}" for r in rows if plan.tag in r]


def volumes(plan: Plan) -> tuple[list[str], list[str]]:
    """Submit-request volumes left (leaks) and the records kept by design (tombstones, key
    claims: removed after ``record_retention``)."""
    rows = [r for r in lines_of("docker", "volume", "ls", "--format", "{{.Name}}") if plan.tag in r]
    return [f"volume {r}" for r in rows if r.startswith("shipyard-submit-")], rows


def slurm_jobs(plan: Plan) -> list[str]:
    rows = lines_of("squeue", "-h", "-o", "%i %j %T")
    return [f"slurm job {r}" for r in rows if plan.tag in r]


def leaks(plan: Plan) -> tuple[list[str], int]:
    """Everything the soak left that it should not have (waiting up to a minute for it to
    go), and the number of Docker records kept by design."""

    def found() -> list[str]:
        return processes(plan) + containers(plan) + networks(plan) + slurm_jobs(plan)

    try:
        wait_until(lambda: not found(), 60, "the soak's processes and jobs to go", max_delay=2.0)
    except AssertionError:
        pass
    submit_volumes, records = volumes(plan)
    return found() + submit_volumes, len(records) - len(submit_volumes)
