"""Apps as YAML: load an :class:`~core.specs.AppDef` from a file or text, and save one back.

A minimal app file::

    name: hello
    roles:
      - name: greeter
        entrypoint: echo
        args: ["hello", "from", "${replica_id}"]
        num_replicas: 2

Every error names the path of the bad field, e.g.
``roles[1].num_replicas: expected a positive integer, got -2``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

from core.specs import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
    get_named_resources,
    parse_mounts,
    validate_app,
)

__all__ = ["AppFileError", "app_from_dict", "app_from_yaml", "app_to_dict", "dump_app", "load_app"]

_APP_KEYS = ("name", "roles", "metadata")
_ROLE_KEYS = (
    "name",
    "image",
    "base_image",
    "entrypoint",
    "args",
    "env",
    "num_replicas",
    "min_replicas",
    "max_retries",
    "retry_policy",
    "resource",
    "port_map",
    "metadata",
    "mounts",
)
_RESOURCE_KEYS = ("cpu", "gpu", "memMB", "capabilities", "devices")


class AppFileError(ValueError):
    """An app file or dict that does not describe a valid app; the message names the field."""


def _fail(where: str, expected: str, got: Any) -> AppFileError:
    return AppFileError(f"{where}: expected {expected}, got {got!r}")


def _mapping(value: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, "a mapping", value)
    unknown = [k for k in value if k not in keys]
    if unknown:
        prefix = f"{where}." if where != "app" else ""
        raise AppFileError(
            f"{prefix}{unknown[0]}: unknown field; expected one of {', '.join(keys)}"
        )
    return value


def _scalar_str(value: Any, where: str) -> str:
    # YAML turns `10` and `true` into numbers and bools; args and env are strings to a process.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise _fail(where, "a string", value)


def _str_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(where, "a list of strings", value)
    return [_scalar_str(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(where, "a mapping of strings", value)
    return {str(k): _scalar_str(v, f"{where}.{k}") for k, v in value.items()}


def _int(value: Any, where: str, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(where, what, value)
    return value


def _resource(value: Any, where: str) -> Resource:
    if isinstance(value, str):
        try:
            return get_named_resources(value)
        except ValueError as e:
            raise AppFileError(f"{where}: {str(e).partition(': ')[2]}") from None
    m = _mapping(value, where, _RESOURCE_KEYS)
    capabilities = m.get("capabilities") or {}
    if not isinstance(capabilities, Mapping):
        raise _fail(f"{where}.capabilities", "a mapping", capabilities)
    devices = m.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise _fail(f"{where}.devices", "a mapping of device names to counts", devices)
    return Resource(
        cpu=_int(m.get("cpu", -1), f"{where}.cpu", -1, "an integer >= -1"),
        gpu=_int(m.get("gpu", -1), f"{where}.gpu", -1, "an integer >= -1"),
        memMB=_int(m.get("memMB", -1), f"{where}.memMB", -1, "an integer >= -1"),
        capabilities=dict(capabilities),
        devices={
            str(k): _int(v, f"{where}.devices.{k}", 0, "a non-negative integer")
            for k, v in devices.items()
        },
    )


def _mounts(value: Any, where: str) -> list[BindMount | VolumeMount | DeviceMount]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(where, "a list of mounts", value)
    out: list[BindMount | VolumeMount | DeviceMount] = []
    for i, item in enumerate(value):
        if isinstance(item, Mapping):
            # joined into one option string below: a comma in a value would start another
            # option (or another mount), so a value cannot contain one
            for k, v in item.items():
                if isinstance(v, str) and "," in v:
                    raise _fail(f"{where}[{i}].{k}", "a value without ','", v)
            item = ",".join(
                k if v is True else f"{k}={v}" for k, v in item.items() if v is not False
            )
        if not isinstance(item, str):
            raise _fail(f"{where}[{i}]", "'type=bind,src=...,dst=...' or a mapping", item)
        try:
            out.extend(parse_mounts([item]))
        except ValueError as e:
            raise AppFileError(str(e).replace("mounts[0]", f"{where}[{i}]", 1)) from None
    return out


def _role(value: Any, where: str) -> Role:
    m = _mapping(value, where, _ROLE_KEYS)
    if "name" not in m:
        raise AppFileError(f"{where}.name: required")
    if "entrypoint" not in m:
        raise AppFileError(f"{where}.entrypoint: required")
    policy = m.get("retry_policy", RetryPolicy.APPLICATION.value)
    try:
        retry_policy = RetryPolicy(str(policy).upper())
    except ValueError:
        raise _fail(
            f"{where}.retry_policy", f"one of {[p.value for p in RetryPolicy]}", policy
        ) from None
    min_replicas = m.get("min_replicas")
    port_map = m.get("port_map") or {}
    if not isinstance(port_map, Mapping):
        raise _fail(f"{where}.port_map", "a mapping of names to ports", port_map)
    metadata = m.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise _fail(f"{where}.metadata", "a mapping", metadata)
    return Role(
        name=_scalar_str(m["name"], f"{where}.name"),
        image=_scalar_str(m.get("image", ""), f"{where}.image"),
        base_image=None if m.get("base_image") is None else str(m["base_image"]),
        entrypoint=_scalar_str(m["entrypoint"], f"{where}.entrypoint"),
        args=_str_list(m.get("args"), f"{where}.args"),
        env=_str_map(m.get("env"), f"{where}.env"),
        num_replicas=_int(
            m.get("num_replicas", 1), f"{where}.num_replicas", 1, "a positive integer"
        ),
        min_replicas=None
        if min_replicas is None
        else _int(min_replicas, f"{where}.min_replicas", 1, "a positive integer"),
        max_retries=_int(
            m.get("max_retries", 0), f"{where}.max_retries", 0, "a non-negative integer"
        ),
        retry_policy=retry_policy,
        resource=_resource(m.get("resource", {}), f"{where}.resource"),
        port_map={
            str(k): _int(v, f"{where}.port_map.{k}", 1, "a port 1-65535")
            for k, v in port_map.items()
        },
        metadata=dict(metadata),
        mounts=_mounts(m.get("mounts"), f"{where}.mounts"),
    )


def app_from_dict(data: Any) -> AppDef:
    """Builds and validates an :class:`AppDef` from plain data (as loaded from YAML or JSON).

    Raises:
        AppFileError: (a ``ValueError``) naming the path of the first bad field.
    """
    m = _mapping(data, "app", _APP_KEYS)
    if "name" not in m:
        raise AppFileError("name: required")
    roles = m.get("roles")
    if not isinstance(roles, list) or not roles:
        raise _fail("roles", "a non-empty list of roles", roles)
    app = AppDef(
        name=_scalar_str(m["name"], "name"),
        roles=[_role(r, f"roles[{i}]") for i, r in enumerate(roles)],
        metadata=_str_map(m.get("metadata"), "metadata"),
    )
    try:
        validate_app(app)
    except ValueError as e:
        raise AppFileError(str(e)) from None
    return app


def app_from_yaml(text: str, source: str = "<string>") -> AppDef:
    """Parses YAML text into an :class:`AppDef` (``source`` names it in errors)."""
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise AppFileError(f"{source}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise AppFileError(f"{where}: invalid YAML: {problem}") from None
    return app_from_dict(data)


def load_app(path_or_text: str | os.PathLike[str]) -> AppDef:
    """Loads an app from a YAML file path, or from YAML text when given text with a newline.

    Raises:
        AppFileError: for a missing file, invalid YAML, or an invalid app (naming the field).
    """
    s = os.fspath(path_or_text)
    if "\n" in s:
        return app_from_yaml(s)
    try:
        with open(s, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise AppFileError(f"app file: cannot read {s!r}: {e.strerror}") from None
    except ValueError as e:  # a NUL in the path, or not UTF-8
        raise AppFileError(f"app file: cannot read {s!r}: {e}") from None
    return app_from_yaml(text, source=s)


def _mount_str(m: BindMount | VolumeMount | DeviceMount) -> str:
    if isinstance(m, BindMount):
        return f"type=bind,src={m.src_path},dst={m.dst_path}" + (",readonly" if m.read_only else "")
    if isinstance(m, VolumeMount):
        return f"type=volume,src={m.src},dst={m.dst_path}" + (",readonly" if m.read_only else "")
    return f"type=device,src={m.src_path},dst={m.dst_path},permissions={m.permissions}"


def app_to_dict(app: AppDef) -> dict[str, Any]:
    """The plain-data form of ``app`` that :func:`app_from_dict` reads back."""
    roles = []
    for r in app.roles:
        role: dict[str, Any] = {
            "name": r.name,
            "image": r.image,
            "entrypoint": r.entrypoint,
            "args": list(r.args),
            "env": dict(r.env),
            "num_replicas": r.num_replicas,
            "max_retries": r.max_retries,
            "retry_policy": r.retry_policy.value,
            "resource": {
                "cpu": r.resource.cpu,
                "gpu": r.resource.gpu,
                "memMB": r.resource.memMB,
                "capabilities": dict(r.resource.capabilities),
                "devices": dict(r.resource.devices),
            },
            "port_map": dict(r.port_map),
            "metadata": dict(r.metadata),
            "mounts": [_mount_str(m) for m in r.mounts],
        }
        if r.base_image is not None:
            role["base_image"] = r.base_image
        if r.min_replicas is not None:
            role["min_replicas"] = r.min_replicas
        roles.append(role)
    return {"name": app.name, "roles": roles, "metadata": dict(app.metadata)}


def dump_app(app: AppDef) -> str:
    """``app`` as YAML text."""
    return yaml.safe_dump(app_to_dict(app), sort_keys=False)
