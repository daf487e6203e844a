"""Hostile input to the app model: validation, mounts, run options and app handles.

Each function is total over arbitrary input: it returns a well-formed value or raises a
``ValueError`` whose message starts with the path of the bad field; never another exception.
What it accepts is safe to use as a file name, host name, job name or environment variable.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.specs import (
    AppDef,
    BindMount,
    DeviceMount,
    MalformedAppHandleException,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
    macros,
    make_app_handle,
    parse_app_handle,
    parse_mounts,
    runopts,
    validate_app,
    validate_name,
)
from tests.unit.core.hostile_inputs import (
    HOSTILE_SETTINGS,
    TRAVERSAL_STRINGS,
    any_text,
    corpus,
    env_names,
    hostile_text,
    plain_data,
    safe_names,
    scalars,
)

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
SAFE_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FIELD_PATH = re.compile(r"^(app|name|roles)(\[\d+\])?(\.[A-Za-z_]+)*(\[\d+\])?[.:]")

#: a safe name with something hostile before or after it (the near misses a regex lets through)
_safe = safe_names
near_miss_names = st.one_of(
    st.tuples(_safe, st.sampled_from(["\n", "\r\n", "/..", "/", " ", "\x00", "\t", "$(id)", "é"])),
    st.tuples(st.sampled_from(["\n", "/", "../", " ", "\x00", "-", ".", "é"]), _safe),
).map("".join)
names = st.one_of(
    near_miss_names,
    st.sampled_from(corpus() + ["ok", "a" * 63, "a" * 64, "x\n", "X\n", "a.b-c_d", "9lives"]),
    safe_names,
    any_text,
)
ints = st.one_of(
    st.integers(min_value=-3, max_value=5),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([True, False, 1.0, 2.5, "2", None, float("nan")]),
)
env_keys = st.one_of(
    st.sampled_from(["PATH", "K\n", "A B", "1X", "_", "X=Y", "X\x00", "", "ÄÖ", "a-b"]),
    env_names.map(lambda k: k + "\n"),
    any_text,
)
str_lists = st.one_of(st.lists(hostile_text, max_size=5), scalars, st.lists(scalars, max_size=3))
mounts_st = st.one_of(
    st.builds(BindMount, hostile_text, hostile_text, st.booleans()),
    st.builds(VolumeMount, hostile_text, hostile_text, st.booleans()),
    st.builds(DeviceMount, hostile_text, hostile_text, hostile_text),
    scalars,
)
# A valid role with one field (or none) replaced by a hostile value: most examples get far into
# validation, and accepted ones exercise the "accepted means safe" invariants.
ROLE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": names,
    "image": st.one_of(hostile_text, scalars),
    "entrypoint": st.one_of(hostile_text, scalars),
    "args": str_lists,
    "env": st.one_of(
        st.dictionaries(env_keys, st.one_of(hostile_text, scalars), max_size=4), scalars
    ),
    "num_replicas": ints,
    "min_replicas": st.one_of(st.none(), ints),
    "max_retries": ints,
    "retry_policy": st.one_of(st.sampled_from(list(RetryPolicy)), scalars),
    "resource": st.one_of(st.builds(Resource, ints, ints, ints), scalars),
    "port_map": st.dictionaries(hostile_text, ints, max_size=3),
    "mounts": st.lists(mounts_st, max_size=3),
}


def _valid_role(draw: st.DrawFn, index: int) -> Role:
    no_nul = hostile_text.filter(lambda s: "\x00" not in s)
    return Role(
        name=draw(safe_names).replace("\n", "") + str(index),
        entrypoint=draw(no_nul.filter(bool)),
        args=draw(st.lists(no_nul, max_size=3)),
        env=draw(st.dictionaries(env_names, no_nul, max_size=3)),
        num_replicas=draw(st.integers(1, 4)),
    )


@st.composite
def apps(draw: st.DrawFn) -> AppDef:
    """A valid app with at most one field replaced by a hostile value."""
    app = AppDef(
        name=draw(safe_names),
        roles=[_valid_role(draw, i) for i in range(draw(st.integers(1, 3)))],
    )
    target = draw(st.sampled_from(["none", "app.name", "app.roles", *sorted(ROLE_FIELDS)]))
    if target == "app.name":
        app.name = draw(names)
    elif target == "app.roles":
        app.roles = draw(st.one_of(st.just([]), scalars))
    elif target != "none":
        role = draw(st.sampled_from(app.roles))
        setattr(role, target, draw(ROLE_FIELDS[target]))
    return app


def _field_error(e: ValueError) -> None:
    msg = str(e)
    assert msg, "empty error message"
    assert FIELD_PATH.match(msg), f"error does not name the field: {msg[:200]!r}"


@HOSTILE_SETTINGS
@given(apps())
def test_validate_app_accepts_only_safe_apps_and_names_the_bad_field(app: AppDef) -> None:
    try:
        validate_app(app)
    except ValueError as e:
        _field_error(e)
        return
    # accepted: everything that ends up in file names, host names and job names is safe
    assert SAFE_NAME.fullmatch(app.name), repr(app.name)
    for role in app.roles:
        assert SAFE_NAME.fullmatch(role.name), repr(role.name)
        assert isinstance(role.entrypoint, str) and role.entrypoint
        assert all(isinstance(a, str) and "\x00" not in a for a in role.args)
        for k, v in role.env.items():
            assert SAFE_ENV_KEY.fullmatch(k), repr(k)
            assert isinstance(v, str) and "\x00" not in v
        assert type(role.num_replicas) is int and role.num_replicas >= 1
        assert type(role.max_retries) is int and role.max_retries >= 0


@pytest.mark.parametrize("bad", ["x\n", "ok\n", "..", ".", "../x", "a/b", "-x", "", "a" * 64])
def test_names_with_newlines_slashes_or_dots_only_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^name: expected 1-63 characters"):
        validate_name(bad, "name")
    with pytest.raises(ValueError, match=r"^roles\[0\]\.name: expected"):
        validate_app(AppDef("ok", [Role(bad, entrypoint="echo")]))


@pytest.mark.parametrize("key", ["K\n", "A B", "1X", "X=Y", "", "a-b", "ÄÖ"])
def test_env_keys_that_are_not_identifiers_are_rejected(key: str) -> None:
    with pytest.raises(ValueError, match=r"^roles\[0\]\.env: expected variable names"):
        validate_app(AppDef("ok", [Role("r", entrypoint="echo", env={key: "v"})]))


@pytest.mark.parametrize("value", corpus())
def test_hostile_args_and_env_values_are_kept_verbatim(value: str) -> None:
    """Args and env values are data, not syntax: anything without NUL is accepted unchanged."""
    role = Role("r", entrypoint="echo", args=[value, "--", value], env={"V": value})
    validate_app(AppDef("ok", [role]))
    assert role.args == [value, "--", value] and role.env == {"V": value}


@HOSTILE_SETTINGS
@given(st.one_of(hostile_text, st.lists(hostile_text, max_size=4)))
def test_parse_mounts_is_total(spec: str | list[str]) -> None:
    try:
        mounts = parse_mounts(spec)
    except ValueError as e:
        assert re.match(r"^mounts(\[\d+\])?[.:]", str(e)), str(e)
        return
    for m in mounts:
        if isinstance(m, DeviceMount):
            assert m.src_path and m.dst_path and set(m.permissions) <= set("rwm")
        elif isinstance(m, BindMount):
            assert m.src_path and m.dst_path
        else:
            assert isinstance(m, VolumeMount) and m.src and m.dst_path


@pytest.mark.parametrize("path", TRAVERSAL_STRINGS)
def test_mount_paths_are_parsed_verbatim(path: str) -> None:
    """The parser neither resolves nor drops ``..``: what a scheduler mounts is what was asked."""
    if "," in path:
        pytest.skip("commas separate mount options")
    (m,) = parse_mounts(f"type=bind,src={path},dst=/data")
    assert isinstance(m, BindMount) and m.src_path == path and m.dst_path == "/data"


def _opts() -> runopts:
    o = runopts()
    o.add("s", str, "a string", default="d")
    o.add("i", int, "an int", default=1)
    o.add("f", float, "a float", default=0.5)
    o.add("b", bool, "a bool", default=False)
    o.add("l", list[str], "a list", default=["x"])
    o.add("m", dict[str, str], "a dict", default={"k": "v"})
    o.add("r", str, "required", required=True)
    return o


_TYPES = {"s": str, "i": int, "f": float, "b": bool, "l": list, "m": dict, "r": str}


def _check_resolved(out: dict[str, Any]) -> None:
    for key, typ in _TYPES.items():
        assert isinstance(out[key], typ), (key, out[key])
        if typ is int:
            assert not isinstance(out[key], bool)


@HOSTILE_SETTINGS
@given(
    st.dictionaries(
        st.one_of(st.sampled_from(list(_TYPES)), hostile_text, st.integers(), st.none()),
        plain_data,
        max_size=6,
    )
)
def test_runopts_resolve_is_total_and_typed(cfg: dict[Any, Any]) -> None:
    try:
        out = _opts().resolve(cfg)
    except ValueError as e:
        assert re.match(r"^cfg[.:]", str(e)), str(e)
        return
    _check_resolved(out)


@HOSTILE_SETTINGS
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(list(_TYPES)), hostile_text).map(lambda kv: "=".join(kv)),
            hostile_text,
        ),
        max_size=5,
    ).map(",".join)
)
def test_cfg_from_str_is_total_and_typed(text: str) -> None:
    try:
        out = _opts().cfg_from_str(text + ",r=x")
    except ValueError as e:
        assert re.match(r"^cfg[.:]", str(e)), str(e)
        return
    assert out["r"] == "x" or text.rstrip().endswith(",") or "r=" in text
    for key, value in out.items():
        assert isinstance(value, _TYPES[key]), (key, value)


@HOSTILE_SETTINGS
@given(
    st.one_of(
        hostile_text,
        st.tuples(hostile_text, hostile_text, hostile_text).map(
            lambda t: f"{t[0]}://{t[1]}/{t[2]}"
        ),
        st.tuples(st.sampled_from(["local_cwd", "slurm"]), hostile_text, hostile_text).map(
            lambda t: f"{t[0]}://{t[1]}/{t[2]}"
        ),
        scalars,
    )
)
def test_parse_app_handle_is_total(handle: Any) -> None:
    try:
        p = parse_app_handle(handle)
    except MalformedAppHandleException as e:
        assert isinstance(e, ValueError) and str(e).startswith("app handle: expected")
        return
    assert isinstance(handle, str)
    assert make_app_handle(p.scheduler_backend, p.session_name, p.app_id) == handle.strip()
    assert "/" not in p.app_id and not re.search(r"\s", p.app_id) and p.app_id
    assert "/" not in p.session_name


@HOSTILE_SETTINGS
@given(hostile_text)
def test_macro_substitution_is_total_and_only_replaces_known_macros(text: str) -> None:
    values = macros.Values(img_root="/img", app_id="app-1", replica_id="3", rank0_env="R0")
    out = values.substitute(text)
    assert isinstance(out, str)
    if "$" not in text:
        assert out == text
