"""Provider registration: the entry point, the schema, and ``airflow providers list``."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import airflow_provider
from airflow_provider import get_provider_info

pytestmark = pytest.mark.airflow


def test_provider_info_matches_airflows_schema() -> None:
    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "shipyard"
    assert info["versions"] == [airflow_provider.__version__]


@pytest.mark.parametrize(
    ("section", "attr"),
    [
        ("operators", "ShipyardOperator"),
        ("sensors", "ShipyardJobSensor"),
        ("triggers", "ShipyardJobTrigger"),
    ],
)
def test_listed_modules_hold_the_classes(section: str, attr: str) -> None:
    (entry,) = get_provider_info()[section]
    (module,) = entry["python-modules"]
    assert hasattr(importlib.import_module(module), attr)


def test_entry_point_is_registered() -> None:
    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.dist.name == "shipyard"]
    assert len(eps) == 1
    assert eps[0].load() is get_provider_info


def test_providers_manager_knows_shipyard() -> None:
    from airflow.providers_manager import ProvidersManager

    providers = ProvidersManager().providers
    assert providers["shipyard"].version == airflow_provider.__version__


def test_airflow_providers_list_shows_it() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "providers", "list", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=240,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr
    listed = {p["package_name"]: p for p in json.loads(out.stdout)}
    assert listed["shipyard"]["version"] == airflow_provider.__version__
