"""Flows the Prefect deployment tests deploy to the Shipyard work pool (tests/deploy_prefect)."""

from __future__ import annotations

import os
import pwd
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger


@flow(log_prints=True)
def hello(greeting: str = "hello") -> str:
    """Prints a line the tests look for in the worker's log and returns where it ran."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # (a container's user without a passwd entry)
        user = str(os.getuid())
    where = f"pid={os.getpid()} host={os.uname().nodename} python={sys.executable} user={user}"
    print(f"{greeting} from the Shipyard job ({where})")
    return where


@flow
def failing(reason: str = "deliberately") -> None:
    """Raises, so the flow run fails and the engine exits 1."""
    get_run_logger().info("about to fail %s", reason)
    raise RuntimeError(f"failing {reason}")


@flow
def wait_for_gate(gate: str) -> str:
    """Runs until the file ``gate`` exists (the tests cancel it or kill the worker meanwhile)."""
    logger = get_run_logger()
    logger.info("waiting for %s", gate)
    started = Path(gate + ".started")
    started.write_text(str(os.getpid()))
    while not Path(gate).exists():
        time.sleep(0.2)
    logger.info("gate %s opened", gate)
    return "opened"


@flow
def block_job(backend: str, message: str) -> str:
    """Runs a one-role job with the tasks, configured by the saved Shipyard Backend block
    ``backend`` (its scheduler and default run options)."""
    from prefect_tasks import submit_job, wait_for_job

    app = {"name": "blockjob", "roles": [{"name": "echo", "entrypoint": "echo", "args": [message]}]}
    handle = submit_job(app, scheduler=backend)
    wait_for_job(handle, cluster=backend)
    return handle


@flow
def numbered_lines(tag: str, gate: str, every: float = 0.2, limit: int = 3000) -> int:
    """Prints ``TAG line 0``, ``TAG line 1``, ... to its stdout, one every ``every`` seconds,
    until the file ``gate`` exists (or ``limit`` lines), then ``TAG end N``. Plain prints, not
    logs: only the worker's forwarding of the job's output shows them."""
    n = 0
    while n < limit and not Path(gate).exists():
        print(f"{tag} line {n}", flush=True)
        n += 1
        time.sleep(every)
    print(f"{tag} end {n}", flush=True)
    return n


@flow
def array_sweep(n: int = 4) -> list[int]:
    """Runs a local array of ``n`` elements (at most 2 at once) from inside the flow's
    Shipyard job and logs each element's result."""
    from prefect_tasks import run_array_job

    app = {
        "name": "sweep",
        "roles": [
            {
                "name": "sq",
                "entrypoint": "sh",
                "args": ["-c", 'echo "$((${params.x} * ${params.x}))" > "$SHIPYARD_RESULT_FILE"'],
            }
        ],
    }
    result = run_array_job(app, params=[{"x": i} for i in range(n)], max_parallel=2)
    squares = [r["sq"][0] if r else -1 for r in result.results]
    get_run_logger().info("squares %s", squares)
    return squares


@flow
def logged_lines(tag: str, gate: str, every: float = 0.25, limit: int = 1000) -> int:
    """Logs ``TAG line 0``, ``TAG line 1``, ... with the run's logger (so to the flow run's logs
    through the API), one every ``every`` seconds, until the file ``gate`` exists (or ``limit``
    lines), then ``TAG end N``."""
    logger = get_run_logger()
    n = 0
    while n < limit and not Path(gate).exists():
        logger.info("%s line %d", tag, n)
        n += 1
        time.sleep(every)
    logger.info("%s end %d", tag, n)
    return n
