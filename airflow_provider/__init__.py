"""Apache Airflow provider for Shipyard: launch, follow and cancel Shipyard jobs from DAGs.

* :class:`airflow_provider.operators.ShipyardOperator` submits an app and waits for it,
  streaming its log lines into the task log (optionally deferred to the triggerer).
* :class:`airflow_provider.sensors.ShipyardJobSensor` waits for an app handle to reach a state.
* :class:`airflow_provider.triggers.ShipyardJobTrigger` waits asynchronously in the triggerer.

Importing this package does not import Airflow: Airflow loads :func:`get_provider_info` through
the ``apache_airflow_provider`` entry point.
"""

from __future__ import annotations

from typing import Any

from airflow_provider.config import CONFIG
from airflow_provider.connection_form import CONN_FIELDS, UI_FIELD_BEHAVIOUR

__all__ = ["get_provider_info", "__version__"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shipyard")
    except PackageNotFoundError:  # running from a source tree without metadata
        return "0.0.0"


__version__ = _version()


def get_provider_info() -> dict[str, Any]:
    """Provider metadata for Airflow's providers manager (``airflow providers list``)."""
    return {
        "package-name": "shipyard",
        "name": "Shipyard",
        "description": "Launch multi-role, multi-replica Shipyard jobs on local processes, "
        "Docker and Slurm from Airflow: operator, sensor and trigger.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Shipyard",
                "external-doc-url": "https://pypi.org/project/shipyard/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "Shipyard", "python-modules": ["airflow_provider.operators"]}
        ],
        "sensors": [
            {"integration-name": "Shipyard", "python-modules": ["airflow_provider.sensors"]}
        ],
        "triggers": [
            {"integration-name": "Shipyard", "python-modules": ["airflow_provider.triggers"]}
        ],
        "hooks": [
            {"integration-name": "Shipyard", "python-modules": ["airflow_provider.hooks.shipyard"]}
        ],
        "extra-links": ["airflow_provider.links.ShipyardJobLink"],
        "task-decorators": [
            {"class-name": "airflow_provider.decorators.shipyard_task", "name": "shipyard"}
        ],
        "config": CONFIG,
        "connection-types": [
            {
                "hook-class-name": "airflow_provider.hooks.shipyard.ShipyardHook",
                "hook-name": "Shipyard",
                "connection-type": "shipyard",
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
            }
        ],
    }
