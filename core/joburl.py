"""A job's page in a dashboard: the backend's own URL, else a URL template filled in.

Shared by the Airflow provider (the task's "Shipyard job" link) and the Prefect tasks (a link
artifact of the run). A template names the job with ``{handle}``, ``{scheduler}``,
``{session}``, ``{app_id}`` (the scheduler's id, URL-quoted) and ``{job_id}`` (its last ``:``
part: a Slurm job id on a named cluster), e.g. ``https://grafana.example/d/slurm?var-job={job_id}``.
Without a template from the caller, ``$SHIPYARD_UI_URL`` is the template. No URL, no link.
"""

from __future__ import annotations

import os
import urllib.parse

from core.specs import AppHandle, AppStatus, parse_app_handle

__all__ = ["UI_URL_ENV", "check_ui_url_template", "job_url", "template_or_env"]

#: the environment variable holding a URL template when nothing else gives one
UI_URL_ENV = "SHIPYARD_UI_URL"

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


def _is_url(value: str) -> bool:
    return urllib.parse.urlsplit(value).scheme in ("http", "https")


def template_or_env(template: str | None) -> str | None:
    """``template``, else ``$SHIPYARD_UI_URL`` (checked), else None.

    Raises:
        ValueError: ``$SHIPYARD_UI_URL`` is not a usable template (naming it).
    """
    if template:
        return template
    env = os.environ.get(UI_URL_ENV) or None
    return check_ui_url_template(env, f"${UI_URL_ENV}") if env else None


def job_url(handle: AppHandle, status: AppStatus | None, template: str | None) -> str | None:
    """The job's URL: the backend's (``status.ui_url``, when it is an http(s) URL), else
    ``template`` (or ``$SHIPYARD_UI_URL``) filled in; None without either.

    Raises:
        ValueError: ``$SHIPYARD_UI_URL`` is not a usable template (naming it).
    """
    if status is not None and status.ui_url and _is_url(status.ui_url):
        return status.ui_url
    template = template_or_env(template)
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
