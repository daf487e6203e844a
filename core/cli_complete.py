"""Shell completion of the ``shipyard`` command's values (argcomplete completers).

Each completer is a plain function ``(prefix, parsed_args=..., **_) -> list[str]``, called only
when the shell asks (``eval "$(register-python-argcomplete shipyard)"``):

* :func:`schedulers`: the scheduler names (``-s``, ``runopts``);
* :func:`cfg_keys`: the run options of the chosen scheduler as ``key=``, after those already
  given (``--cfg partition=debug,ti<TAB>`` -> ``...,time=``, ``...,time_limit=``), and
  ``true``/``false`` after a bool option's ``=``;
* :func:`handles`: the app handles of the session on one scheduler (the one the prefix names,
  else the default one: one ``list`` call, no status of each app), and ``<scheduler>://``;
  :func:`log_targets` adds ``HANDLE/role/replica`` once a handle is complete.

A completer never raises: a scheduler that cannot answer (no engine, no cluster) offers nothing.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.runner import Runner

__all__ = ["attach", "cfg_keys", "handles", "log_targets", "schedulers"]

log = logging.getLogger(__name__)

Completer = Callable[..., list[str]]


def attach(action: argparse.Action, completer: Completer) -> argparse.Action:
    """Sets ``action``'s argcomplete completer; returns the action."""
    action.completer = completer  # type: ignore[attr-defined]
    return action


def _names() -> list[str]:
    from core.schedulers import get_scheduler_factories

    return list(get_scheduler_factories())


def _default_scheduler(parsed_args: argparse.Namespace | None) -> str:
    """The scheduler the command would use: its ``--scheduler``, else the defaults' (files,
    environment; ignored where they are bad), else the first."""
    chosen = getattr(parsed_args, "scheduler", None)
    names = _names()
    if chosen in names:
        return str(chosen)
    from core.defaults import DefaultsError, load_defaults

    try:
        return load_defaults(names).pick_scheduler(None, names)
    except DefaultsError:
        return names[0]


def _runner() -> Runner:
    from core.runner import get_runner

    return get_runner()


def schedulers(prefix: str, **_: Any) -> list[str]:
    """The scheduler names that start with ``prefix``."""
    return [name for name in _names() if name.startswith(prefix)]


def cfg_keys(prefix: str, parsed_args: argparse.Namespace | None = None, **_: Any) -> list[str]:
    """``--cfg`` completions: the option being typed as ``key=`` (those not given yet), or
    ``true``/``false`` for a bool option's value."""
    head, sep, last = prefix.rpartition(",")
    before = f"{head}{sep}"
    try:
        with _runner() as runner:
            opts = runner.scheduler_run_opts(_default_scheduler(parsed_args))
    except Exception as e:  # (a completer never raises)
        log.debug("no run options to complete: %s", e)
        return []
    key, eq, value = last.partition("=")
    if eq:
        opt = opts.get(key)
        if opt is None or opt.opt_type is not bool:
            return []
        return [f"{before}{key}={v}" for v in ("true", "false") if v.startswith(value)]
    given = {part.partition("=")[0].strip() for part in head.split(",") if "=" in part}
    return [f"{before}{name}=" for name, _ in opts if name.startswith(last) and name not in given]


def handles(prefix: str, parsed_args: argparse.Namespace | None = None, **_: Any) -> list[str]:
    """App handles of the session starting with ``prefix``: of the scheduler the prefix names
    (``slurm://...``), else of the default one, with ``<scheduler>://`` for the others."""
    names = _names()
    scheme, sep, _rest = prefix.partition("://")
    if sep and scheme not in names:
        return []
    scheduler = scheme if sep else _default_scheduler(parsed_args)
    out = [] if sep else [f"{n}://" for n in names if n.startswith(prefix)]
    try:
        with _runner() as runner:
            listed = runner.list(scheduler)
    except Exception as e:  # (an engine or cluster that does not answer: nothing to offer)
        log.debug("cannot list %s to complete handles: %s", scheduler, e)
        return out
    return [a.app_handle for a in listed if a.app_handle.startswith(prefix)] + out


def log_targets(prefix: str, parsed_args: argparse.Namespace | None = None, **_: Any) -> list[str]:
    """``log`` targets: handles (:func:`handles`), then, once the prefix is a whole handle and
    a ``/``, its ``HANDLE/role`` and ``HANDLE/role/replica``."""
    from core.specs import parse_app_handle

    scheme, sep, rest = prefix.partition("://")
    parts = rest.split("/")
    if not sep or len(parts) < 3:  # (scheduler://session/app_id/...: no role yet)
        return handles(prefix, parsed_args)
    handle = f"{scheme}://{parts[0]}/{parts[1]}"
    try:
        parse_app_handle(handle)
        with _runner() as runner:
            replicas = runner.replicas(handle)
    except Exception as e:
        log.debug("no replicas of %s to complete: %s", handle, e)
        return []
    roles = sorted({f"{handle}/{role}" for role, _ in replicas})
    each = [f"{handle}/{role}/{k}" for role, k in replicas]
    return [t for t in roles + each if t.startswith(prefix)]
