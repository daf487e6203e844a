"""The soak's summary, as Markdown (printed, and written with ``--report``)."""

from __future__ import annotations

import datetime
from collections import defaultdict

from tests.soak.common import Outcome, Plan
from tests.soak.restarts import Restart


def counts(outcomes: list[Outcome]) -> list[str]:
    kinds: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        kinds[o.kind].append(o)
    rows = [
        "| jobs | n | final state right | lines checked | retried tries | failed checks |",
        "|---|---|---|---|---|---|",
    ]
    for kind, items in kinds.items():
        by_state: dict[str, int] = defaultdict(int)
        for o in items:
            by_state[o.expected] += 1
        wanted = ", ".join(f"{n} {s}" for s, n in by_state.items())
        right = sum(o.state == o.expected for o in items)
        rows.append(
            f"| {kind} ({wanted}) | {len(items)} | {right} | {sum(o.lines for o in items)}"
            f" | {sum(o.tries > 1 for o in items)} | {sum(bool(o.failures) for o in items)} |"
        )
    return rows


def restarts_table(restarts: list[Restart]) -> list[str]:
    rows = [
        "| at | service | job replicas running | down (stop to answering again) | result |",
        "|---|---|---|---|---|",
    ]
    for r in restarts:
        at = f"{int(r.at // 60)}:{int(r.at % 60):02d}"
        result = r.error or "back"
        rows.append(f"| {at} | {r.service} | {r.replicas} | {r.downtime:.1f} s | {result} |")
    return rows


def summary(
    plan: Plan,
    began: datetime.datetime,
    elapsed: float,
    outcomes: list[Outcome],
    restarts: list[Restart],
    left: list[str],
    records: int,
    unrestored: list[str],
) -> str:
    failures = [f"- {o.kind} {o.name} {o.handle}: {'; '.join(o.failures)}" for o in outcomes
                if o.failures]  # fmt: skip
    notes = [f"- {o.kind} {o.name} {o.handle}: {'; '.join(o.notes)}" for o in outcomes if o.notes]
    lines = [
        f"Soak {plan.tag}, started {began:%Y-%m-%d %H:%M} UTC: {plan.minutes:g} min of load"
        f" (scale {plan.scale:g}), a restart every {plan.every:g} s; {elapsed / 60:.1f} min"
        " until every job was checked.",
        "",
        *counts(outcomes),
        "",
        *restarts_table(restarts),
        "",
        f"Left behind: {', '.join(left) if left else 'nothing'} (processes of the soak's jobs,"
        " Docker containers, networks, submit-request volumes, Slurm jobs); Docker records kept"
        f" by design (tombstones, key claims): {records}.",
        f"Services restored at the end: {'; '.join(unrestored) if unrestored else 'all'}.",
        "",
        f"Failures: {len(failures)}" + (":" if failures else "."),
        *failures[:60],
        "",
        f"Outside Shipyard (noted, not failures): {len(notes)}" + (":" if notes else "."),
        *notes[:60],
    ]
    return "\n".join(lines) + "\n"
