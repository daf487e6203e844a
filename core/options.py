"""Run options: the typed configuration (cfg) a scheduler takes.

A scheduler describes its options with a :class:`runopts` (names, types, defaults, help: what
``shipyard runopts NAME`` prints); :meth:`runopts.resolve` checks a cfg against them and fills in
the defaults, and :meth:`runopts.cfg_from_str` parses ``"k1=v1,k2=v2"`` from a command line.
Each scheduler module also exports its options as a ``TypedDict`` (``LocalOpts``, ``SlurmOpts``)
for type checkers; every name here is importable from :mod:`core.specs` too.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Cfg", "CfgVal", "cfg_from_str", "runopt", "runopts"]

#: the value of one run option, once resolved
CfgVal = str | int | float | bool | list[str] | dict[str, str] | None

#: a cfg as callers give it: option names to values, as a plain mapping or a scheduler's
#: options ``TypedDict`` (``LocalOpts``, ``SlurmOpts`` ...); :meth:`runopts.resolve` checks
#: every name and value
Cfg = Mapping[str, object]

_TYPE_NAMES: dict[Any, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    list[str]: "typing.List[str]",
    dict[str, str]: "typing.Dict[str, str]",
}


@dataclass
class runopt:  # noqa: N801 - name fixed by the specification
    """One run option: its type, default, whether it is required, and its help text."""

    default: CfgVal
    opt_type: Any
    is_required: bool
    help: str

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(
            self.opt_type, getattr(self.opt_type, "__name__", str(self.opt_type))
        )


def _parse_bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"cfg.{name}: expected a bool (true/false), got {value!r}")


def _parse_dict(name: str, value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in re.split(r"[,;]", value):
        item = item.strip()
        if not item:
            continue
        key, sep, val = item.partition(":")
        if not sep:
            key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"cfg.{name}: expected KEY:VALUE pairs separated by ',' or ';', got {item!r}"
            )
        out[key.strip()] = val
    return out


class runopts:  # noqa: N801 - name fixed by the specification
    """The typed run options of a scheduler: ``--help`` for its cfg.

    >>> opts = runopts()
    >>> opts.add("log_dir", type_=str, help="where logs go", default=None)
    >>> opts.resolve({"log_dir": "/tmp/x"})["log_dir"]
    '/tmp/x'
    """

    def __init__(self) -> None:
        self._opts: dict[str, runopt] = {}

    def add(
        self,
        cfg_key: str,
        type_: Any,
        help: str,
        default: CfgVal = None,
        required: bool = False,
    ) -> None:
        """Adds an option. A required option must not have a default."""
        if required and default is not None:
            raise ValueError(f"runopts.add({cfg_key!r}): a required option cannot have a default")
        if default is not None and not self._is_type(default, type_):
            raise TypeError(f"runopts.add({cfg_key!r}): default {default!r} is not of type {type_}")
        self._opts[cfg_key] = runopt(default, type_, required, help)

    def update(self, other: runopts) -> None:
        """Adds every option of ``other``."""
        self._opts.update(other._opts)

    def get(self, name: str) -> runopt | None:
        """The option called ``name``, or None."""
        return self._opts.get(name)

    def __iter__(self) -> Iterator[tuple[str, runopt]]:
        return iter(self._opts.items())

    def __len__(self) -> int:
        return len(self._opts)

    def __contains__(self, name: object) -> bool:
        return name in self._opts

    @staticmethod
    def _is_type(value: Any, type_: Any) -> bool:
        if type_ is bool:
            return isinstance(value, bool)
        if type_ is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if type_ is float:
            return isinstance(value, int | float) and not isinstance(value, bool)
        if type_ == list[str]:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        if type_ == dict[str, str]:
            return isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            )
        return isinstance(value, type_)

    def _coerce(self, name: str, opt: runopt, value: Any) -> CfgVal:
        if value is None or self._is_type(value, opt.opt_type):
            if opt.opt_type is float and isinstance(value, int):
                return float(value)
            return value  # type: ignore[no-any-return]
        if isinstance(value, str):
            return self._from_str(name, opt, value)
        raise ValueError(
            f"cfg.{name}: expected {opt.type_name}, got {type(value).__name__} {value!r}"
        )

    def _from_str(self, name: str, opt: runopt, value: str) -> CfgVal:
        t = opt.opt_type
        if t is str:
            return value
        if t is bool:
            return _parse_bool(name, value)
        if t is int or t is float:
            try:
                return t(value.strip())  # type: ignore[no-any-return]
            except ValueError:
                raise ValueError(f"cfg.{name}: expected {opt.type_name}, got {value!r}") from None
        if t == list[str]:
            return [v for v in re.split(r"[,;]", value) if v]
        if t == dict[str, str]:
            return _parse_dict(name, value)
        raise ValueError(f"cfg.{name}: cannot parse {value!r} as {opt.type_name}")

    def resolve(self, cfg: Cfg | None) -> dict[str, CfgVal]:
        """Checks ``cfg`` against the options and fills in defaults.

        Strings are converted to the option's type (as given on a command line).

        Raises:
            ValueError: for an unknown key (listing the valid ones), a value of the wrong type, or
                a missing required option.
        """
        cfg = dict(cfg or {})
        unknown = sorted(str(k) for k in cfg if k not in self._opts)
        if unknown:
            raise ValueError(
                f"cfg: unknown option(s) {', '.join(unknown)}; valid options are:"
                f" {', '.join(self._opts) or '(none)'}"
            )
        resolved: dict[str, CfgVal] = {}
        for name, opt in self._opts.items():
            value = self._coerce(name, opt, cfg.get(name))
            if value is None:
                if opt.is_required:
                    raise ValueError(
                        f"cfg.{name}: required option is missing ({opt.type_name}: {opt.help})"
                    )
                value = opt.default
                if isinstance(value, list | dict):  # (each app its own)
                    value = copy.deepcopy(value)
            resolved[name] = value
        return resolved

    def coerce(self, cfg: Cfg) -> dict[str, CfgVal]:
        """The options ``cfg`` gives, checked and converted to their types (strings parsed as
        on a command line); no defaults filled in, and a required option may be missing (a
        later layer, or :meth:`resolve`, supplies it).

        Raises:
            ValueError: for an unknown key (listing the valid ones) or a value of the wrong type.
        """
        unknown = sorted(str(k) for k in cfg if k not in self._opts)
        if unknown:
            raise ValueError(
                f"cfg: unknown option(s) {', '.join(unknown)}; valid options are:"
                f" {', '.join(self._opts) or '(none)'}"
            )
        return {name: self._coerce(name, self._opts[name], value) for name, value in cfg.items()}

    def cfg_from_str(self, cfg_str: str) -> dict[str, CfgVal]:
        """Parses ``"k1=v1,k2=v2"`` into a typed cfg.

        A comma-separated part without ``=`` continues the previous value, so list and dict
        options can be given as ``copy_env=A*,B*`` or ``env=A:1,B:2``. Only the options given
        are returned (see :meth:`coerce`).
        """
        parsed: dict[str, str] = {}
        key: str | None = None
        for part in cfg_str.split(","):
            if "=" in part and (key is None or part.partition("=")[0].strip() in self._opts):
                k, _, v = part.partition("=")
                key = k.strip()
                parsed[key] = v
            elif key is not None:
                parsed[key] += "," + part
            elif part.strip():
                raise ValueError(f"cfg: expected key=value, got {part!r}")
        return self.coerce(parsed)

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        required = [(k, o) for k, o in self._opts.items() if o.is_required]
        optional = [(k, o) for k, o in self._opts.items() if not o.is_required]
        out: list[str] = []
        for title, opts in (("required arguments", required), ("optional arguments", optional)):
            if not opts:
                continue
            out.append(f"    {title}:")
            for key, opt in opts:
                if opt.is_required:
                    out.append(f"        {key}={key.upper()} ({opt.type_name})")
                else:
                    out.append(f"        {key}={key.upper()} ({opt.type_name}, {opt.default})")
                out.append(f"            {opt.help}")
            out.append("")
        return "\n".join(out)


def cfg_from_str(opts: runopts, cfg_str: str) -> dict[str, CfgVal]:
    """Function form of :meth:`runopts.cfg_from_str`."""
    return opts.cfg_from_str(cfg_str)
