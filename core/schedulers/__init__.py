"""Scheduler discovery: backends register a factory in the ``shipyard.schedulers`` entry-point group.

A third party registers its own scheduler with, in its ``pyproject.toml``::

    [project.entry-points."shipyard.schedulers"]
    my_backend = "my_pkg.my_scheduler:create_scheduler"

where ``create_scheduler(session_name: str, **kwargs) -> Scheduler``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from functools import cache
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

    def __init__(self, name: str, target: str, loader: Callable[[], Any] | None = None) -> None:
        self.name = name
        self.target = target
        self._loader = loader

    def _load(self) -> Callable[..., Scheduler[Any]]:
        if self._loader is not None:
            return self._loader()  # type: ignore[no-any-return]
        return _load_target(self.target)  # type: ignore[no-any-return]

    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler[Any]:
        return self._load()(session_name, **kwargs)

    def __repr__(self) -> str:
        return f"SchedulerFactory({self.name}={self.target})"


# "module[:attr.attr] [extras]", as in importlib.metadata.EntryPoint
_EP_VALUE_RE = re.compile(r"^(?P<module>[\w.]+)\s*(?::\s*(?P<attr>[\w.]+)\s*)?(?:\[.*\]\s*)?$")


def _load_target(target: str) -> Any:
    m = _EP_VALUE_RE.match(target)
    if m is None:
        raise ValueError(f"{ENTRY_POINT_GROUP}: malformed entry point {target!r}")
    obj: Any = importlib.import_module(m.group("module"))
    for part in filter(None, (m.group("attr") or "").split(".")):
        obj = getattr(obj, part)
    return obj


def _path_dirs() -> list[list[Any]]:
    """``[dir, mtime]`` of every ``sys.path`` entry: a directory's mtime changes when a
    distribution is installed into it, removed or reinstalled (installers recreate the
    ``*.dist-info`` directory)."""
    parts: list[list[Any]] = []
    for entry in sys.path:
        path = os.path.abspath(entry or os.curdir)
        try:
            parts.append([path, os.stat(path).st_mtime_ns])
        except OSError:
            continue
    return parts


def _declaring_files(dirs: list[list[Any]]) -> list[list[Any]]:
    """``[file, mtime]`` of each ``entry_points.txt`` in ``dirs`` (from :func:`_path_dirs`) that
    declares the group (an in-place edit of one changes no directory's mtime)."""
    marker = f"[{ENTRY_POINT_GROUP}]"
    found: list[list[Any]] = []
    for path, _ in dirs:
        try:
            with os.scandir(path) as it:
                names = [e.name for e in it if e.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
        for name in names:
            file = os.path.join(path, name, "entry_points.txt")
            try:
                with open(file, encoding="utf-8", errors="replace") as f:
                    if marker not in f.read():
                        continue
                found.append([file, os.stat(file).st_mtime_ns])
            except OSError:
                continue
    return found


def _fingerprint(dirs: list[list[Any]], files: list[list[Any]]) -> list[Any]:
    """What the cached entry points depend on: the interpreter, the ``sys.path`` directories
    (``dirs``, from :func:`_path_dirs`) and the files that declared the group when they were
    read. ~0.1 ms."""
    parts: list[Any] = [sys.prefix, *dirs]
    for file, _ in files:
        try:
            parts.append([file, os.stat(file).st_mtime_ns])
        except OSError:
            parts.append([file, None])
    return parts


def _cache_file() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    import zlib

    return os.path.join(
        base, "shipyard", f"entry-points-{zlib.crc32(sys.prefix.encode()):08x}.json"
    )


_CACHED_KEYS = 8  # sys.path set-ups remembered (the console script, python -m in a few dirs...)


def _entry_points() -> list[tuple[str, str]]:
    """``(name, target)`` of the installed ``shipyard.schedulers`` entry points.

    Reading them with importlib.metadata costs ~80 ms of CPU (its imports, then the metadata of
    every installed distribution), more than the rest of a ``shipyard`` command; the result is
    cached (``~/.cache/shipyard``) under a :func:`_fingerprint` of what it was read from, so an
    installed, removed or reinstalled distribution, or an edited ``entry_points.txt`` that
    declared the group, is seen at once. (A distribution whose metadata is edited in place to
    declare the group for the first time, without a reinstall, is seen after the next install.)
    """
    path = _cache_file()
    dirs = _path_dirs()
    entries: list[Any] = []
    try:
        with open(path, encoding="utf-8") as f:
            entries = list(json.load(f)["entries"])
        for entry in entries:
            if entry["key"] == _fingerprint(dirs, entry["files"]):
                return [(str(n), str(t)) for n, t in entry["entry_points"]]
    except (OSError, ValueError, KeyError, TypeError):
        entries = []
    files = _declaring_files(dirs)
    key = _fingerprint(dirs, files)
    from importlib.metadata import entry_points

    found = [(ep.name, ep.value) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            new = {"key": key, "files": files, "entry_points": found}
            json.dump({"entries": [new, *entries][:_CACHED_KEYS]}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # no cache: the next process reads the metadata again
    return found


@cache
def _discover() -> tuple[tuple[str, _LazyFactory], ...]:
    found: dict[str, _LazyFactory] = {}
    for name, target in _entry_points():
        found[name] = _LazyFactory(name, target)
    for name, target in _BUILTIN.items():
        found.setdefault(name, _LazyFactory(name, target))
    # local_cwd first: the first scheduler is the default one.
    ordered = sorted(found.items(), key=lambda kv: (kv[0] != "local_cwd", kv[0] not in _BUILTIN))
    return tuple(ordered)


def get_scheduler_factories() -> dict[str, SchedulerFactory]:
    """All available scheduler names and the factories that create them; the first is the default."""
    return dict(_discover())


def get_default_scheduler_name() -> str:
    """The first scheduler of :func:`get_scheduler_factories` (``local_cwd``)."""
    return next(iter(get_scheduler_factories()))
