from __future__ import annotations

from pathlib import Path

import pytest

from core.appfile import (
    AppFileError,
    app_from_dict,
    app_from_yaml,
    app_json_schema,
    app_to_dict,
    dump_app,
    load_app,
)
from core.specs import BindMount, Resource, RetryPolicy
from tests.helpers import ROOT

GOOD = """
name: trainer-app
roles:
  - name: trainer
    image: /opt/img
    entrypoint: python
    args: [train.py, --steps, 10, --fast, true]
    env: {SEED: 42, MODE: fast}
    num_replicas: 2
    max_retries: 1
    retry_policy: replica
    resource: {cpu: 2, gpu: 0, memMB: 1024}
    port_map: {http: 8080}
    mounts:
      - type=bind,src=/tmp,dst=/data,readonly
      - {type: volume, src: cache, dst: /cache}
  - name: ps
    entrypoint: echo
    resource: small
metadata: {team: ml}
"""


def test_full_app_round_trips(tmp_path: Path) -> None:
    app = app_from_yaml(GOOD)
    t = app.roles[0]
    assert t.args == ["train.py", "--steps", "10", "--fast", "true"]
    assert t.env == {"SEED": "42", "MODE": "fast"}
    assert t.retry_policy == RetryPolicy.REPLICA and t.resource == Resource(2, 0, 1024)
    assert t.mounts[0] == BindMount("/tmp", "/data", True)
    assert app.roles[1].resource.memMB == 1024
    path = tmp_path / "app.yaml"
    path.write_text(dump_app(app))
    assert load_app(path) == app
    assert app_from_dict(app_to_dict(app)) == app


@pytest.mark.parametrize(
    "text,msg",
    [
        ("name: x\nroles: []\n", "roles: expected a non-empty list of roles"),
        ("roles: [{name: a, entrypoint: e}]\n", "name: required"),
        ("name: x\ncolour: red\nroles: [{name: a, entrypoint: e}]\n", "colour: unknown field"),
        (
            "name: x\nroles:\n - {name: a, entrypoint: e}\n - {name: b, entrypoint: e, num_replicas: -2}\n",
            r"roles\[1\].num_replicas: expected a positive integer, got -2",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e, num_replicas: '2'}]\n",
            r"roles\[0\].num_replicas",
        ),
        ("name: x\nroles: [{name: a}]\n", r"roles\[0\].entrypoint: required"),
        (
            "name: x\nroles: [{name: a, entrypoint: e, args: {a: 1}}]\n",
            r"roles\[0\].args: expected a list",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e, args: [[1]]}]\n",
            r"roles\[0\].args\[0\]: expected a string",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e, resource: huge}]\n",
            r"roles\[0\].resource: unknown named",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e, resource: {cpu: x}}]\n",
            r"roles\[0\].resource.cpu",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e, retry_policy: sometimes}]\n",
            r"roles\[0\].retry_policy",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e, mounts: [type=nfs]}]\n",
            r"roles\[0\].mounts\[0\].type",
        ),
        (
            "name: x\nroles: [{name: a, entrypoint: e}, {name: a, entrypoint: e}]\n",
            r"roles\[1\].name: duplicate",
        ),
        (
            "name: 'has space'\nroles: [{name: a, entrypoint: e}]\n",
            "name: expected 1-63 characters",
        ),
        ("name: x\nroles: [{name: a, entrypoint: e, env: {BAD-KEY: 1}}]\n", r"roles\[0\].env"),
        ("name: [x\n", "invalid YAML"),
        ("- just\n- a list\n", "app: expected a mapping"),
    ],
)
def test_bad_app_files_name_the_field(text: str, msg: str) -> None:
    with pytest.raises(AppFileError, match=msg) as e:
        app_from_yaml(text)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AppFileError, match="app file: cannot read .*nope.yaml"):
        load_app(tmp_path / "nope.yaml")


def test_yaml_error_points_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nroles:\n  - name: a\n   entrypoint: e\n")
    with pytest.raises(AppFileError, match=r"bad.yaml:4:\d+: invalid YAML"):
        load_app(str(path))


MANY_ERRORS = """\
name: has space
roles:
  - name: a
    entrypoint: e
    num_replicas: 0
  - name: b
    entrypoint: e
    num_replicas: -2
    resource: {cpu: x, colour: red}
    env: {BAD-KEY: 1}
    mounts: [type=nfs]
  - entrypoint: e
"""


def test_every_error_at_once_each_with_its_file_line_and_path(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(MANY_ERRORS)
    with pytest.raises(AppFileError) as e:
        load_app(path)
    src = str(path)
    assert str(e.value).splitlines() == [
        f"{src}:1:7: name: expected 1-63 characters of letters, digits, '_', '.', '-' starting"
        " with a letter or digit, got 'has space'",
        f"{src}:5:19: roles[0].num_replicas: expected a positive integer, got 0",
        f"{src}:8:19: roles[1].num_replicas: expected a positive integer, got -2",
        f"{src}:9:21: roles[1].resource.cpu: expected an integer >= -1, got 'x'",
        f"{src}:9:24: roles[1].resource.colour: unknown field; expected one of cpu, gpu, memMB,"
        " capabilities, devices",
        f"{src}:10:11: roles[1].env: expected variable names of letters, digits and '_',"
        " got 'BAD-KEY'",
        f"{src}:11:14: roles[1].mounts[0].type: expected bind, volume or device, got 'nfs'",
        f"{src}:12:5: roles[2].name: required",
    ]
    assert [(i.path, i.line) for i in e.value.issues][:2] == [
        ("name", 1),
        ("roles[0].num_replicas", 5),
    ]


def test_issues_without_a_file_have_no_place_and_data_has_no_lines() -> None:
    with pytest.raises(AppFileError) as e:
        app_from_dict({"name": "x", "roles": [{"name": "a", "entrypoint": "e", "args": [[1], 2]}]})
    assert str(e.value) == "roles[0].args[0]: expected a string, got [1]"
    with pytest.raises(AppFileError, match=r"^<string>:3:21: roles\[0\]\.args\[0\]"):
        app_from_yaml("name: x\nroles:\n - {name: a, args: [[1]], entrypoint: e}\n")


def test_a_long_list_of_errors_is_cut_with_a_count() -> None:
    roles = [{"name": f"r{i}", "entrypoint": "e", "num_replicas": 0} for i in range(30)]
    with pytest.raises(AppFileError) as e:
        app_from_dict({"name": "x", "roles": roles})
    lines = str(e.value).splitlines()
    assert len(e.value.issues) == 30 and len(lines) == 21
    assert lines[-1] == "... and 10 more errors"


def test_cross_field_checks_name_the_field() -> None:
    with pytest.raises(AppFileError, match=r"^roles\[0\]\.min_replicas: expected at most num_"):
        app_from_dict({"name": "x", "roles": [{"name": "a", "entrypoint": "e", "min_replicas": 2}]})
    with pytest.raises(AppFileError, match=r"^roles\[0\]\.num_replicas: expected at most 10000"):
        app_from_dict(
            {"name": "x", "roles": [{"name": "a", "entrypoint": "e", "num_replicas": 10**6}]}
        )


EXAMPLE_APP_FILES = sorted(
    p for d in ("dags", "scripts") for p in (ROOT / d).rglob("*.y*ml") if "roles:" in p.read_text()
)


def test_the_json_schema_accepts_the_example_app_files_and_rejects_bad_ones() -> None:
    import yaml

    jsonschema = pytest.importorskip("jsonschema")
    schema = app_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert len(EXAMPLE_APP_FILES) >= 2
    for path in EXAMPLE_APP_FILES:
        data = yaml.safe_load(path.read_text())
        assert not list(validator.iter_errors(data)), path
        load_app(path)  # and the models agree
    good = yaml.safe_load(GOOD)
    assert not list(validator.iter_errors(good))
    bad = yaml.safe_load(MANY_ERRORS)
    assert len(list(validator.iter_errors(bad))) >= 5
