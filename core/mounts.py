"""Mounts of a role, in the Docker ``--mount`` style (:func:`parse_mounts`): host directories
(:class:`BindMount`), named volumes (:class:`VolumeMount`) and devices (:class:`DeviceMount`).

Part of the app model; :mod:`core.specs` exports these names (where the specification puts
them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.errors import short_repr

__all__ = ["BindMount", "DeviceMount", "Mount", "VolumeMount", "parse_mounts"]


@dataclass
class BindMount:
    """A host directory mounted into the replica: ``type=bind,src=HOST,dst=PATH[,readonly]``."""

    src_path: str
    dst_path: str
    read_only: bool = False


@dataclass
class VolumeMount:
    """A named volume mounted into the replica: ``type=volume,src=NAME,dst=PATH[,readonly]``."""

    src: str
    dst_path: str
    read_only: bool = False


@dataclass
class DeviceMount:
    """A host device exposed to the replica: ``type=device,src=DEV[,dst=PATH][,perm=rwm]``."""

    src_path: str
    dst_path: str
    permissions: str = "rwm"


Mount = BindMount | VolumeMount | DeviceMount


def _mount_tokens(opts: Iterable[str]) -> list[list[str]]:
    """Splits the mount options into one token list per ``type=`` group."""
    groups: list[list[str]] = []
    for opt in opts:
        for token in str(opt).split(","):
            token = token.strip()
            if not token:
                continue
            if token.startswith("type="):
                groups.append([token])
            elif not groups:
                raise ValueError(
                    f"mounts: each mount must start with type=bind|volume|device, got {short_repr(token)}"
                )
            else:
                groups[-1].append(token)
    return groups


def parse_mounts(opts: Iterable[str] | str) -> list[Mount]:
    """Parses mount specifications in the Docker ``--mount`` style.

    Accepts a single string (``"type=bind,src=/a,dst=/b,readonly"``), several such strings, or the
    comma-split tokens of them. Keys: ``type`` (bind, volume, device), ``src``/``source``,
    ``dst``/``destination``/``target``, ``readonly``/``ro`` and, for devices, ``perm``/``permissions``.

    Raises:
        ValueError: naming the mount and the key that is missing or not understood.
    """
    if isinstance(opts, str):
        opts = [opts]
    mounts: list[Mount] = []
    for i, group in enumerate(_mount_tokens(opts)):
        where = f"mounts[{i}]"
        kv: dict[str, str] = {}
        for token in group:
            key, sep, val = token.partition("=")
            key = key.strip().lower()
            if key in ("readonly", "ro"):
                if sep and val.lower() not in ("true", "1", "yes", "false", "0", "no"):
                    raise ValueError(
                        f"{where}.readonly: expected true/false, got {short_repr(val)}"
                    )
                kv["readonly"] = "false" if sep and val.lower() in ("false", "0", "no") else "true"
                continue
            if not sep:
                raise ValueError(f"{where}: expected key=value, got {short_repr(token)}")
            key = {
                "source": "src",
                "destination": "dst",
                "target": "dst",
                "perm": "permissions",
            }.get(key, key)
            if key not in ("type", "src", "dst", "permissions"):
                raise ValueError(
                    f"{where}: unknown key {short_repr(key)}; expected type, src, dst, readonly, permissions"
                )
            kv[key] = val
        kind = kv["type"]
        read_only = kv.get("readonly") == "true"
        if kind not in ("bind", "volume", "device"):
            raise ValueError(
                f"{where}.type: expected bind, volume or device, got {short_repr(kind)}"
            )
        src = kv.get("src")
        if not src:
            raise ValueError(f"{where}.src: required for type={kind}")
        if kind == "device":
            perm = kv.get("permissions", "rwm")
            if not perm or set(perm) - set("rwm"):
                raise ValueError(
                    f"{where}.permissions: expected letters of 'rwm', got {short_repr(perm)}"
                )
            mounts.append(
                DeviceMount(src_path=src, dst_path=kv.get("dst") or src, permissions=perm)
            )
            continue
        dst = kv.get("dst")
        if not dst:
            raise ValueError(f"{where}.dst: required for type={kind}")
        if kind == "bind":
            mounts.append(BindMount(src_path=src, dst_path=dst, read_only=read_only))
        else:
            mounts.append(VolumeMount(src=src, dst_path=dst, read_only=read_only))
    return mounts
