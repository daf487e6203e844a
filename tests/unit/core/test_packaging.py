"""What the distribution declares and ships: one version, typed packages, the licence, and no
version cap without its reason beside it."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version

import core
from tests.helpers import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def _project() -> dict[str, object]:
    with PYPROJECT.open("rb") as f:
        return tomllib.load(f)


def test_the_version_has_one_source() -> None:
    data = _project()
    project = data["project"]
    assert isinstance(project, dict) and "version" not in project
    assert project["dynamic"] == ["version"]
    assert data["tool"]["hatch"]["version"] == {"path": "core/__init__.py"}  # type: ignore[index]
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", core.__version__)
    # (the installed metadata was built from it)
    assert version("shipyard") == core.__version__


def test_every_package_is_marked_typed_and_shipped() -> None:
    wheel = _project()["tool"]["hatch"]["build"]["targets"]["wheel"]  # type: ignore[index]
    assert sorted(wheel["packages"]) == ["airflow_provider", "core", "prefect_tasks"]
    for package in wheel["packages"]:
        assert (ROOT / package / "py.typed").is_file(), package
    assert "Typing :: Typed" in _project()["project"]["classifiers"]  # type: ignore[index]


def test_the_licence_is_the_apache_2_text() -> None:
    project = _project()["project"]
    assert project["license"] == "Apache-2.0"  # type: ignore[index]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_extras_keep_dev_tools_and_the_database_driver_out() -> None:
    extras = _project()["project"]["optional-dependencies"]  # type: ignore[index]
    assert extras["airflow"] == ["apache-airflow>=3.3"]
    assert not any("dev" in req for req in extras["all"]), extras["all"]
    assert any(req.startswith("pytest") for req in extras["dev"])
    # the deployment installs the PostgreSQL driver, and the dev tools, itself
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "'.[all,dev]' 'apache-airflow[postgres]'" in setup


def test_an_upper_bound_has_its_reason_written_beside_it() -> None:
    project = _project()["project"]
    extras = project["optional-dependencies"]  # type: ignore[index]
    reqs = [*project["dependencies"], *(r for rs in extras.values() for r in rs)]  # type: ignore[index]
    names = {r: re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs}  # type: ignore[union-attr]
    capped = {names[r] for r in reqs if "<" in r}
    assert "pydantic" not in capped and "apache-airflow" not in capped, capped
    comments = [line for line in PYPROJECT.read_text().splitlines() if line.strip().startswith("#")]
    for name in capped:
        assert any(f"{name}<" in c for c in comments), f"{name}: a cap without its reason"
