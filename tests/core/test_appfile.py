from __future__ import annotations

from pathlib import Path

import pytest

from core.appfile import AppFileError, app_from_dict, app_from_yaml, app_to_dict, dump_app, load_app
from core.specs import BindMount, Resource, RetryPolicy

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
