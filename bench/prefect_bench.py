"""Prefect rows, against the real server and Shipyard worker (scripts/start_prefect.sh).

* worker: flow run scheduled -> job submitted. From the Scheduled state the API gave the run when
  it was created to the worker's "Shipyard job ... submitted" record in the run's log (both
  timestamps from this host's clock). The physical limit is the worker's poll interval: a run
  created just after a poll waits for the next one; the target allows 1 s of work on top.

``python -m bench.prefect_bench`` runs this section alone (``--runs N``).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import Ctx
from bench.harness import Row, Section, SkipRow, Target, median, wait_for

HOME = Path(os.environ.get("SHIPYARD_PREFECT_HOME", "/var/lib/shipyard-prefect"))
FLOW_DIR = Path(__file__).resolve().parent
ROW = "worker: flow run scheduled -> job submitted"
SUBMITTED = "Shipyard job "


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


def run(ctx: Ctx) -> list[Row]:
    """The section's rows."""
    sec = Section("prefect", ctx.runs, ctx.verbose)
    poll = poll_interval()
    target = Target("abs", poll + 1, f"<= poll interval + 1 s ({poll + 1:g} s)")
    sec.measure(sec.row(ROW, target), lambda row: _measure(row, ctx.runs))
    return sec.rows


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    from bench.harness import table

    p = argparse.ArgumentParser(prog="python -m bench.prefect_bench")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows = run(Ctx(tmp=tempfile.mkdtemp(prefix="shipyard-bench-"), runs=args.runs))
    print(table(rows))
    print(f"{time.monotonic() - t0:.1f}s")
    return 1 if any(r.status in ("MISS", "ERROR") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
