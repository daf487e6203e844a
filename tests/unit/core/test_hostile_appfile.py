"""Hostile app files: arbitrary data, adversarial YAML and awkward paths.

``app_from_dict``/``app_from_yaml``/``load_app`` return a valid app or raise ``AppFileError`` (a
``ValueError``) naming the field or the file, one line per issue (all of them at once); never
another exception. A valid app written with
``dump_app`` reads back as the same app, or fails loudly: never silently as a different app.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.appfile import (
    MAX_LISTED,
    AppFileError,
    app_from_dict,
    app_from_yaml,
    app_to_dict,
    dump_app,
    load_app,
)
from core.specs import AppDef, BindMount, validate_app
from tests.unit.core.hostile_inputs import HOSTILE_SETTINGS, corpus, hostile_text, plain_data
from tests.unit.core.test_hostile_specs import apps

ROLE = {"name": "r", "entrypoint": "echo"}


def assert_clean(e: AppFileError) -> None:
    """One line per issue (up to MAX_LISTED, then a count), each naming what was wrong."""
    lines = str(e).splitlines()
    assert e.issues and all(i.message for i in e.issues), str(e)
    assert all(line.strip() and "Traceback" not in line for line in lines), str(e)
    assert len(lines) == min(len(e.issues), MAX_LISTED) + (len(e.issues) > MAX_LISTED), str(e)
    assert all(len(line) < 600 for line in lines), str(e)


def _load(data: Any) -> AppDef | None:
    try:
        return app_from_dict(data)
    except AppFileError as e:
        assert_clean(e)
        return None


@HOSTILE_SETTINGS
@given(plain_data)
def test_arbitrary_data_is_an_app_or_an_app_file_error(data: Any) -> None:
    _load(data)


_ROLE_KEYS = [
    "name", "image", "base_image", "entrypoint", "args", "env", "num_replicas", "min_replicas",
    "max_retries", "retry_policy", "resource", "port_map", "metadata", "mounts", "bogus",
]  # fmt: skip
_RESOURCE_KEYS = ["cpu", "gpu", "memMB", "capabilities", "devices", "bogus"]


@st.composite
def near_valid_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A valid app dict with one value (of the app, a role or its resource) replaced."""
    role: dict[str, Any] = dict(ROLE)
    role["resource"] = {"cpu": 1, "gpu": 0, "memMB": 64}
    data: dict[str, Any] = {"name": "app", "roles": [role], "metadata": {"k": "v"}}
    where = draw(st.sampled_from(["app", "role", "resource"]))
    if where == "app":
        data[draw(st.sampled_from(["name", "roles", "metadata", "bogus"]))] = draw(plain_data)
    elif where == "role":
        role[draw(st.sampled_from(_ROLE_KEYS))] = draw(plain_data)
    else:
        role["resource"][draw(st.sampled_from(_RESOURCE_KEYS))] = draw(plain_data)
    return data


@HOSTILE_SETTINGS
@given(near_valid_dicts())
def test_near_valid_dicts_are_an_app_or_an_app_file_error(data: dict[str, Any]) -> None:
    app = _load(data)
    if app is not None:
        validate_app(app)


@HOSTILE_SETTINGS
@given(st.one_of(hostile_text, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_arbitrary_text_is_an_app_or_an_app_file_error(text: str) -> None:
    try:
        app_from_yaml(text)
    except AppFileError as e:
        assert_clean(e)


_LAUGHS = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
YAML_CORPUS: dict[str, str] = {
    "deep list": "[" * 20_000 + "]" * 20_000,
    "deep map": "{a: " * 20_000 + "}" * 20_000,
    "billion laughs in args": "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + _LAUGHS.replace("\n", "\n", 1)
    + "name: x\nroles: [{name: r, entrypoint: e, args: *i}]\n",
    "python object tag": "!!python/object/apply:os.system ['touch /tmp/shipyard-pwned']",
    "python name tag": "name: !!python/name:os.system\nroles: [{name: r, entrypoint: e}]",
    "recursive alias": "name: x\nroles: &r [{name: r, entrypoint: e, args: *r}]",
    "capabilities list": "name: x\nroles: [{name: r, entrypoint: e, resource: {capabilities: [1, 2]}}]",
    "capabilities str": "name: x\nroles: [{name: r, entrypoint: e, resource: {capabilities: abc}}]",
    "devices list": "name: x\nroles: [{name: r, entrypoint: e, resource: {devices: [1]}}]",
    "devices str": "name: x\nroles: [{name: r, entrypoint: e, resource: {devices: gpu}}]",
    "date arg": "name: x\nroles: [{name: r, entrypoint: e, args: [2020-01-01]}]",
    "binary name": "name: !!binary aGVsbG8=\nroles: [{name: r, entrypoint: e}]",
    "set args": "name: x\nroles: [{name: r, entrypoint: e, args: !!set {a, b}}]",
    "tab indent": "name: x\nroles:\n\t- {name: r, entrypoint: e}",
    "NUL": "name: x\x00\nroles: [{name: r, entrypoint: e}]",
    "BOM": "\ufeffname: x\nroles: [{name: r, entrypoint: e}]",
    "multi doc": "name: x\nroles: [{name: r, entrypoint: e}]\n---\nname: y\n",
    "empty": "",
    "just a string": "hello",
    "name traversal": "name: ../../etc\nroles: [{name: r, entrypoint: e}]",
    "role traversal": "name: x\nroles: [{name: ../r, entrypoint: e}]",
    "huge replicas": "name: x\nroles: [{name: r, entrypoint: e, num_replicas: 1e400}]",
    "mount injection in mapping": (
        "name: x\nroles: [{name: r, entrypoint: e, mounts: "
        "[{type: bind, src: '/a,type=bind,src=/etc,dst=/host-etc', dst: /b}]}]"
    ),
    "second mount smuggled in a mapping": (
        "name: x\nroles: [{name: r, entrypoint: e, mounts: "
        "[{type: bind, src: '/a,dst=/x,type=bind,src=/etc,dst=/host-etc', dst: /b}]}]"
    ),
    "readonly dropped by a later value": (
        "name: x\nroles: [{name: r, entrypoint: e, mounts: "
        "[{type: bind, readonly: true, src: /data, dst: '/b,readonly=false'}]}]"
    ),
    "mount override in mapping": (
        "name: x\nroles: [{name: r, entrypoint: e, mounts: "
        "[{type: bind, src: '/data,readonly=false', dst: /b, readonly: true}]}]"
    ),
}


@pytest.mark.parametrize("name", list(YAML_CORPUS))
def test_yaml_corpus_is_an_app_or_an_app_file_error(name: str) -> None:
    try:
        app = app_from_yaml(YAML_CORPUS[name])
    except AppFileError as e:
        assert_clean(e)
        return
    validate_app(app)
    for role in app.roles:
        # a mapping describes exactly one mount: its values cannot smuggle in another
        assert len(role.mounts) <= 1
        for m in role.mounts:
            assert not isinstance(m, BindMount) or m.src_path != "/etc"
            assert not isinstance(m, BindMount) or m.src_path != "/data" or m.read_only


@pytest.mark.parametrize("value", corpus())
def test_hostile_args_and_env_round_trip_through_yaml(value: str) -> None:
    app = app_from_dict({"name": "x", "roles": [{**ROLE, "args": [value], "env": {"V": value}}]})
    again = app_from_yaml(dump_app(app))
    assert again.roles[0].args == [value] and again.roles[0].env == {"V": value}


@HOSTILE_SETTINGS
@given(apps())
def test_dump_then_load_is_the_same_app_or_a_clear_error(app: AppDef) -> None:
    try:
        validate_app(app)
    except ValueError:
        return
    if any(not isinstance(k, str) for r in app.roles for k in r.port_map):
        return
    try:
        again = app_from_yaml(dump_app(app))
    except AppFileError as e:
        assert_clean(e)
        return
    assert app_to_dict(again) == app_to_dict(app)


def test_load_app_paths_that_are_not_app_files(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81not utf-8")
    unreadable = tmp_path / "secret.yaml"
    unreadable.write_text("name: x\n")
    unreadable.chmod(0)
    cases = [
        str(binary),
        str(tmp_path),
        str(tmp_path / "missing.yaml"),
        "a\x00b.yaml",
        "",
        "/dev/null",
        "../" * 20 + "etc/passwd",
    ]
    if os.geteuid() != 0:  # root reads anything
        cases.append(str(unreadable))
    for path in cases:
        with pytest.raises(AppFileError) as e:
            load_app(path)
        assert str(e.value) and "\n" not in str(e.value), (path, str(e.value))
        assert len(e.value.issues) == 1


@pytest.mark.parametrize(
    ("mount", "says"),
    [
        ("a" * 5000, "each mount must start with type=bind|volume|device, got 'aaaa"),
        ({0: True}, "expected option names (strings), got 0"),
    ],
)
def test_a_bad_mount_is_one_short_line_naming_it(mount: Any, says: str) -> None:
    """(Both found by the property tests above: a huge token was quoted whole; a mapping
    with a key that is not a string raised a bare TypeError.)"""
    data = {"name": "app", "roles": [{**ROLE, "mounts": [mount]}]}
    with pytest.raises(AppFileError) as info:
        app_from_dict(data)
    assert_clean(info.value)
    assert str(info.value).startswith(f"roles[0].mounts[0]: {says}")
