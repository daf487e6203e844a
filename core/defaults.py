"""Defaults of the ``shipyard`` command: a scheduler and each scheduler's run options, from a
file, as TorchX's ``.torchxconfig``.

The file is YAML::

    scheduler: slurm              # instead of local_cwd, when no --scheduler is given
    slurm:
      partition: debug
      time_limit: 2h
    local_docker:
      network: my-net

Where it is read (:func:`config_paths`): ``$SHIPYARD_CONFIG`` alone if set; otherwise
``$XDG_CONFIG_HOME/shipyard/config.yaml`` (``~/.config/shipyard/config.yaml``), then
``.shipyardconfig`` in the working directory, whose keys win over the first's.

Precedence, for the scheduler and for each run option: the command's flags (``--scheduler``,
``--cfg``), then the environment (``$SHIPYARD_SCHEDULER``; ``$SHIPYARD_CFG_<SCHEDULER>`` as
``k=v,k2=v2``, e.g. ``SHIPYARD_CFG_LOCAL_DOCKER``), then the files. A file that is not valid
YAML, a key that is no scheduler, an unknown option or a value of the wrong type is an error
naming the file (or the variable) and the key, raised before anything is submitted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.errors import ShipyardError

if TYPE_CHECKING:
    from core.options import CfgVal, runopts

__all__ = [
    "CONFIG_ENV",
    "PROJECT_FILE",
    "SCHEDULER_ENV",
    "Defaults",
    "DefaultsError",
    "cfg_env_name",
    "config_paths",
    "load_defaults",
    "scheduler_and_cfg",
]

#: a defaults file to read instead of the user's and the project's
CONFIG_ENV = "SHIPYARD_CONFIG"
#: the default scheduler, over the files'
SCHEDULER_ENV = "SHIPYARD_SCHEDULER"
#: ``SHIPYARD_CFG_<SCHEDULER>``: a scheduler's run options (``k=v,k2=v2``), over the files'
CFG_ENV_PREFIX = "SHIPYARD_CFG_"
#: the project's defaults file, in the working directory
PROJECT_FILE = ".shipyardconfig"
#: the key of the default scheduler in a file
SCHEDULER_KEY = "scheduler"


class DefaultsError(ShipyardError, ValueError):
    """A defaults file, or a variable, that cannot be used (one line naming it and the key)."""


def cfg_env_name(scheduler: str) -> str:
    """The variable of a scheduler's run options: ``local_docker`` -> ``SHIPYARD_CFG_LOCAL_DOCKER``."""
    return CFG_ENV_PREFIX + "".join(c if c.isalnum() else "_" for c in scheduler).upper()


def config_paths(
    cwd: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The defaults files that exist, the one that wins last.

    Raises:
        DefaultsError: ``$SHIPYARD_CONFIG`` names a file that does not exist.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(CONFIG_ENV)
    if explicit:
        path = os.path.expanduser(explicit)
        if not os.path.isfile(path):
            raise DefaultsError(f"{CONFIG_ENV}: no such file {explicit!r}")
        return [path]
    home = env.get("HOME") or os.path.expanduser("~")
    config_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    user = os.path.join(config_home, "shipyard", "config.yaml")
    project = os.path.join(os.getcwd() if cwd is None else cwd, PROJECT_FILE)
    return [p for p in (user, project) if os.path.isfile(p)]


@dataclass(frozen=True)
class Defaults:
    """What the defaults files and the environment say.

    Attributes:
        scheduler: the default scheduler (the environment's, else the files'); None: none
        cfg: each scheduler's run options from the files, as written
        origins: where each came from: ``(scheduler, option)`` (``("", "scheduler")`` for the
            default scheduler) -> the file or the variable
        environ: the environment read
    """

    scheduler: str | None = None
    cfg: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    origins: Mapping[tuple[str, str], str] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)

    def pick_scheduler(self, flag: str | None, schedulers: Collection[str]) -> str:
        """The scheduler to use: ``flag`` (``--scheduler``), else the default one, else
        Shipyard's (``local_cwd``) if it is one of ``schedulers``, else their first."""
        from core.schedulers import get_default_scheduler_name

        first = get_default_scheduler_name()
        return flag or self.scheduler or (first if first in schedulers else next(iter(schedulers)))

    def run_cfg(
        self, scheduler: str, opts: runopts, flags: Mapping[str, CfgVal]
    ) -> dict[str, CfgVal]:
        """``scheduler``'s run options: the files' under the environment's under ``flags``
        (already parsed from ``--cfg``), each checked against ``opts``.

        Raises:
            DefaultsError: naming the file or variable and the option, for an unknown option
                or a value of the wrong type.
        """
        merged: dict[str, CfgVal] = {}
        for key, value in self.cfg.get(scheduler, {}).items():
            where = self.origins.get((scheduler, key), "defaults file")
            merged[key] = _checked(opts, key, _as_cfg_value(value), f"{where}: {scheduler}.{key}")
        var = cfg_env_name(scheduler)
        text = self.environ.get(var, "").strip()
        if text:
            try:
                merged.update(opts.cfg_from_str(text))
            except ValueError as e:  # (its message names the option: cfg.partition: ...)
                raise DefaultsError(f"{var}: {str(e).splitlines()[0]}") from None
        merged.update(flags)
        return merged


def _as_cfg_value(value: Any) -> Any:
    """A YAML value as a run option takes it: numbers and booleans of a string option as their
    text, lists and mappings of scalars as strings (``[A*, B*]``, ``{A: 1}``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return [_scalar_text(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _scalar_text(v) for k, v in value.items()}
    return value


def _scalar_text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


def _checked(opts: runopts, key: str, value: Any, where: str) -> CfgVal:
    """``value`` of option ``key`` in its type; numbers given to a string option are read as
    their text."""
    opt = opts.get(key)
    if opt is None:
        valid = ", ".join(name for name, _ in opts) or "(none)"
        raise DefaultsError(f"{where}: unknown option; valid options are: {valid}")
    if opt.opt_type is str and isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    try:
        return opts.coerce({key: value})[key]
    except ValueError as e:
        raise DefaultsError(f"{where}: {_detail(e)}") from None


def _detail(e: ValueError) -> str:
    """A run option error without its ``cfg.key: `` prefix (the caller names the key)."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    head, sep, rest = text.partition(": ")
    return rest if sep and head.startswith("cfg") and rest else text


def load_defaults(
    schedulers: Collection[str],
    cwd: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Defaults:
    """Reads the defaults files (:func:`config_paths`) and ``$SHIPYARD_SCHEDULER``, checking
    their shape: a mapping of ``scheduler`` (one of ``schedulers``) and of scheduler names to
    mappings of options (their names and values are checked by :meth:`Defaults.run_cfg`, with
    the scheduler's run options).

    Raises:
        DefaultsError: one line naming the file (and line) or variable, and the key.
    """
    env = dict(os.environ if environ is None else environ)
    scheduler: str | None = None
    cfg: dict[str, dict[str, Any]] = {}
    origins: dict[tuple[str, str], str] = {}
    for path in config_paths(cwd, env):
        data = _read(path)
        for key, value in data.items():
            where = f"{path}: {key}"
            if key == SCHEDULER_KEY:
                scheduler = _scheduler_name(value, schedulers, where)
                origins[("", SCHEDULER_KEY)] = str(path)
                continue
            if key not in schedulers:
                raise DefaultsError(
                    f"{where}: not a scheduler; expected {SCHEDULER_KEY} or one of"
                    f" {', '.join(schedulers)}"
                )
            if value is None:
                continue
            if not isinstance(value, dict):
                raise DefaultsError(f"{where}: expected a mapping of run options, got {value!r}")
            for option, v in value.items():
                if not isinstance(option, str):
                    raise DefaultsError(f"{where}.{option}: expected an option name")
                cfg.setdefault(key, {})[option] = v
                origins[(key, option)] = str(path)
    from_env = env.get(SCHEDULER_ENV, "").strip()
    if from_env:
        scheduler = _scheduler_name(from_env, schedulers, SCHEDULER_ENV)
        origins[("", SCHEDULER_KEY)] = SCHEDULER_ENV
    return Defaults(scheduler, cfg, origins, env)


def _scheduler_name(value: Any, schedulers: Collection[str], where: str) -> str:
    if not isinstance(value, str) or value not in schedulers:
        raise DefaultsError(
            f"{where}: unknown scheduler {value!r}; expected one of {', '.join(schedulers)}"
        )
    return value


def scheduler_and_cfg(
    flag_scheduler: str | None,
    flag_cfg: str | None,
    schedulers: Collection[str],
    opts_of: Callable[[str], runopts],
    cwd: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, dict[str, CfgVal]]:
    """The scheduler and run options of a command: its flags (``--scheduler``, ``--cfg``
    text) over the environment over the defaults files (``opts_of(name)``: the scheduler's
    run options, to check them).

    Raises:
        DefaultsError: a file or variable that cannot be used (naming it and the key).
        ValueError: an unknown scheduler, or a bad ``--cfg``.
    """
    defaults = load_defaults(schedulers, cwd, environ)
    scheduler = defaults.pick_scheduler(flag_scheduler, schedulers)
    if scheduler not in schedulers:
        raise ValueError(
            f"--scheduler: unknown scheduler {scheduler!r}; expected one of {', '.join(schedulers)}"
        )
    opts = opts_of(scheduler)
    flags = opts.cfg_from_str(flag_cfg) if flag_cfg else {}
    return scheduler, defaults.run_cfg(scheduler, opts, flags)


def _read(path: str) -> dict[Any, Any]:
    """The file's YAML mapping (empty for an empty file)."""
    import yaml  # (only when there is a file)

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DefaultsError(f"{path}: cannot read it ({e})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise DefaultsError(f"{path}{at}: not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DefaultsError(
            f"{path}: expected a mapping of {SCHEDULER_KEY} and schedulers, got"
            f" {type(data).__name__}"
        )
    return data
