"""The provider's configuration section ``[shipyard]``: ``ui_url``, ``retry_budget``, ``session``.

Declared in :data:`CONFIG` (handed to Airflow by :func:`airflow_provider.get_provider_info`, so
``airflow config list`` and the docs show it) and read through Airflow's configuration, so
``airflow.cfg`` and ``AIRFLOW__SHIPYARD__UI_URL`` (``..._RETRY_BUDGET``, ``..._SESSION``, and
Airflow's ``_CMD``/``_SECRET`` forms) set them. An option that is not set falls back to the
environment variable that held it before (``$SHIPYARD_UI_URL``, ``$SHIPYARD_RETRY_BUDGET``,
``$SHIPYARD_SESSION``), read by core as everywhere else; the options' declared defaults are
empty for that reason.

Core never imports Airflow: the provider reads these options and passes the values in (the
session name to :func:`core.runner.get_runner`, the budget as the ``budget`` of every watch
and retried call it makes, the template to :func:`core.joburl.job_url`).

Importing this module does not import Airflow (``get_provider_info`` uses :data:`CONFIG`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONFIG", "SECTION", "retry_budget", "session_name", "ui_url_template"]

#: the section's name in ``airflow.cfg`` (``AIRFLOW__SHIPYARD__<OPTION>`` in the environment)
SECTION = "shipyard"
_ADDED = "0.1.0"

#: the ``config`` entry of the provider's metadata (Airflow's provider-info schema)
CONFIG: dict[str, Any] = {
    SECTION: {
        "description": "Settings of the Shipyard provider's operator, sensor and trigger.",
        "options": {
            "ui_url": {
                "description": "URL template of a job's page in a dashboard, shown as the"
                " task's 'Shipyard job' link when the operator's ui_url and its connection's"
                " extra ui_url give none. Fields: {handle}, {scheduler}, {session}, {app_id},"
                " {job_id}. Not set: $SHIPYARD_UI_URL, else no link.",
                "version_added": _ADDED,
                "type": "string",
                "example": "https://grafana.example/d/slurm?var-job={job_id}",
                "default": None,
            },
            "retry_budget": {
                "description": "Seconds a backend may keep failing transiently (unreachable,"
                " timing out, answering 5xx) while a task, sensor or trigger waits on a job,"
                " before the wait fails and leaves the job running for a retry to pick up."
                " Not set: $SHIPYARD_RETRY_BUDGET, else 120.",
                "version_added": _ADDED,
                "type": "float",
                "example": "300",
                "default": None,
            },
            "session": {
                "description": "The Shipyard session jobs are submitted under when the"
                " operator's session_name gives none (part of every app handle)."
                " Not set: $SHIPYARD_SESSION, else shipyard.",
                "version_added": _ADDED,
                "type": "string",
                "example": "team-a",
                "default": None,
            },
        },
    }
}


def _option(key: str) -> str | None:
    """The option as Airflow's configuration has it (None when not set, or blank)."""
    from airflow.sdk import conf

    value = conf.get(SECTION, key, fallback=None)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def ui_url_template() -> str | None:
    """``[shipyard] ui_url``, checked; None when not set (``$SHIPYARD_UI_URL`` then applies,
    see :func:`core.joburl.job_url`).

    Raises:
        ValueError: naming the option when it is not a usable template.
    """
    from core.joburl import check_ui_url_template

    value = _option("ui_url")
    return check_ui_url_template(value, f"[{SECTION}] ui_url") if value else None


def retry_budget() -> float:
    """Seconds of transient backend failures a wait takes: ``[shipyard] retry_budget``, else
    :func:`core.transient.retry_budget` (``$SHIPYARD_RETRY_BUDGET``, else 120).

    Raises:
        ValueError: naming the option (or the variable) when it is not a number >= 0.
    """
    from core.transient import parse_budget
    from core.transient import retry_budget as core_budget

    raw = _option("retry_budget")
    if raw is None:
        return core_budget()
    return parse_budget(raw, f"[{SECTION}] retry_budget")


def session_name(explicit: str | None = None) -> str | None:
    """``explicit``, else ``[shipyard] session``; None leaves it to
    :func:`core.runner.get_runner` (``$SHIPYARD_SESSION``, else ``shipyard``)."""
    return explicit or _option("session")
