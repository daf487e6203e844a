"""The operator's "Shipyard job" extra link (a URL template filled with the job's ids)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider import get_provider_info
from airflow_provider.links import ShipyardJobLink, check_ui_url_template, job_url
from airflow_provider.operators import ShipyardOperator
from core.specs import AppDef, AppState, AppStatus, Role
from tests.integration.airflow.helpers import TaskInstanceStub, context


def test_template_fields() -> None:
    url = job_url("slurm://shipyard/hpc1:1234", None, "https://ui/{scheduler}/{session}?j={job_id}")
    assert url == "https://ui/slurm/shipyard?j=1234"
    url = job_url("slurm://shipyard/hpc1:1234", None, "https://ui/{app_id}")
    assert url == "https://ui/hpc1%3A1234"


def test_the_backends_own_url_wins_and_no_template_means_no_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status = AppStatus(AppState.RUNNING, ui_url="https://backend/job/7")
    assert job_url("local_cwd://s/a", status, "https://ui/{app_id}") == "https://backend/job/7"
    monkeypatch.delenv("SHIPYARD_UI_URL", raising=False)
    assert job_url("local_cwd://s/a", None, None) is None
    monkeypatch.setenv("SHIPYARD_UI_URL", "https://env/{app_id}")
    assert job_url("local_cwd://s/a", None, None) == "https://env/a"


def test_a_bad_template_names_its_field() -> None:
    with pytest.raises(ValueError, match=r"ui_url: expected a URL template .*\{jobid\}|jobid"):
        check_ui_url_template("https://ui/{jobid}", "ui_url")


def test_the_operator_stores_the_link_and_refuses_a_bad_template(runner: Any) -> None:
    app = AppDef("linked", [Role("r", entrypoint="true")])
    ti = TaskInstanceStub()
    op = ShipyardOperator(task_id="job", app=app, ui_url="https://ui/{scheduler}/{app_id}")
    handle = op.execute(context(ti))
    app_id = handle.rsplit("/", 1)[1]
    assert ti.xcoms[ShipyardJobLink().xcom_key] == f"https://ui/local_cwd/{app_id}"

    ti = TaskInstanceStub()
    bad = ShipyardOperator(task_id="job", app=app, ui_url="https://ui/{nope}")
    with pytest.raises(ValueError, match="ui_url"):
        bad.execute(context(ti))
    assert ti.xcoms == {}  # nothing was submitted


def test_the_link_is_registered() -> None:
    assert "airflow_provider.links.ShipyardJobLink" in get_provider_info()["extra-links"]
    assert ShipyardOperator.operator_extra_links[0].name == "Shipyard job"
