"""ShipyardOperator called directly, against the real local scheduler (local_cwd)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, AirflowTaskTerminated, TaskDeferred

from airflow_provider._common import idempotency_key
from airflow_provider.operators import (
    ShipyardJobFailedError,
    ShipyardJobSilentError,
    ShipyardOperator,
)
from airflow_provider.triggers import ShipyardJobTrigger
from core.runner import attempt_key
from core.specs import AppDef, AppState, Role, parse_app_handle
from tests.helpers import wait_until
from tests.integration.airflow.helpers import StateStoreStub, TaskInstanceStub, context

pytestmark = pytest.mark.airflow


def sh(name: str, script: str, replicas: int = 1) -> AppDef:
    return AppDef(name, [Role(name, entrypoint="sh", args=["-c", script], num_replicas=replicas)])


def key_of(ti: TaskInstanceStub) -> str:
    return idempotency_key(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)


@pytest.fixture
def cancel_after(runner: Any) -> Any:
    """Handles registered here are cancelled at teardown (nothing outlives a test)."""
    handles: list[str] = []
    yield handles
    for h in handles:
        runner.cancel(h)


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        ShipyardOperator(task_id="t", app=sh("a", "true"), poll_interval=0)
    with pytest.raises(ValueError, match="app: expected"):
        ShipyardOperator(task_id="t", app=42)  # type: ignore[arg-type]


def test_bad_app_fails_before_anything_starts(runner: Any) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job", app={"name": "bad", "roles": [{"name": "r", "num_replicas": -2}]}
    )
    with pytest.raises(ValueError, match=r"roles\[0\]"):
        op.execute(context(ti))
    assert runner.find("local_cwd", key_of(ti)) is None
    assert ti.xcoms == {}


def test_runs_and_pushes_xcoms(runner: Any) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job", app=sh("hello", "echo hello $WHO", replicas=2), env={"WHO": "airflow"}
    )
    handle = op.execute(context(ti, StateStoreStub()))
    assert parse_app_handle(handle).scheduler_backend == "local_cwd"
    usage = ti.xcoms.pop("usage")
    assert ti.xcoms == {
        "shipyard_app_handle": handle,
        "app_id": parse_app_handle(handle).app_id,
        "state": "SUCCEEDED",
        "reason": "exit_code",  # why it ended
        "result": {},  # no replica wrote one
    }
    assert sorted(usage) == ["hello/0", "hello/1"]
    assert all(u["wall_time"] > 0 and u["cpu_time"] >= 0 for u in usage.values()), usage
    assert runner.status(handle).state == AppState.SUCCEEDED
    # tagged with the task instance's key
    assert runner.find("local_cwd", key_of(ti)) == handle


WRITE_RESULT = (
    "import json, os, sys; r = int(os.environ['SHIPYARD_REPLICA_ID']);"
    " open(os.environ['SHIPYARD_RESULT_FILE'], 'w').write("
    "json.dumps({'rank': r}) if r == 0 else '{broken')"
)


def test_results_reach_xcom_and_bad_ones_the_log(capfd: pytest.CaptureFixture[str]) -> None:
    ti = TaskInstanceStub()
    app = AppDef(
        "res", [Role("train", entrypoint="python3", args=["-c", WRITE_RESULT], num_replicas=2)]
    )
    op = ShipyardOperator(task_id="job", app=app, cfg={"result_replicas": "all"}, deferrable=False)
    capfd.readouterr()
    op.execute(context(ti, StateStoreStub()))
    assert ti.xcoms["result"] == {"train": {"0": {"rank": 0}}}
    log = capfd.readouterr().out  # the task log (Airflow's logger writes it to stdout here)
    assert "result: train/1: result file is not valid JSON" in log, log
    assert "usage: train/0: wall " in log and "usage: train/1: wall " in log, log


def test_preflight_fails_fast_with_every_problem(runner: Any, tmp_path: Path) -> None:
    ti = TaskInstanceStub()
    app = AppDef(
        "pre",
        [
            Role("a", entrypoint="/nonexistent/train"),
            Role("b", entrypoint="sh", args=["-c", f"touch {tmp_path}/started"]),
            Role("c", entrypoint="no-such-command-anywhere"),
        ],
    )
    op = ShipyardOperator(task_id="job", app=app, preflight=True)
    with pytest.raises(AirflowFailException) as info:
        op.execute(context(ti, StateStoreStub()))
    text = str(info.value)
    assert text.startswith("pre-flight found 2 problem(s) on local_cwd:"), text
    assert "- roles[0].entrypoint:" in text and "- roles[2].entrypoint:" in text, text
    assert runner.find("local_cwd", key_of(ti)) is None
    assert not (tmp_path / "started").exists()
    # nothing wrong: the job runs
    good = ShipyardOperator(task_id="job2", app=sh("pre-ok", "true"), preflight=True)
    assert runner.status(good.execute(context(TaskInstanceStub()))).state == AppState.SUCCEEDED


def test_job_failure_raises_with_state_exit_code_and_last_lines() -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job", app=sh("boom", "echo first; echo 'last words'; exit 5"), poll_interval=0.2
    )
    with pytest.raises(ShipyardJobFailedError) as info:
        op.execute(context(ti))
    msg = str(info.value)
    assert "FAILED" in msg and "boom/0=5" in msg and "last words" in msg
    assert info.value.exit_codes == {"boom": [5]}
    assert ti.xcoms["state"] == "FAILED"


def test_wait_for_completion_false_returns_while_the_job_runs(
    runner: Any, cancel_after: list[str]
) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(task_id="job", app=sh("bg", "sleep 60"), wait_for_completion=False)
    handle = op.execute(context(ti))
    cancel_after.append(handle)
    assert runner.status(handle).state in (AppState.RUNNING, AppState.PENDING, AppState.SUBMITTED)
    assert ti.xcoms["app_id"] == parse_app_handle(handle).app_id
    assert ti.xcoms["state"] in ("RUNNING", "PENDING", "SUBMITTED")


def test_on_kill_cancels_the_job(runner: Any) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(task_id="job", app=sh("long", "echo up; sleep 120"), poll_interval=0.2)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(context(ti))
        except BaseException as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    handle = wait_until(lambda: op._handle, what="submission")
    wait_until(lambda: runner.status(handle).state == AppState.RUNNING, what="RUNNING")
    op.on_kill()
    t.join(60)
    assert not t.is_alive()
    assert runner.status(handle).state == AppState.CANCELLED
    assert len(errors) == 1 and isinstance(errors[0], ShipyardJobFailedError)
    assert "CANCELLED" in str(errors[0])


class _ResetStore(StateStoreStub):
    """``task_state_store`` as this try reaches it, through its task-instance id: once Airflow
    replaced the try (a new id), nothing is found there."""

    replaced = False

    def get(self, key: str, default: Any = None) -> Any:
        return default if self.replaced else super().get(key, default)


class _StatedTaskInstance(TaskInstanceStub):
    """A task instance whose current state Airflow gives as ``state``."""

    state: str | None = "running"

    def get_task_states(self, dag_id: str, **kwargs: Any) -> dict[str, Any]:
        assert kwargs["task_ids"] == [self.task_id] and kwargs["run_ids"] == [self.run_id]
        return {self.run_id: {self.task_id: self.state}}


@pytest.mark.parametrize(
    ("replaced", "state", "cancels"),
    [
        (True, None, False),  # reset by a new scheduler (LocalExecutor's orphaned task)
        (True, "running", False),  # ... and its next try runs already
        (True, "restarting", True),  # cleared by a user: the job runs again
        (False, "running", True),  # this try is still the task's (a timeout, a SIGTERM)
    ],
)
def test_on_kill_leaves_the_job_to_the_try_that_replaces_this_one(
    runner: Any, tmp_path: Path, replaced: bool, state: str | None, cancels: bool
) -> None:
    gate = tmp_path / "gate"
    ti, store = _StatedTaskInstance(), _ResetStore()
    script = f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done"
    op = ShipyardOperator(task_id="job", app=sh("superseded", script), poll_interval=0.2)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(op.execute(context(ti, store)))
        except BaseException as e:  # noqa: BLE001 - looked at below
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    handle = wait_until(lambda: op._handle, what="submission")
    try:
        wait_until(lambda: runner.status(handle).state == AppState.RUNNING, what="RUNNING")
        # (the task follows the job: until then on_kill cancels it, as it cannot tell yet
        # whether the try was replaced)
        wait_until(lambda: op._this_try is not None, what="the task to follow the job")
        store.replaced, ti.state = replaced, state
        if cancels:
            op.on_kill()
            assert runner.status(handle).state == AppState.CANCELLED
        else:  # the job goes on, for the next try to re-attach to; this try stops
            with pytest.raises(AirflowTaskTerminated, match="replaced by a new try"):
                op.on_kill()
            assert runner.status(handle).state == AppState.RUNNING
            gate.touch()
        t.join(60)
        assert not t.is_alive()
        if cancels:
            assert isinstance(outcome[0], ShipyardJobFailedError), outcome
        else:  # (here this try's thread saw the job end: it leaves the XComs to the next try)
            assert isinstance(outcome[0], AirflowTaskTerminated), outcome
            assert runner.status(handle).state == AppState.SUCCEEDED
    finally:
        runner.cancel(handle)


def test_deferrable_frees_the_worker_and_completes_in_the_trigger(runner: Any) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job",
        app=sh("deferred", 'for i in 1 2 3; do echo "step $i"; sleep 0.5; done', replicas=2),
        deferrable=True,
        poll_interval=0.2,
    )
    with pytest.raises(TaskDeferred) as info:
        op.execute(context(ti, StateStoreStub()))
    trigger = info.value.trigger
    assert isinstance(trigger, ShipyardJobTrigger)
    assert info.value.method_name == "execute_complete"
    # execute returned (the worker slot is free) while the job still runs
    handle = trigger.app_handle
    assert runner.status(handle).state in (AppState.RUNNING, AppState.PENDING, AppState.SUBMITTED)

    async def first_event() -> Any:
        return await anext(trigger.run())

    event = asyncio.run(first_event())
    assert event.payload["status"] == "success"
    assert event.payload["state"] == "SUCCEEDED"
    assert event.payload["log_lines"] == 6  # the trigger logged every line of both replicas
    resumed = ShipyardOperator(
        task_id="job", app=sh("deferred", "true"), deferrable=True, poll_interval=0.2
    )
    assert resumed.execute_complete(context(ti), event.payload) == handle
    assert ti.xcoms["state"] == "SUCCEEDED"


def test_execute_complete_adds_the_lines_after_the_event_cursor(
    runner: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """What the trigger did not log (its event's cursor) the resumed task logs, once."""
    ti = TaskInstanceStub()
    handle = runner.run(sh("rest", 'for i in 1 2 3 4; do echo "step $i"; done'), "local_cwd")
    runner.wait(handle, timeout=60)
    op = ShipyardOperator(task_id="job", app=sh("rest", "true"), deferrable=True)
    capfd.readouterr()
    event = {"status": "success", "app_handle": handle, "state": "SUCCEEDED"}
    assert op.execute_complete(context(ti), {**event, "log_cursor": {"rest/0": 3}}) == handle
    out = capfd.readouterr().out
    assert "rest/0 step 4" in out
    assert not any(f"rest/0 step {i}" in out for i in (1, 2, 3))
    # an event without a cursor (the trigger could not stream): every line
    op.execute_complete(context(ti), event)
    out = capfd.readouterr().out
    assert all(f"rest/0 step {i}" in out for i in (1, 2, 3, 4))


def test_retry_reattaches_when_the_worker_died_after_submitting(runner: Any) -> None:
    """Try 1 submitted and died before storing the handle; try 2 follows the same job."""
    ti1 = TaskInstanceStub()
    first = ShipyardOperator(task_id="job", app=sh("once", "sleep 2; echo done"), poll_interval=0.2)
    handle = first.submit_job(context(ti1))  # ... and the worker is gone

    ti2 = ti1.retry()
    second = ShipyardOperator(
        task_id="job", app=sh("once", "sleep 2; echo done"), poll_interval=0.2
    )
    assert second.execute(context(ti2, StateStoreStub())) == handle
    assert ti2.xcoms["state"] == "SUCCEEDED"
    assert (
        runner.find("local_cwd", attempt_key(key_of(ti1), 2)) is None
    )  # nothing new was submitted


def test_retry_reattaches_through_the_task_state_store(runner: Any) -> None:
    """ResumableJobMixin: the handle stored by try 1 is followed by try 2."""
    store = StateStoreStub()
    ti1 = TaskInstanceStub()
    handle = ShipyardOperator(task_id="job", app=sh("stored", "sleep 1")).submit_job(context(ti1))
    store[ShipyardOperator.external_id_key] = handle

    ti2 = ti1.retry()
    op = ShipyardOperator(task_id="job", app=sh("stored", "sleep 1"), poll_interval=0.2)
    assert op.execute(context(ti2, store)) == handle
    assert store[ShipyardOperator.external_id_key] == handle


def test_retry_takes_the_result_of_a_job_that_already_succeeded(runner: Any) -> None:
    ti1 = TaskInstanceStub()
    store = StateStoreStub()
    handle = ShipyardOperator(task_id="job", app=sh("fast", "echo fast")).execute(
        context(ti1, store)
    )
    ti2 = ti1.retry()
    op = ShipyardOperator(task_id="job", app=sh("fast", "echo fast"))
    assert op.execute(context(ti2, store)) == handle
    assert ti2.xcoms["state"] == "SUCCEEDED"
    assert runner.find("local_cwd", attempt_key(key_of(ti1), 2)) is None


def test_retry_after_a_failed_job_submits_a_new_one(runner: Any) -> None:
    ti1 = TaskInstanceStub()
    store = StateStoreStub()
    op1 = ShipyardOperator(task_id="job", app=sh("flaky", "exit 1"), poll_interval=0.2)
    with pytest.raises(ShipyardJobFailedError):
        op1.execute(context(ti1, store))
    failed = store[ShipyardOperator.external_id_key]

    ti2 = ti1.retry()
    op2 = ShipyardOperator(task_id="job", app=sh("flaky", "exit 0"), poll_interval=0.2)
    handle = op2.execute(context(ti2, store))
    assert handle != failed
    assert runner.find("local_cwd", attempt_key(key_of(ti1), 2)) == handle
    assert store[ShipyardOperator.external_id_key] == handle


def test_app_file_is_jinja_templated_even_by_absolute_path(tmp_path: Path) -> None:
    app_file = tmp_path / "app.yaml"
    app_file.write_text(
        "name: templated\n"
        "roles:\n"
        "  - name: r\n"
        "    entrypoint: echo\n"
        "    args: ['{{ params.word }}', 'conf.yaml']\n"
    )
    with DAG("templating", schedule=None, params={"word": "rendered"}):
        op = ShipyardOperator(
            task_id="job",
            app=str(app_file),
            cfg={"log_dir": "/tmp/{{ run_id }}"},
            env={"RUN": "{{ run_id }}"},
        )
    op.render_template_fields({"params": {"word": "rendered"}, "run_id": "r1"})  # type: ignore[arg-type]
    app = op._app_def()
    assert app.roles[0].args == ["rendered", "conf.yaml"]
    assert app.roles[0].env == {"RUN": "r1"}
    assert op.cfg == {"log_dir": "/tmp/r1"}


def test_appdef_and_dict_strings_are_templated_but_not_loaded_as_files() -> None:
    with DAG("templating2", schedule=None):
        from_appdef = ShipyardOperator(
            task_id="a",
            app=AppDef("x", [Role("r", entrypoint="echo", args=["{{ run_id }}", "conf.yaml"])]),
        )
        from_dict = ShipyardOperator(
            task_id="b",
            app={
                "name": "y",
                "roles": [{"name": "r", "entrypoint": "echo", "args": ["{{ run_id }}", "c.yml"]}],
            },
        )
    original = from_appdef.app
    for op in (from_appdef, from_dict):
        op.render_template_fields({"run_id": "r2"})  # type: ignore[arg-type]
        assert op._app_def().roles[0].args[0] == "r2"
        assert op._app_def().roles[0].args[1] in ("conf.yaml", "c.yml")
    # the DAG's AppDef is not modified by rendering (the next run renders it afresh)
    assert isinstance(original, AppDef) and original.roles[0].args[0] == "{{ run_id }}"


def test_transient_status_errors_do_not_fail_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend hiccup (which the real backends cannot produce on demand) is retried."""
    from core.runner import Runner

    real = Runner.status
    failures = iter([True, True])  # the first two status calls after submission fail

    def flaky(self: Runner, handle: str) -> Any:
        if next(failures, False):
            raise OSError("backend hiccup")
        return real(self, handle)

    ti = TaskInstanceStub()
    op = ShipyardOperator(task_id="job", app=sh("hiccup", "sleep 0.5; echo ok"), poll_interval=0.1)
    handle = op.submit_job(context(ti))
    monkeypatch.setattr(Runner, "status", flaky)
    assert op.poll_until_complete(handle, context(ti)) == handle
    assert ti.xcoms["state"] == "SUCCEEDED"


def test_deferred_task_timing_out_cancels_the_job(runner: Any) -> None:
    """A deferred task resumed with the trigger timeout (execution_timeout) cancels its job."""
    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
    from airflow.sdk.exceptions import TaskDeferralTimeout

    ti = TaskInstanceStub()
    store = StateStoreStub()
    op = ShipyardOperator(task_id="job", app=sh("slow", "sleep 120"), deferrable=True)
    with pytest.raises(TaskDeferred):
        op.execute(context(ti, store))
    handle = store[ShipyardOperator.external_id_key]
    # the task resumes on a worker with a fresh operator: it finds the job by the stored handle
    resumed = ShipyardOperator(task_id="job", app=sh("slow", "sleep 120"), deferrable=True)
    with pytest.raises(TaskDeferralTimeout):
        resumed.resume_execution(
            TRIGGER_FAIL_REPR,
            {"error": TriggerFailureReason.TRIGGER_TIMEOUT},
            context(ti, store),  # type: ignore[arg-type]
        )
    wait_until(lambda: runner.status(handle).state == AppState.CANCELLED, what="CANCELLED")


# replica 0 prints, then hangs without a word; replica 1 keeps printing
HANGS = 'if [ "$SHIPYARD_REPLICA_ID" = 0 ]; then echo "init done"; exec sleep 300; fi; while true; do echo beat; sleep 0.2; done'


@pytest.mark.parametrize("where", ["task", "app"])
def test_max_silence_cancels_a_job_whose_replica_hangs(runner: Any, where: str) -> None:
    """Set on the task, or in the app (its metadata.max_silence, for any waiter)."""
    ti = TaskInstanceStub()
    app = sh("hang", HANGS, replicas=2)
    if where == "app":
        app.metadata["max_silence"] = "2"
    own = 2 if where == "task" else None
    op = ShipyardOperator(task_id="job", app=app, max_silence=own, poll_interval=0.2)
    with pytest.raises(ShipyardJobSilentError) as info:
        op.execute(context(ti, StateStoreStub()))
    text = str(info.value)
    assert "no log line for 2s from hang/0 (max_silence)" in text, text
    assert ti.xcoms["reason"] == "silent"
    assert "hang/0: 'init done'" in text and "hang/1" not in text.split("last lines:")[0], text
    handle = runner.find("local_cwd", key_of(ti))
    assert wait_until(lambda: runner.status(handle).is_terminal(), 30, "the job to end")
    assert runner.status(handle).state == AppState.CANCELLED


def test_max_silence_in_the_trigger_cancels_and_names_the_replica(runner: Any) -> None:
    ti = TaskInstanceStub()
    op = ShipyardOperator(
        task_id="job",
        app=sh("hangd", HANGS, replicas=2),
        max_silence=2,
        poll_interval=0.2,
        deferrable=True,
    )
    with pytest.raises(TaskDeferred) as info:
        op.execute(context(ti, StateStoreStub()))
    trigger = info.value.trigger
    assert trigger.serialize()[1]["max_silence"] == 2.0

    async def first_event() -> Any:
        return await anext(trigger.run())

    event = asyncio.run(first_event())
    assert event.payload["status"] == "failure" and event.payload["silent"] == ["hangd/0"]
    assert runner.status(trigger.app_handle).state == AppState.CANCELLED
    with pytest.raises(ShipyardJobSilentError, match=r"hangd/0: 'init done'") as silent:
        op.execute_complete(context(ti), event.payload)
    assert ti.xcoms["reason"] == "silent" and not isinstance(silent.value, AirflowFailException)
    op.fail_fast_on = ("silent",)  # (a hang that would hang again: no retry)
    with pytest.raises(AirflowFailException, match=r"reason silent is in fail_fast_on"):
        op.execute_complete(context(ti), event.payload)


def test_a_job_over_its_time_limit_fails_without_retry_when_told(runner: Any) -> None:
    op = ShipyardOperator(
        task_id="limited", app=sh("limited", "sleep 300"), cfg={"time_limit": "1s"},
        fail_fast_on=["oom", "timeout"], poll_interval=0.2,
    )  # fmt: skip
    ti = TaskInstanceStub()
    with pytest.raises(AirflowFailException, match=r"reason timeout.*no retry") as info:
        op.execute(context(ti, StateStoreStub()))
    assert not isinstance(info.value, ShipyardJobFailedError)  # (AirflowFailException: no retry)
    assert ti.xcoms["reason"] == "timeout" and ti.xcoms["state"] == "FAILED"
    plain = ShipyardOperator(
        task_id="limited2", app=sh("limited", "sleep 300"), cfg={"time_limit": "1s"},
        poll_interval=0.2,
    )  # fmt: skip
    with pytest.raises(ShipyardJobFailedError, match="time limit of 1s reached"):
        plain.execute(context(TaskInstanceStub(task_id="limited2"), StateStoreStub()))
    with pytest.raises(ValueError, match="fail_fast_on: expected reasons among"):
        ShipyardOperator(task_id="bad", app=sh("x", "true"), fail_fast_on=["full moon"])
