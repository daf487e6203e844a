"""The Prefect part of the soak: flow runs of a deployment on the ``shipyard`` pool (the
``logged_lines`` flow: numbered lines through the run's logger), started through the API and
run by the Shipyard worker, each checked for its state, its one job and each line once."""

from __future__ import annotations

import functools
import uuid
from typing import Any

from tests.deploy.prefect.prefect_api import FINAL, STATE_DIR, FlowRun, deploy
from tests.deploy.prefect.test_faults_prefect import run_logs
from tests.helpers import wait_until
from tests.soak.common import (
    Outcome,
    Plan,
    final_state,
    local_apps,
    retrying,
    shipyard,
    wait_for,
)

#: lines a run logs, one every EVERY seconds
LINES, EVERY = 40, 0.5
FULL = 50


def expected(tag: str) -> list[str]:
    return [f"{tag} line {i}" for i in range(LINES)] + [f"{tag} end {LINES}"]


def start_run(deployment: str, params: dict[str, Any]) -> FlowRun:
    """Starts a run through the API, keyed by its tag: a retry after a lost answer gets the
    same run."""
    from prefect.deployments import run_deployment

    key = str(params["tag"])
    run = run_deployment(uuid.UUID(deployment), parameters=params, timeout=0, idempotency_key=key)
    return FlowRun(run.id)  # type: ignore[union-attr]


def submit_all(plan: Plan, runs: list[tuple[Outcome, FlowRun | None]]) -> None:
    """Deploys the flow once, then starts the soak's flow runs spread over its window."""
    deployment = retrying(
        lambda: deploy("logged_lines", {"scheduler": "local_cwd"}), 180, "deploying the flow"
    )
    n = plan.count(FULL)
    gate = plan.workdir / "never-opened"
    for i in range(n):
        wait_for(plan.at(i, n) + plan.window / n / 2)
        tag = f"{plan.tag}p{i}"
        outcome = Outcome("prefect-flow-run", tag, "COMPLETED")
        params = {"tag": tag, "gate": str(gate), "every": EVERY, "limit": LINES}
        try:
            run = retrying(lambda: start_run(deployment, params), 180, f"starting {tag}")  # noqa: B023
        except RuntimeError as e:
            outcome.fail(str(e))
            run = None
        runs.append((outcome, run))


def numbered(run: FlowRun, tag: str) -> list[str]:
    return [m for _, m in run_logs(run) if m.startswith(f"{tag} ")]


def job_log(handle: str, plan: Plan) -> str:
    """The job's output as ``shipyard log`` prints it (from the backend)."""
    return shipyard(["log", handle], STATE_DIR, plan.workdir).stdout


def job_output(handle: str, plan: Plan) -> list[str]:
    """The messages the flow's engine printed (its job's output, from the backend)."""
    return [line.split(" - ", 1)[1] for line in job_log(handle, plan).splitlines() if " - " in line]


def subsequence(got: list[str], want: list[str]) -> bool:
    it = iter(want)
    return all(line in it for line in got)


def check_lines(outcome: Outcome, run: FlowRun, plan: Plan) -> None:
    """Each line once, in order, in the job's output (Shipyard's part); in the run's logs the
    API has, lines may be missing only (Prefect's log handler drops a batch the server refused)."""
    want = expected(outcome.name)
    output = job_output(outcome.handle, plan)
    got = [m for m in output if m.startswith(f"{outcome.name} ")]
    outcome.lines = len(got)
    if got != want:
        outcome.fail(f"job output: {len(got)} lines, not {len(want)} once each: {got[:3]}..")
    if sum(m.startswith("Beginning flow run") for m in output) != 1:
        outcome.fail("not one engine start in the job's output")
    try:  # the last logs may reach the server just after the final state
        wait_until(lambda: numbered(run, outcome.name)[-1:] == want[-1:], 60, "the last line")
    except AssertionError:
        pass
    logged = numbered(run, outcome.name)
    if logged != want and subsequence(logged, want) and len(set(logged)) == len(logged):
        outcome.notes.append(f"the run's API logs miss {len(want) - len(logged)} of its lines")
    elif logged != want:
        outcome.fail(f"API logs: {len(logged)} lines, repeated or out of order: {logged[:3]}..")


def refused_at_start(handle: str, plan: Plan) -> bool:
    """Whether the job's engine ended at its first API call, refused (the server down): no
    engine start in its output, and the engine's error is a refused connection."""
    out = job_log(handle, plan)
    return (
        "Beginning flow run" not in out
        and "exited with unexpected exception" in out
        and "Connection refused" in out
    )


def check(
    outcome: Outcome, run: FlowRun, apps: dict[str, list[dict[str, Any]]], plan: Plan
) -> None:
    """Checks one ended run: completed, one submit, one job, its lines once. A run whose
    engine's first API call was refused (the server down as it started) is noted instead: the
    run crashes under any worker, since Prefect's client retries a refused connection only once
    it has connected (a wrong URL fails fast); the job must then have failed and said so."""
    flow_run = run.read()
    outcome.handle = str(flow_run.infrastructure_pid)
    refused = outcome.state == "CRASHED" and refused_at_start(outcome.handle, plan)
    if refused:
        outcome.notes.append(
            "its engine's first API call was refused (the Prefect server was down): the run"
            " crashed, as under any worker; its job failed and the run says so"
        )
        message = flow_run.state.message if flow_run.state else None
        if "non-zero status code" not in (message or ""):
            outcome.fail(f"flow run {run.id} crashed without its job's exit: {message!r}")
    elif outcome.state != outcome.expected:
        outcome.fail(f"flow run {run.id} {outcome.state}")
    messages = [m for _, m in run_logs(run)]
    submits = [m for m in messages if m.startswith("Shipyard job ") and " (idempotency key " in m]
    if len(submits) != 1:
        outcome.fail(f"{len(submits)} submits: {submits}")
    jobs = apps.get(flow_run.name, [])
    if [a["app_handle"] for a in jobs] != [outcome.handle]:
        outcome.fail(f"jobs of {flow_run.name}: {jobs} (run's job {outcome.handle})")
    elif jobs[0]["state"] != ("FAILED" if refused else "SUCCEEDED"):
        outcome.fail(f"job {outcome.handle} {jobs[0]['state']}")
    if not refused:
        check_lines(outcome, run, plan)


def by_name(plan: Plan, names: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The worker's local jobs of these flow runs (app ids start with the run's name)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for app in local_apps(STATE_DIR, plan.workdir):
        name = str(app["app_id"]).rsplit("-", 1)[0]
        if name in names:
            found.setdefault(name, []).append(app)
    return found


def check_all(plan: Plan, runs: list[tuple[Outcome, FlowRun | None]]) -> list[Outcome]:
    """Waits for every run to end, then checks each."""
    started = [(o, r) for o, r in runs if r is not None]
    for outcome, run in started:
        try:
            outcome.state = retrying(
                functools.partial(final_state, run.state, FINAL, f"flow run {run.id}", 900),
                60,
                "reading the run",
            )
        except RuntimeError as e:
            outcome.fail(str(e))
    names = {retrying(lambda: r.read().name, 60, "reading the run") for _, r in started}  # noqa: B023
    apps = retrying(lambda: by_name(plan, names), 60, "listing the worker's jobs")
    for outcome, run in started:
        if outcome.state == "?":
            continue
        try:
            check(outcome, run, apps, plan)
        except Exception as e:
            outcome.fail(f"checking it: {type(e).__name__}: {e}")
    return [o for o, _ in runs]
