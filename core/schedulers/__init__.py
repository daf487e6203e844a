"""Scheduler discovery: backends register a factory in the ``shipyard.schedulers`` entry-point group.

A third party registers its own scheduler with, in its ``pyproject.toml``::

    [project.entry-points."shipyard.schedulers"]
    my_backend = "my_pkg.my_scheduler:create_scheduler"

where ``create_scheduler(session_name: str, **kwargs) -> Scheduler``.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

from core.schedulers.api import Scheduler

__all__ = ["Scheduler", "SchedulerFactory", "get_default_scheduler_name", "get_scheduler_factories"]

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

    def __init__(self, entry_point: EntryPoint) -> None:
        self.entry_point = entry_point

    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler[Any]:
        return self.entry_point.load()(session_name, **kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"SchedulerFactory({self.entry_point.name}={self.entry_point.value})"


@cache
def _discover() -> tuple[tuple[str, _LazyFactory], ...]:
    found: dict[str, _LazyFactory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = _LazyFactory(ep)
    for name, target in _BUILTIN.items():
        if name not in found:
            found[name] = _LazyFactory(EntryPoint(name, target, ENTRY_POINT_GROUP))
    # local_cwd first: the first scheduler is the default one.
    ordered = sorted(found.items(), key=lambda kv: (kv[0] != "local_cwd", kv[0] not in _BUILTIN))
    return tuple(ordered)


def get_scheduler_factories() -> dict[str, SchedulerFactory]:
    """All available scheduler names and the factories that create them; the first is the default."""
    return dict(_discover())


def get_default_scheduler_name() -> str:
    """The first scheduler of :func:`get_scheduler_factories` (``local_cwd``)."""
    return next(iter(get_scheduler_factories()))
