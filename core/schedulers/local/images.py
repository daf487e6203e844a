"""What the local scheduler is asked to start: the request of one app (:class:`PopenRequest`,
one :class:`ReplicaParam` per replica) and the image providers that turn a role's image into a
directory on this host (``local_cwd``: the current one; ``local_dir``: the image itself)."""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field

from core.limits import Limits
from core.schedulers.local.options import LocalOpts
from core.specs import Role

__all__ = [
    "CWDImageProvider",
    "ImageProvider",
    "LocalDirectoryImageProvider",
    "PopenRequest",
    "ReplicaParam",
]


@dataclass
class ReplicaParam:
    """What ``LocalScheduler`` starts for one replica (the command, run by a small wrapper).

    ``env`` holds only what the replica adds to the submitting process's environment.
    ``stdout``/``stderr``/``combined`` are the replica's log files.
    """

    args: list[str]
    env: dict[str, str]
    stdout: str | None = None
    stderr: str | None = None
    combined: str | None = None
    cwd: str | None = None


@dataclass
class PopenRequest:
    """Parameters to start every replica of every role of an app.

    ``log_dir`` is the app's log directory, ``role_log_dirs[role][k]`` the directory of replica
    k's log files (``<role>.<k>.stdout.log``, ``.stderr.log``, ``.combined.log``).
    """

    app_id: str
    log_dir: str
    role_params: dict[str, list[ReplicaParam]]
    role_log_dirs: dict[str, list[str]]
    app_name: str = ""
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    backend: str = "local_cwd"
    session_name: str = ""
    #: whose results are collected: ``first`` (replica 0 of each role) or ``all``
    result_replicas: str = "first"
    #: the app's time limit and checkpoint signal (see :mod:`core.limits`)
    limits: Limits = field(default_factory=Limits)
    #: times each replica's limit script starts it again at the limit (None: no script)
    requeues: int | None = None

    def __str__(self) -> str:
        import shlex  # (only for showing a dry run: not on every import of the scheduler)

        lines = [f"app_id: {self.app_id}", f"log_dir: {self.log_dir}"]
        for role, params in self.role_params.items():
            for k, p in enumerate(params):
                lines.append(f"{role}/{k}: cwd={p.cwd}")
                lines.append(f"  args: {' '.join(shlex.quote(a) for a in p.args)}")
                lines.extend(f"  env: {key}={val}" for key, val in sorted(p.env.items()))
                lines += [
                    f"  stdout: {p.stdout}",
                    f"  stderr: {p.stderr}",
                    f"  combined: {p.combined}",
                ]
        return "\n".join(lines)


class ImageProvider(abc.ABC):
    """Sets up a role's image on this host (only the local scheduler needs this)."""

    @abc.abstractmethod
    def fetch(self, image: str) -> str:
        """Fetches ``image``; returns the path of its root on this host ('' if no-op)."""

    def fetch_role(self, role: Role) -> str:
        """Like :meth:`fetch` for the role's image; may update the role. Default: ``fetch``."""
        return self.fetch(role.image)

    def get_cwd(self, image: str) -> str | None:
        """The working directory of the replicas (None: the submitting process's cwd)."""
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """Where the role's entrypoint is."""
        return role.entrypoint

    def get_replica_param(
        self,
        img_root: str,
        role: Role,
        stdout: str | None = None,
        stderr: str | None = None,
        combined: str | None = None,
    ) -> ReplicaParam:
        """The :class:`ReplicaParam` of one replica of ``role`` (macros already applied).

        ``img_root`` is what :meth:`fetch` returned for the role's image.
        """
        return ReplicaParam(
            args=[self.get_entrypoint(img_root, role), *role.args],
            env=dict(role.env),
            stdout=stdout,
            stderr=stderr,
            combined=combined,
            cwd=self.get_cwd(img_root),
        )


class CWDImageProvider(ImageProvider):
    """Ignores the image and uses the current working directory as the image root.

    ``fetch("/tmp/foobar")`` and ``fetch("foobar:latest")`` both return ``os.getcwd()``.
    """

    def __init__(self, cfg: LocalOpts) -> None:
        self._cfg = cfg

    def fetch(self, image: str) -> str:
        return os.getcwd()

    def get_cwd(self, image: str) -> str | None:
        return self.fetch(image)


class LocalDirectoryImageProvider(ImageProvider):
    """Interprets the image as the path of a directory on this host; fetches nothing.

    The image must be an absolute path of an existing directory; the replicas run in it. A
    relative entrypoint is resolved against the image directory (a bare command name that is
    not there is looked up on ``PATH``); an absolute entrypoint runs as given.
    """

    def __init__(self, cfg: LocalOpts) -> None:
        self._cfg = cfg

    def fetch(self, image: str) -> str:
        """Returns ``image``.

        Raises:
            ValueError: if ``image`` is not an absolute path of an existing directory.
        """
        if not isinstance(image, str) or not os.path.isabs(image):
            raise ValueError(
                f"image: local_dir expects the absolute path of a directory, got {image!r}"
            )
        if not os.path.isdir(image):
            raise ValueError(f"image: {image!r} does not exist or is not a directory")
        return image

    def get_cwd(self, image: str) -> str | None:
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        entrypoint = role.entrypoint
        if os.path.isabs(entrypoint):
            return entrypoint
        candidate = os.path.join(img_root, entrypoint)
        if os.sep in entrypoint or os.path.exists(candidate):
            return candidate
        return entrypoint
