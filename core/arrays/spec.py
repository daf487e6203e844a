"""What an array is: its elements (``size`` indices, or one per ``params`` mapping), its cap, and
the app each element runs (the array's app with ``${array_index}`` and ``${params.NAME}``
substituted and ``$SHIPYARD_ARRAY_*`` set). Validated whole before anything starts."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from core.errors import ShipyardError, short_repr
from core.specs import AppDef, validate_app

__all__ = [
    "AFTER_CONDITIONS",
    "ARRAY_ID_ENV",
    "ArraySpec",
    "ArraySpecError",
    "INDEX_ENV",
    "MAX_ELEMENTS",
    "PARAMS_ENV",
    "array_template",
    "element_app",
    "value_macro",
    "check_after_condition",
    "check_allow_failures",
    "make_spec",
]

#: most elements one array may have (Slurm's own default MaxArraySize is 1001)
MAX_ELEMENTS = 100_000
INDEX_ENV = "SHIPYARD_ARRAY_INDEX"
PARAMS_ENV = "SHIPYARD_ARRAY_PARAMS"
ARRAY_ID_ENV = "SHIPYARD_ARRAY_ID"
#: when an app that waits for others may start: they all succeeded (ok), all ended (any), all
#: ended without success (notok) -- Slurm's afterok, afterany, afternotok
AFTER_CONDITIONS = ("ok", "any", "notok")

# ${array_index} and ${params.NAME}; other ${...} are the schedulers' macros or the shell's
_MACRO_RE = re.compile(r"\$\{(array_index|params\.([A-Za-z_][A-Za-z0-9_]*))\}")


class ArraySpecError(ShipyardError, ValueError):
    """An array's arguments are invalid (the message names the argument)."""


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """An array's elements and cap: ``params`` is None for a ``size`` array."""

    size: int
    params: list[dict[str, Any]] | None
    max_parallel: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (what the array's driver reads back)."""
        return {"size": self.size, "params": self.params, "max_parallel": self.max_parallel}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArraySpec:
        """The inverse of :meth:`to_json`."""
        return cls(int(data["size"]), data["params"], int(data["max_parallel"]))


def check_after_condition(value: Any) -> str:
    """``value`` if it is one of :data:`AFTER_CONDITIONS`, else an error naming the argument."""
    if value not in AFTER_CONDITIONS:
        raise ArraySpecError(
            f"after_condition: expected one of {', '.join(AFTER_CONDITIONS)}, got {short_repr(value)}"
        )
    return str(value)


def check_allow_failures(value: Any) -> int:
    """How many of an array's elements may fail with the caller still succeeding (the Airflow
    operator's and Prefect's ``allow_failures``), else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArraySpecError(f"allow_failures: expected a non-negative integer, got {value!r}")
    return value


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArraySpecError(f"{name}: expected a positive integer, got {short_repr(value)}")
    return value


def _params(params: Any) -> list[dict[str, Any]]:
    if isinstance(params, (str, bytes, Mapping)) or not isinstance(params, Sequence):
        raise ArraySpecError(f"params: expected a list of mappings, got {short_repr(params)}")
    out = []
    for i, p in enumerate(params):
        if not isinstance(p, Mapping) or not all(isinstance(k, str) for k in p):
            raise ArraySpecError(
                f"params[{i}]: expected a mapping with string keys, got {short_repr(p)}"
            )
        try:
            json.dumps(dict(p))
        except (TypeError, ValueError) as e:
            raise ArraySpecError(f"params[{i}]: expected JSON values ({e})") from None
        out.append(dict(p))
    return out


def make_spec(
    app: AppDef, size: Any = None, params: Any = None, max_parallel: Any = None
) -> ArraySpec:
    """Checks an array's arguments and every element's app; raises :class:`ArraySpecError`
    (a ``ValueError``) naming the argument, or the app's own ``ValueError``."""
    if size is not None and params is not None:
        raise ArraySpecError("size, params: expected one of them, got both")
    if size is None and params is None:
        raise ArraySpecError("size: expected the number of elements (or params), got neither")
    plist = _params(params) if params is not None else None
    n = len(plist) if plist is not None else _positive(size, "size")
    if n < 1:
        raise ArraySpecError("params: expected at least one mapping, got an empty list")
    if n > MAX_ELEMENTS:
        raise ArraySpecError(f"size: expected at most {MAX_ELEMENTS} elements, got {n}")
    cap = n if max_parallel is None else _positive(max_parallel, "max_parallel")
    spec = ArraySpec(n, plist, min(cap, n))
    validate_app(app)
    _check_macros(app, spec)
    return spec


def _check_macros(app: AppDef, spec: ArraySpec) -> None:
    """Every element's macros resolve (before anything starts): each string that has one is
    substituted for every element (the app itself is copied for none)."""
    texts = [
        (text, f"{what} of role {role.name!r}")
        for role in app.roles
        for text, what in [
            *((a, "args") for a in role.args),
            *((v, f"env {k}") for k, v in role.env.items()),
        ]
        if "${params." in text
    ]
    for i in range(spec.size) if texts else ():
        params = spec.params[i] if spec.params is not None else None
        for text, where in texts:
            _substitute(text, i, params, where)


def element_app(app: AppDef, spec: ArraySpec, index: int, array_id: str) -> AppDef:
    """The app element ``index`` runs: macros substituted, ``$SHIPYARD_ARRAY_*`` set."""
    params = spec.params[index] if spec.params is not None else None
    out = _with_own_roles(app)
    for role in out.roles:
        where = f"role {role.name!r}"
        role.args = [_substitute(a, index, params, f"args of {where}") for a in role.args]
        role.env = {
            k: _substitute(v, index, params, f"env {k} of {where}") for k, v in role.env.items()
        }
        role.env[INDEX_ENV] = str(index)
        role.env[ARRAY_ID_ENV] = array_id
        if params is not None:
            role.env[PARAMS_ENV] = json.dumps(params, separators=(",", ":"))
    return out


def value_macro(n: int) -> str:
    """The placeholder of the ``n``-th per-element value in :func:`array_template`'s app."""
    return f"${{shipyard_value_{n}}}"


def array_template(
    app: AppDef, spec: ArraySpec, indices: list[int], array_id: str
) -> tuple[AppDef, list[dict[int, str]]]:
    """The app every element of a native array runs, and its per-element values: a string
    with ``${params.NAME}`` becomes the placeholder :func:`value_macro` ``(n)``, whose value in
    element ``i`` is ``values[n][i]``; ``${array_index}`` stays, for the backend to fill in at
    run time. ``$SHIPYARD_ARRAY_*`` are set as :func:`element_app` sets them."""
    out = _with_own_roles(app)
    values: list[dict[int, str]] = []

    def per_element(text: str, where: str) -> str:
        if "${params." not in text:
            return text
        values.append({i: _substitute(text, i, _element_params(spec, i), where) for i in indices})
        return value_macro(len(values) - 1)

    for role in out.roles:
        where = f"role {role.name!r}"
        role.args = [per_element(a, f"args of {where}") for a in role.args]
        role.env = {k: per_element(v, f"env {k} of {where}") for k, v in role.env.items()}
        role.env[INDEX_ENV] = "${array_index}"
        role.env[ARRAY_ID_ENV] = array_id
        if spec.params is not None:
            values.append({i: json.dumps(spec.params[i], separators=(",", ":")) for i in indices})
            role.env[PARAMS_ENV] = value_macro(len(values) - 1)
    return out, values


def _with_own_roles(app: AppDef) -> AppDef:
    """A copy of ``app`` whose roles may get new args and env (what the elements change; the
    rest is shared: a deep copy of each element's app was most of a 1,000-element submit)."""
    return dataclasses.replace(app, roles=[dataclasses.replace(r) for r in app.roles])


def _element_params(spec: ArraySpec, index: int) -> dict[str, Any] | None:
    return spec.params[index] if spec.params is not None else None


def _substitute(text: str, index: int, params: dict[str, Any] | None, where: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(2)
        if name is None:
            return str(index)
        if params is None or name not in params:
            have = "no params (a size array)" if params is None else f"keys {sorted(params)}"
            raise ArraySpecError(
                f"params: {where} uses ${{params.{name}}}, but element {index} has {have}"
            )
        v = params[name]
        return v if isinstance(v, str) else json.dumps(v)

    return _MACRO_RE.sub(value, text)
