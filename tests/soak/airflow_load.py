"""The Airflow part of the soak: deferred tasks triggered through the deployment's REST API
(``shipyard_deploy_deferrable``: a two-replica local job followed by the triggerer), each
checked for its state, its one job and each line of it once in the task's log."""

from __future__ import annotations

from typing import Any

from tests.deploy.airflow.airflow_api import FINISHED_RUN, STATE_DIR, AirflowAPI, Run
from tests.soak.common import Outcome, Plan, counted, final_state, local_apps, retrying, wait_for

DAG = "shipyard_deploy_deferrable"
#: lines per replica, one every EVERY seconds (about 40 s a job)
LINES, EVERY = 40, 1.0
FULL = 100


def expected(replica: int) -> list[str]:
    return [f"job/{replica} line {i} of replica {replica}" for i in range(1, LINES + 1)]


def trigger(api: AirflowAPI, name: str, conf: dict[str, Any]) -> Run:
    """Triggers a run with id ``name``: a retry after a lost answer finds it (409) instead of
    triggering a second one."""
    try:
        api.request(
            "POST",
            f"/dags/{DAG}/dagRuns",
            json={"dag_run_id": name, "logical_date": None, "conf": conf},
        )
    except AssertionError as e:
        if "HTTP 409" not in str(e):
            raise
    return Run(api, DAG, name)


def submit_all(plan: Plan, runs: list[tuple[Outcome, Run | None]]) -> None:
    """Triggers the soak's deferred tasks, spread over its window."""
    api = AirflowAPI()
    api.wait_for_dag(DAG)
    if api.get(f"/dags/{DAG}")["is_paused"]:
        api.request("PATCH", f"/dags/{DAG}", json={"is_paused": False})
    n = plan.count(FULL)
    for i in range(n):
        wait_for(plan.at(i, n))
        name = f"{plan.tag}a{i}"
        outcome = Outcome("airflow-deferred", name, "success")
        conf = {"name": name, "script": f": {name}; {counted(LINES, EVERY)}"}
        try:
            run = retrying(lambda: trigger(api, name, conf), 180, f"triggering {name}")  # noqa: B023
        except RuntimeError as e:
            outcome.fail(str(e))
            run = None
        runs.append((outcome, run))


def check(outcome: Outcome, run: Run, apps: dict[str, list[dict[str, Any]]]) -> None:
    """Checks one ended run: success, one submit over all its tries, one job, its lines once."""
    if outcome.state != outcome.expected:
        race = " (apache/airflow#72716: stale exit event)" if run.stale_exit_race() else ""
        outcome.fail(f"run {run.run_id} {outcome.state}{race}")
    ti = run.ti("job")
    outcome.tries = int(ti["try_number"]) or 1
    logs = [run.log_events("job", t) for t in range(1, outcome.tries + 1)]
    submitted = [e.split()[1] for log in logs for e in log if e.startswith("submitted ")]
    if len(submitted) != 1:
        outcome.fail(f"{len(submitted)} 'submitted' lines over {outcome.tries} tries")
        return
    outcome.handle = submitted[0]
    jobs = apps.get(outcome.name, [])
    if [a["app_handle"] for a in jobs] != [outcome.handle]:
        outcome.fail(f"jobs named {outcome.name}: {jobs} (task submitted {outcome.handle})")
    elif jobs[0]["state"] != "SUCCEEDED":
        outcome.fail(f"job {outcome.handle} {jobs[0]['state']}")
    for k in (0, 1):
        got = [e for e in logs[-1] if e.startswith(f"job/{k} ")]
        outcome.lines += len(got)
        if got != expected(k):
            outcome.fail(f"replica {k}: {len(got)} lines, not 1..{LINES} once each: {got[:3]}..")
    if outcome.state == "success" and run.xcom("job") != outcome.handle:
        outcome.fail(f"XCom {run.xcom('job')} is not {outcome.handle}")


def by_name(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """The deployment's local jobs of this soak, by app name."""
    found: dict[str, list[dict[str, Any]]] = {}
    for app in local_apps(STATE_DIR, plan.workdir):
        name = str(app["app_id"]).rsplit("-", 1)[0]
        if name.startswith(plan.tag):
            found.setdefault(name, []).append(app)
    return found


def check_all(plan: Plan, runs: list[tuple[Outcome, Run | None]]) -> list[Outcome]:
    """Waits for every run to end, then checks each."""
    for outcome, run in runs:
        if run is not None:
            try:
                outcome.state = final_state(run.state, FINISHED_RUN, f"run {run.run_id}", 900)
            except AssertionError as e:
                outcome.fail(str(e))
    apps = retrying(lambda: by_name(plan), 60, "listing the deployment's jobs")
    for outcome, run in runs:
        if run is None or outcome.state == "?":
            continue
        try:
            check(outcome, run, apps)
        except Exception as e:
            outcome.fail(f"checking it: {type(e).__name__}: {e}")
    return [o for o, _ in runs]
