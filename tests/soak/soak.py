"""The soak of issue 30: ``python -m tests.soak.soak --minutes 10`` (``make soak``).

Mixed load on the real services of this machine (scripts/start_services.sh) -- deferred Airflow
tasks through the deployment's REST API, Prefect flow runs through the Shipyard worker, users of
the ``shipyard`` command submitting and cancelling local, Slurm and Docker jobs -- with one
service restarted every ``--every`` seconds (triggerer, Prefect server, slurmctld, Airflow
scheduler, Prefect worker, in turn). Then every job is checked (final state, one backend job,
each line once and in order) and nothing may be left behind. Prints a summary; exits 1 on any
failure.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.soak.common import Outcome, Plan, wait_for
from tests.soak.restarts import Restart, restart, restore_all


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.soak.soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0, help="length of the load (10)")
    p.add_argument("--scale", type=float, default=1.0, help="scales the job counts (1: 100/50)")
    p.add_argument("--every", type=float, default=120.0, help="seconds between restarts (120)")
    p.add_argument("--users", type=int, default=3, help="command-line users (3)")
    p.add_argument("--report", type=Path, help="also write the summary (Markdown) here")
    return p.parse_args(argv)


def problems() -> list[str]:
    """Why the services cannot take the soak (none if they all answer)."""
    from tests.deploy.airflow.airflow_api import airflow_problem
    from tests.deploy.prefect.prefect_api import prefect_problem
    from tests.services import docker_problem, slurm_problem

    found = {
        "airflow": airflow_problem(),
        "prefect": prefect_problem(),
        "slurm": slurm_problem(),
        "docker": docker_problem(),
    }
    return [f"{k}: {v}" for k, v in found.items() if v]


def rotate(plan: Plan, done: list[Restart]) -> None:
    """Restarts a service every ``plan.every`` seconds (the first half a period in)."""
    k = 0
    while (when := plan.every / 2 + k * plan.every) < plan.minutes * 60:
        wait_for(plan.started + when)
        record = restart(k, plan.started, plan.tag)
        done.append(record)
        print(f"[{plan.now():6.0f}s] restarted {record.service} in {record.downtime:.1f}s"
              f" ({record.replicas} job replicas running)"
              f"{' ERROR ' + record.error if record.error else ''}", flush=True)  # fmt: skip
        k += 1


def start(target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def load(plan: Plan, users: int) -> tuple[list[Outcome], list[Restart]]:
    """Runs the load and the restarts; returns every job checked and the restarts done."""
    from tests.soak import airflow_load, cli_load, prefect_load

    cli_load.workdirs(plan)
    airflow_runs: list[Any] = []
    prefect_runs: list[Any] = []
    done: list[Restart] = []
    people = [cli_load.User(plan, u) for u in range(users)]
    threads = [
        start(airflow_load.submit_all, plan, airflow_runs),
        start(prefect_load.submit_all, plan, prefect_runs),
        start(rotate, plan, done),
        *(start(u.run) for u in people),
    ]
    for t in threads:
        t.join()
    print(f"[{plan.now():6.0f}s] load and restarts over; checking", flush=True)
    checked: dict[str, list[Outcome]] = {}
    checks = [
        start(lambda: checked.update(a=airflow_load.check_all(plan, airflow_runs))),
        start(lambda: checked.update(p=prefect_load.check_all(plan, prefect_runs))),
    ]
    for t in checks:
        t.join()
    cli = [o for u in people for o in u.outcomes]
    dups = cli_load.duplicates(plan, people)
    if dups:
        cli.append(Outcome("cli-duplicates", "-", "none", "found", failures=dups))
    return checked.get("a", []) + checked.get("p", []) + cli, done


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if found := problems():
        print("the services are not ready:", *found, sep="\n  ", file=sys.stderr)
        return 2
    from tests.deploy.prefect.prefect_api import api_url

    os.environ["PREFECT_API_URL"] = api_url()  # before Prefect reads its settings
    tag = f"soak{uuid.uuid4().hex[:6]}"
    plan = Plan(tag, args.minutes, args.scale, args.every, Path(f"/tmp/shipyard-{tag}"))
    began = datetime.datetime.now(datetime.UTC)
    print(f"soak {tag}: {args.minutes} min, scale {args.scale}, restart every {args.every}s",
          flush=True)  # fmt: skip
    outcomes, restarts = load(plan, args.users)
    from tests.soak.leaks import leaks
    from tests.soak.report import summary

    left, records = leaks(plan)
    unrestored = restore_all()
    text = summary(plan, began, time.monotonic() - plan.started, outcomes, restarts, left,
                   records, unrestored)  # fmt: skip
    print(text)
    if args.report:
        args.report.write_text(text)
    failed = any(o.failures for o in outcomes) or left or unrestored
    return 1 if failed or any(r.error for r in restarts) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
