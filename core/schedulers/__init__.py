"""Scheduler discovery: backends register a factory in the ``shipyard.schedulers`` entry-point group.

A third party registers its own scheduler with, in its ``pyproject.toml``::

    [project.entry-points."shipyard.schedulers"]
    my_backend = "my_pkg.my_scheduler:create_scheduler"

where ``create_scheduler(session_name: str, **kwargs) -> Scheduler``. The built-in names
(``local_cwd``, ``local_dir``, ``local_docker``, ``slurm``) are Shipyard's own whatever an entry
point says, and are found without reading the installed packages' entry points (a command on a
built-in scheduler starts without ``importlib.metadata``: bench row ``shipyard run --wait``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, Protocol

from core.schedulers.api import Scheduler

__all__ = [
    "Scheduler",
    "SchedulerFactory",
    "available_schedulers",
    "get_default_scheduler_name",
    "get_scheduler_factories",
]

ENTRY_POINT_GROUP = "shipyard.schedulers"

# Used when the package metadata is not installed (running from a source tree).
_BUILTIN: dict[str, str] = {
    "local_cwd": "core.schedulers.local_scheduler:create_cwd_scheduler",
    "local_dir": "core.schedulers.local_scheduler:create_scheduler",
    "local_docker": "core.schedulers.docker_scheduler:create_scheduler",
    "slurm": "core.schedulers.slurm_scheduler:create_scheduler",
}


class SchedulerFactory(Protocol):
    """Creates a scheduler for a session: ``factory(session_name, **kwargs) -> Scheduler``."""

    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler[Any]: ...


class _LazyFactory:
    """Imports the scheduler module only when a scheduler is first created (keeps imports fast)."""

    def __init__(self, name: str, target: str) -> None:
        self.name, self.target = name, target

    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler[Any]:
        module, _, attr = self.target.partition(":")
        factory = getattr(importlib.import_module(module), attr)
        return factory(session_name, **kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"SchedulerFactory({self.name}={self.target})"


@cache
def _discover() -> tuple[tuple[str, _LazyFactory], ...]:
    from importlib.metadata import entry_points

    found = {name: _LazyFactory(name, target) for name, target in _BUILTIN.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, _LazyFactory(ep.name, ep.value))
    # local_cwd first: the first scheduler is the default one.
    ordered = sorted(found.items(), key=lambda kv: (kv[0] != "local_cwd", kv[0] not in _BUILTIN))
    return tuple(ordered)


def get_scheduler_factories() -> dict[str, SchedulerFactory]:
    """All available scheduler names and the factories that create them; the first is the default."""
    return dict(_discover())


class _Available(Mapping[str, SchedulerFactory]):
    """Every available scheduler by name: a built-in one is found at once, the others (and the
    whole list) from the entry points, read on first need."""

    def __getitem__(self, name: str) -> SchedulerFactory:
        target = _BUILTIN.get(name)
        if target is not None:
            return _LazyFactory(name, target)
        return dict(_discover())[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict(_discover()))

    def __len__(self) -> int:
        return len(_discover())


def available_schedulers() -> Mapping[str, SchedulerFactory]:
    """:func:`get_scheduler_factories` as a mapping that reads the entry points only when a
    name other than a built-in one is asked for, or the whole list."""
    return _Available()


def get_default_scheduler_name() -> str:
    """``local_cwd``: the first scheduler of :func:`get_scheduler_factories`."""
    return "local_cwd"
