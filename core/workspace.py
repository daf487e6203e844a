"""Workspaces: run an app with the files of a local (or fsspec) directory.

A scheduler that supports workspaces mixes in one of these classes; ``Scheduler.submit(app, cfg,
workspace=PATH)`` then calls :meth:`WorkspaceMixin.build_workspace_and_update_role` for the first
role (other roles sharing its image follow it).
"""

from __future__ import annotations

import abc
import io
import logging
import os
import posixpath
import stat
from collections.abc import Iterator, Mapping
from typing import Any

from core.specs import AppDef, CfgVal, Role

log = logging.getLogger(__name__)

__all__ = ["DirWorkspaceMixin", "WorkspaceMixin", "check_workspace", "walk_workspace"]

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


def check_workspace(workspace: str) -> tuple[Any, str]:
    """The filesystem and path of ``workspace`` (an fsspec URL or a local path).

    Raises:
        ValueError: if it is not an existing directory.
    """
    import fsspec

    fs, root = fsspec.core.url_to_fs(workspace)
    if not fs.isdir(root):
        raise ValueError(f"workspace: expected an existing directory, got {workspace!r}")
    return fs, root


def walk_workspace(workspace: str) -> Iterator[tuple[Any, str, str]]:
    """Yields ``(fs, absolute_path, relative_path)`` for every file below ``workspace``.

    ``workspace`` is any fsspec URL or a local path. Directories in :data:`IGNORED_DIRS` are
    skipped.

    Raises:
        ValueError: if the workspace is not an existing directory.
    """
    fs, root = check_workspace(workspace)
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

    def preflight_workspace(self, app: AppDef, workspace: str, cfg: Mapping[str, CfgVal]) -> AppDef:
        """Only checks ``workspace`` (for ``Scheduler.preflight``): its snapshot would make the
        ``job_dir`` that the submit then finds there and refuses."""
        check_workspace(workspace)
        return app


# --------------------------------------------------------------------------------------------
# docker: overlay the workspace on the role's image
# --------------------------------------------------------------------------------------------

__all__ += ["DockerWorkspaceMixin"]

#: a Dockerfile with this name at the workspace root is used instead of the generated one; it
#: gets the role's image as the build argument ``IMAGE`` (``ARG IMAGE`` / ``FROM $IMAGE``)
WORKSPACE_DOCKERFILE = "Dockerfile.shipyard"
_GENERATED_DOCKERFILE = ".shipyard.generated.Dockerfile"
_WORKSPACE_LABEL = "shipyard.workspace"


class DockerWorkspaceMixin(WorkspaceMixin):
    """Overlays the workspace onto the role's Docker image: ``FROM <image>``, ``COPY . .`` (into
    the image's working directory), built by the local Docker engine without pulling anything.

    With cfg ``image_repo`` the new image is pushed there (as ``{image_repo}:{short id}``) when
    the app is scheduled, and the role refers to the pushed name.
    """

    @property
    def _docker_client(self) -> Any:
        """The docker SDK client; schedulers provide their own."""
        client = getattr(self, "_workspace_docker_client", None)
        if client is None:
            import docker

            client = docker.from_env()
            self._workspace_docker_client = client
        return client

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        role.image = self.build_workspace_image(role.image, workspace, quiet=bool(cfg.get("quiet")))

    def build_workspace_image(self, img: str, workspace: str, quiet: bool = False) -> str:
        """Creates a new image with the files of ``workspace`` overlaid on top of ``img``.

        Args:
            img: a Docker image present on the engine, used as the base
            workspace: a fsspec path to a directory whose contents are overlaid
            quiet: log the build output at debug level instead of info

        Returns:
            The new image's ID (``sha256:...``).

        Raises:
            ValueError: if ``img`` is not on the engine or ``workspace`` is not a directory.
            RuntimeError: if the build fails (with the builder's message).
        """
        from docker.errors import APIError, ImageNotFound

        api = self._docker_client.api
        try:
            api.inspect_image(img)
        except ImageNotFound:
            raise ValueError(
                f"image: {img!r} is not present on the Docker engine; build or load it first"
                " (images are never pulled)"
            ) from None
        except APIError as e:
            raise ValueError(f"image: the Docker engine rejects {img!r}: {e.explanation}") from None
        context, dockerfile, files = _build_context(workspace)
        level = logging.DEBUG if quiet else logging.INFO
        log.log(level, "building workspace %s on top of %s (%d files)", workspace, img, files)
        image_id = _build(api, context, dockerfile, img, workspace, level)
        log.log(level, "workspace image %s built from %s + %s", image_id, img, workspace)
        return image_id

    def dryrun_push_images(self, app: Any, cfg: Mapping[str, CfgVal]) -> dict[str, tuple[str, str]]:
        """With cfg ``image_repo``: points every role running a locally built image (an image
        id) at ``{image_repo}:{short id}`` and returns ``{image_id: (repo, tag)}`` to push."""
        repo = cfg.get("image_repo")
        if not repo:
            return {}
        to_push: dict[str, tuple[str, str]] = {}
        for role in app.roles:
            if role.image.startswith("sha256:"):
                tag = role.image.removeprefix("sha256:")[:12]
                to_push[role.image] = (str(repo), tag)
                role.image = f"{repo}:{tag}"
        return to_push

    def push_images(self, images_to_push: Mapping[str, tuple[str, str]]) -> None:
        """Tags and pushes the images of :meth:`dryrun_push_images`.

        Raises:
            RuntimeError: naming the image if the registry refuses the push.
        """
        if not images_to_push:
            return
        api = self._docker_client.api
        for image_id, (repo, tag) in images_to_push.items():
            api.tag(image_id, repo, tag)
            log.info("pushing %s:%s", repo, tag)
            for msg in api.push(repo, tag=tag, stream=True, decode=True):
                if "error" in msg or "errorDetail" in msg:
                    raise RuntimeError(
                        f"cfg.image_repo: pushing {repo}:{tag} failed:"
                        f" {msg.get('error') or msg.get('errorDetail')}"
                    )


def _build_context(workspace: str) -> tuple[io.BytesIO, str, int]:
    """The build context of ``workspace``: a tar of its files, its Dockerfile (the workspace's
    own :data:`WORKSPACE_DOCKERFILE`, else a generated ``FROM $IMAGE`` + ``COPY . ./``) and a
    ``.dockerignore`` (the workspace's, plus the Dockerfile and itself, so neither lands in the
    image); returns ``(tar, dockerfile name, number of workspace files)``."""
    import tarfile  # (lazily: a start-up cost of every backend)

    buf = io.BytesIO()
    names: set[str] = set()
    dockerignore = b""
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for fs, path, rel in walk_workspace(workspace):
            with fs.open(path, "rb") as f:
                data = f.read()
            if rel == ".dockerignore":
                dockerignore = data
                continue
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o644
            if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
                info.mode = stat.S_IMODE(os.stat(path).st_mode)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
            names.add(rel)
        if WORKSPACE_DOCKERFILE in names:
            dockerfile = WORKSPACE_DOCKERFILE
        else:
            dockerfile = _GENERATED_DOCKERFILE
            content = b"ARG IMAGE\nFROM $IMAGE\nCOPY . ./\n"
            info = tarfile.TarInfo(dockerfile)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        ignore = dockerignore.rstrip(b"\n") + f"\n{dockerfile}\n.dockerignore\n".encode()
        info = tarfile.TarInfo(".dockerignore")
        info.size = len(ignore)
        tar.addfile(info, io.BytesIO(ignore))
    buf.seek(0)
    return buf, dockerfile, len(names)


def _build(
    api: Any, context: io.BytesIO, dockerfile: str, img: str, workspace: str, level: int
) -> str:
    """Builds ``context`` (of ``workspace``) on the engine, ``img`` as the build argument
    ``IMAGE``, never pulling; returns the new image's id, logging the builder's output at
    ``level``.

    Raises:
        RuntimeError: the build failed (with the builder's errors).
    """
    image_id: str | None = None
    errors: list[str] = []
    for msg in api.build(
        fileobj=context,
        custom_context=True,
        dockerfile=dockerfile,
        buildargs={"IMAGE": img},
        pull=False,
        rm=True,
        forcerm=True,
        decode=True,
        labels={_WORKSPACE_LABEL: "1"},
    ):
        if "error" in msg or "errorDetail" in msg:
            errors.append(str(msg.get("error") or msg.get("errorDetail")))
        elif "aux" in msg and isinstance(msg["aux"], dict) and "ID" in msg["aux"]:
            image_id = msg["aux"]["ID"]
        elif msg.get("stream", "").strip():
            log.log(level, "build: %s", msg["stream"].rstrip())
    if errors or not image_id:
        raise RuntimeError(
            f"workspace: building {workspace} on top of {img} failed: "
            + ("; ".join(errors) or "the engine returned no image id")
        )
    return image_id
