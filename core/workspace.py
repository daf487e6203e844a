"""Workspaces: run an app with the files of a local (or fsspec) directory.

A scheduler that supports workspaces mixes in one of these classes; ``Scheduler.submit(app, cfg,
workspace=PATH)`` then calls :meth:`WorkspaceMixin.build_workspace_and_update_role` for the first
role (other roles sharing its image follow it).
"""

from __future__ import annotations

import abc
import logging
import os
import posixpath
import stat
from collections.abc import Iterator, Mapping
from typing import Any

from core.specs import CfgVal, Role

log = logging.getLogger(__name__)

__all__ = ["DirWorkspaceMixin", "WorkspaceMixin", "walk_workspace"]

#: directories never copied out of a workspace
IGNORED_DIRS = frozenset(
    {".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)


class WorkspaceMixin(abc.ABC):
    """A scheduler that can run a role with a workspace applied."""

    @abc.abstractmethod
    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Makes ``workspace`` available to ``role`` (updating ``role.image`` in place)."""


def walk_workspace(workspace: str) -> Iterator[tuple[Any, str, str]]:
    """Yields ``(fs, absolute_path, relative_path)`` for every file below ``workspace``.

    ``workspace`` is any fsspec URL or a local path. Directories in :data:`IGNORED_DIRS` are
    skipped.

    Raises:
        ValueError: if the workspace is not an existing directory.
    """
    import fsspec

    fs, root = fsspec.core.url_to_fs(workspace)
    if not fs.isdir(root):
        raise ValueError(f"workspace: expected an existing directory, got {workspace!r}")
    root = root.rstrip("/") or "/"
    for dirpath, dirnames, filenames in fs.walk(root):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_DIRS]
        for name in filenames:
            path = posixpath.join(dirpath, name)
            yield fs, path, posixpath.relpath(path, root)


class DirWorkspaceMixin(WorkspaceMixin):
    """Snapshots the workspace into a new directory, cfg ``job_dir``, where the job then runs.

    ``job_dir`` must not exist; it is created. Without ``job_dir`` the workspace is used in place
    (the role runs in the current directory).
    """

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        job_dir = cfg.get("job_dir")
        if not job_dir:
            return
        if not isinstance(job_dir, str):
            raise ValueError(f"cfg.job_dir: expected a directory path, got {job_dir!r}")
        job_dir = os.path.abspath(job_dir)
        if os.path.exists(job_dir):
            raise ValueError(f"cfg.job_dir: must not exist (it is created), but {job_dir} exists")
        files = list(walk_workspace(workspace))
        os.makedirs(job_dir)
        for fs, src, rel in files:
            dst = os.path.join(job_dir, *rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with fs.open(src, "rb") as fin, open(dst, "wb") as fout:
                while chunk := fin.read(1 << 20):
                    fout.write(chunk)
            if getattr(fs, "protocol", None) in ("file", ("file", "local")) or "file" in getattr(
                fs, "protocol", ()
            ):
                mode = os.stat(src).st_mode
                os.chmod(dst, stat.S_IMODE(mode))
        log.info("workspace %s snapshotted into %s (%d files)", workspace, job_dir, len(files))
        role.image = job_dir
