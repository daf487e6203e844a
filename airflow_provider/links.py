"""The task's "Shipyard job" extra link: the job's page in a dashboard, where there is one.

The URL is the backend's own (``AppStatus.ui_url``) when it gives one, else a template: the
operator's ``ui_url`` argument, the connection's extra ``ui_url``, Airflow's ``[shipyard]
ui_url`` (``AIRFLOW__SHIPYARD__UI_URL``), or ``$SHIPYARD_UI_URL``. A template names the job
with ``{handle}``, ``{scheduler}``, ``{session}``, ``{app_id}`` (the scheduler's id,
URL-quoted) and ``{job_id}`` (its last ``:`` part: a Slurm job id on a named cluster), e.g.
``https://grafana.example/d/slurm?var-job={job_id}`` (see :mod:`core.joburl`). No URL, no link.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink, BaseXCom

from airflow_provider import config
from core import joburl
from core.joburl import check_ui_url_template
from core.specs import AppHandle, AppStatus

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

__all__ = ["ShipyardJobLink", "check_ui_url_template", "job_url"]


def job_url(handle: AppHandle, status: AppStatus | None, template: str | None) -> str | None:
    """The job's URL: the backend's, else ``template``, else ``[shipyard] ui_url``, else
    ``$SHIPYARD_UI_URL``, filled in (None: no link).

    Raises:
        ValueError: a configured template is not usable (naming where it is set).
    """
    return joburl.job_url(handle, status, template or config.ui_url_template())


class ShipyardJobLink(BaseOperatorLink):
    """The task's link named "Shipyard job": the URL the operator stored in its XCom."""

    name = "Shipyard job"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        # (Airflow's own TaskInstanceKey does not type-check as its TIKeyProtocol)
        value = BaseXCom.get_value(ti_key=ti_key, key=self.xcom_key)  # type: ignore[arg-type]
        return str(value) if value else ""
