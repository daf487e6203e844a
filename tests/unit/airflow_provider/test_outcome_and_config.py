"""The operator's ``skip_on_exit_code``, ``do_xcom_push`` and ``return_result`` against the
in-memory scheduler, and the provider's ``[shipyard]`` configuration section (declared in the
provider's metadata, read through Airflow's configuration before the environment variables)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider import config, get_provider_info
from airflow_provider._common import make_runner
from airflow_provider.links import job_url
from airflow_provider.operators import HANDLE_XCOM_KEY, ShipyardJobFailedError, ShipyardOperator
from airflow_provider.outcome import failed_exit_code, skip_exit_codes
from core.errors import BackendUnavailableError
from core.specs import AppDef, AppState, AppStatus, ReplicaStatus, Role, RoleStatus
from tests.integration.airflow.helpers import TaskInstanceStub, context
from tests.unit.core.memory_scheduler import MemoryScheduler, Scenario, use_memory_scheduler

pytestmark = pytest.mark.airflow

APP = AppDef("outcome", [Role("w", entrypoint="echo", num_replicas=2)])


@pytest.fixture(autouse=True)
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_memory_scheduler(monkeypatch)
    for name in ("UI_URL", "RETRY_BUDGET", "SESSION"):
        monkeypatch.delenv(f"AIRFLOW__SHIPYARD__{name}", raising=False)
        monkeypatch.delenv(f"SHIPYARD_{name}", raising=False)
    yield
    MemoryScheduler.on_submit = None


def ends(state: AppState) -> None:
    """The next app submitted to the memory scheduler ends in ``state`` (exit code 1 if not
    SUCCEEDED) right after its submit."""

    def submitted(app_id: str) -> None:
        timer = threading.Timer(0.05, MemoryScheduler.finish, (app_id, state))
        timer.daemon = True
        timer.start()

    MemoryScheduler.on_submit = submitted


def run(ti: TaskInstanceStub | None = None, **kwargs: Any) -> Any:
    op = ShipyardOperator(task_id="job", app=APP, scheduler="memory", poll_interval=0.1, **kwargs)
    return op.execute(context(ti or TaskInstanceStub()))


# -- skip_on_exit_code ---------------------------------------------------------------------------


def test_skip_on_exit_code_takes_an_int_or_ints() -> None:
    assert skip_exit_codes(None) == frozenset()
    assert skip_exit_codes(3) == {3}
    assert skip_exit_codes([3, 4]) == skip_exit_codes((4, 3)) == {3, 4}
    for bad in ("3", [3, "4"], True, 2.5):
        with pytest.raises(ValueError, match="^skip_on_exit_code: "):
            skip_exit_codes(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^skip_on_exit_code: "):
        ShipyardOperator(task_id="t", app=APP, skip_on_exit_code="3")  # type: ignore[arg-type]


def test_the_exit_code_is_the_failing_replicas() -> None:
    def replica(k: int, state: AppState, code: int | None, reason: str | None) -> ReplicaStatus:
        return ReplicaStatus(k, state, "w", "h", exit_code=code, reason=reason)

    # replica 1 failed with 3; the gang termination then stopped replica 0 (SIGTERM: -15)
    gang = [replica(0, AppState.FAILED, -15, "signal"), replica(1, AppState.FAILED, 3, "exit_code")]
    status = AppStatus(AppState.FAILED, roles=[RoleStatus("w", gang)])
    assert failed_exit_code(status) == 3
    killed = [replica(0, AppState.SUCCEEDED, 0, "exit_code"), replica(1, AppState.FAILED, -9, None)]
    assert failed_exit_code(AppStatus(AppState.FAILED, roles=[RoleStatus("w", killed)])) == -9
    assert failed_exit_code(AppStatus(AppState.FAILED, roles=[])) is None
    assert failed_exit_code(AppStatus(AppState.SUCCEEDED, roles=[RoleStatus("w", gang)])) is None
    assert failed_exit_code(None) is None


def test_a_failed_job_skips_the_task_when_its_exit_code_is_listed() -> None:
    ends(AppState.FAILED)  # (the memory scheduler's failed replicas exit 1)
    ti = TaskInstanceStub()
    with pytest.raises(AirflowSkipException, match=r"exit code 1, which is in skip_on_exit_code"):
        run(ti, skip_on_exit_code=[1, 2])
    assert ti.xcoms["state"] == "FAILED"
    ends(AppState.FAILED)
    with pytest.raises(ShipyardJobFailedError):
        run(skip_on_exit_code=2)  # another code: the task fails
    ends(AppState.CANCELLED)
    with pytest.raises(ShipyardJobFailedError):
        run(skip_on_exit_code=1)  # a cancelled job is no failed job: never skipped


# -- do_xcom_push, return_result ---------------------------------------------------------------


def test_do_xcom_push_false_pushes_nothing() -> None:
    ends(AppState.SUCCEEDED)
    ti = TaskInstanceStub()
    handle = run(ti, do_xcom_push=False)
    assert handle.startswith("memory://")
    assert ti.xcoms == {}
    ends(AppState.FAILED)
    ti = TaskInstanceStub()
    with pytest.raises(ShipyardJobFailedError):
        run(ti, do_xcom_push=False)
    assert ti.xcoms == {}


def test_the_handle_has_an_xcom_of_its_own() -> None:
    ends(AppState.SUCCEEDED)
    ti = TaskInstanceStub()
    # (the memory scheduler collects no results: the return value is None, and no XCom result)
    assert run(ti, return_result=True) is None
    assert ti.xcoms[HANDLE_XCOM_KEY].startswith("memory://shipyard/outcome-")
    assert ti.xcoms["state"] == "SUCCEEDED" and "result" not in ti.xcoms


def test_return_result_needs_the_job_to_end() -> None:
    with pytest.raises(ValueError, match="^return_result: .*wait_for_completion"):
        ShipyardOperator(task_id="t", app=APP, return_result=True, wait_for_completion=False)


# -- [shipyard] configuration --------------------------------------------------------------------


def test_the_section_is_declared_as_providers_declare_theirs() -> None:
    options = get_provider_info()["config"]["shipyard"]["options"]
    assert sorted(options) == ["retry_budget", "session", "ui_url"]
    for option in options.values():
        assert option["description"] and option["version_added"] and option["example"]
        assert option["default"] is None  # (unset: the environment variable applies)
    assert options["retry_budget"]["type"] == "float"


def test_airflow_config_comes_before_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    handle = "slurm://shipyard/hpc1:1234"
    assert config.ui_url_template() is None and job_url(handle, None, None) is None
    monkeypatch.setenv("SHIPYARD_UI_URL", "https://env/{job_id}")
    assert job_url(handle, None, None) == "https://env/1234"
    monkeypatch.setenv("AIRFLOW__SHIPYARD__UI_URL", "https://conf/{job_id}")
    assert job_url(handle, None, None) == "https://conf/1234"
    assert job_url(handle, None, "https://task/{job_id}") == "https://task/1234"  # the task's
    monkeypatch.setenv("AIRFLOW__SHIPYARD__UI_URL", "https://conf/{jobid}")
    with pytest.raises(ValueError, match=r"^\[shipyard\] ui_url: "):
        job_url(handle, None, None)

    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", "45")
    assert config.retry_budget() == 45.0
    monkeypatch.setenv("AIRFLOW__SHIPYARD__RETRY_BUDGET", "7.5")
    assert config.retry_budget() == 7.5
    monkeypatch.setenv("AIRFLOW__SHIPYARD__RETRY_BUDGET", "soon")
    with pytest.raises(ValueError, match=r"^\[shipyard\] retry_budget: "):
        config.retry_budget()

    monkeypatch.setenv("SHIPYARD_SESSION", "from-env")
    with make_runner() as runner:
        assert runner.session_name == "from-env"
    monkeypatch.setenv("AIRFLOW__SHIPYARD__SESSION", "from-conf")
    with make_runner() as runner, make_runner("the-tasks") as own:
        assert (runner.session_name, own.session_name) == ("from-conf", "the-tasks")


def test_the_operator_submits_under_the_configured_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__SHIPYARD__SESSION", "team-a")
    ends(AppState.SUCCEEDED)
    assert run().startswith("memory://team-a/")


def test_the_configured_retry_budget_is_the_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", "600")  # (what core alone would take)
    monkeypatch.setenv("AIRFLOW__SHIPYARD__RETRY_BUDGET", "1")
    started = time.monotonic()
    with Scenario("outage"), pytest.raises(BackendUnavailableError, match="kept failing"):
        run()
    assert time.monotonic() - started < 30
