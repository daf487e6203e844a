"""The task's "Shipyard job" extra link: the job's page in a dashboard, where there is one.

The URL is the backend's own (``AppStatus.ui_url``) when it gives one, else a template:
the operator's ``ui_url`` argument, the connection's extra ``ui_url``, or ``$SHIPYARD_UI_URL``.
A template names the job with ``{handle}``, ``{scheduler}``, ``{session}``, ``{app_id}`` (the
scheduler's id, URL-quoted) and ``{job_id}`` (its last ``:`` part: a Slurm job id on a named
cluster), e.g. ``https://grafana.example/d/slurm?var-job={job_id}``. No URL, no link.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink, BaseXCom

from core.specs import AppHandle, AppStatus, parse_app_handle

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

__all__ = ["ShipyardJobLink", "check_ui_url_template", "job_url"]

_FIELDS = ("handle", "scheduler", "session", "app_id", "job_id")


def check_ui_url_template(template: str, where: str) -> str:
    """``template`` if it formats with the job fields.

    Raises:
        ValueError: naming ``where`` and the unknown field.
    """
    try:
        template.format(**dict.fromkeys(_FIELDS, "x"))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"{where}: expected a URL template with fields among {{{'}, {'.join(_FIELDS)}}},"
            f" got {template!r} ({type(e).__name__}: {e})"
        ) from None
    return template


def job_url(handle: AppHandle, status: AppStatus | None, template: str | None) -> str | None:
    """The job's URL: the backend's, else ``template`` (or ``$SHIPYARD_UI_URL``) filled in."""
    if status is not None and status.ui_url:
        return status.ui_url
    template = template or os.environ.get("SHIPYARD_UI_URL") or None
    if not template:
        return None
    parsed = parse_app_handle(handle)
    app_id = parsed.app_id
    return template.format(
        handle=handle,
        scheduler=parsed.scheduler_backend,
        session=parsed.session_name,
        app_id=urllib.parse.quote(app_id, safe=""),
        job_id=urllib.parse.quote(app_id.rsplit(":", 1)[-1], safe=""),
    )


class ShipyardJobLink(BaseOperatorLink):
    """The task's link named "Shipyard job": the URL the operator stored in its XCom."""

    name = "Shipyard job"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        # (Airflow's own TaskInstanceKey does not type-check as its TIKeyProtocol)
        value = BaseXCom.get_value(ti_key=ti_key, key=self.xcom_key)  # type: ignore[arg-type]
        return str(value) if value else ""
