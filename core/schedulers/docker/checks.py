"""Pre-flight checks of a Docker app (``DockerScheduler.preflight``): what a submit would hit,
found without starting anything; every problem is reported, each naming its field.

- Every role's image on the engine or, as the ``pull`` policy says, to be had from its registry
  (asked with the client's credentials; nothing is pulled).
- Bind sources and devices there.
- ``/bin/sh`` in every role's image when the app has a ``time_limit`` (its script runs there:
  see :mod:`.timelimit`).
- Every role's entrypoint in its image (where the image has no ``ENTRYPOINT`` of its own, which
  would take the role's command as arguments): looked up in a container created from the image
  and never started (``get_archive`` reads a created container's filesystem), then removed;
  a name is searched on the role's or the image's ``PATH``, a relative path from the image's
  working directory.

:func:`image_python` runs a function job's interpreter in its image once, before the job is
submitted (see :mod:`core.functions`), in a container that is removed whatever happens.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

from core.reports import Problem
from core.schedulers.docker import images, request
from core.specs import AppDef, Role

log = logging.getLogger(__name__)

__all__ = ["image_python", "preflight"]

#: the PATH of a container whose image sets none (what the engine gives it)
_ENGINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MODE_DIR = 1 << 31  # Go's fs.ModeDir, in get_archive's stat of a path
_MODE_SYMLINK = 1 << 27  # fs.ModeSymlink
SHELL = "/bin/sh"
#: the label of an interpreter probe's container (removed at once; a leftover is findable)
LABEL_PROBE = "shipyard.probe"


def preflight(
    api: Any, app: AppDef, pull: str = request.DEFAULT_PULL, shell: bool = False
) -> list[Problem]:
    """The problems of ``app`` on the engine of ``api`` (see the module docs); ``shell``: the
    replicas run under a time limit's ``/bin/sh`` script, which their images must have."""
    problems = []
    usable: dict[str, bool] = {}
    # roles sharing an image and an entrypoint (and PATH) share one lookup container
    looked_up: dict[tuple[str, str, str | None], str | None] = {}
    shells: dict[str, str | None] = {}
    for i, role in enumerate(app.roles):
        where = f"roles[{i}]"
        if role.image and role.image not in usable:
            problem = images.preflight(api, role.image, pull, f"{where}.image")
            usable[role.image] = problem is None or problem.severity == "info"
            if problem is not None:
                problems.append(problem)
        for j, mount in enumerate(role.mounts):
            try:
                request.check_mount(mount, f"{where}.mounts[{j}]")
            except ValueError as e:
                field, _, msg = str(e).partition(": ")
                problems.append(Problem(field, msg))
        if shell and role.image and usable[role.image]:
            if role.image not in shells:
                shells[role.image] = _shell_problem(api, role.image)
            if shells[role.image]:
                problems.append(Problem(f"{where}.image", str(shells[role.image])))
        if role.image and usable[role.image] and role.entrypoint:
            key = (role.image, role.entrypoint, role.env.get("PATH"))
            if key not in looked_up:
                looked_up[key] = _entrypoint_problem(api, role)
            missing = looked_up[key]
            if missing:
                problems.append(Problem(f"{where}.entrypoint", missing))
    return problems


def _entrypoint_problem(api: Any, role: Role) -> str | None:
    """Why ``role.entrypoint`` would not run in its image (None: it is there, or the image's
    own ENTRYPOINT runs, or the image is not on the engine yet)."""
    from docker.errors import ImageNotFound

    try:
        config = api.inspect_image(role.image).get("Config") or {}
    except ImageNotFound:  # (to be pulled at submit)
        return None
    if config.get("Entrypoint"):
        return None
    image_env = {k: v for k, _, v in (e.partition("=") for e in config.get("Env") or [])}
    workdir = config.get("WorkingDir") or "/"
    entry = role.entrypoint
    if "/" in entry:
        candidates = [posixpath.join(workdir, entry)]
    else:
        path = role.env.get("PATH", image_env.get("PATH", _ENGINE_PATH))
        candidates = [posixpath.join(d or workdir, entry) for d in path.split(":")]
    cid = api.create_container(role.image, command=[entry], network_disabled=True)["Id"]
    try:
        found = set()
        for candidate in candidates:
            found.add(_kind(api, cid, candidate))
            if "executable" in found:
                return None
    finally:
        api.remove_container(cid, v=True, force=True)  # (and the volumes the image declares)
    if "/" not in entry:
        return f"{entry!r} was not found on PATH in image {role.image!r}"
    if "file" in found:
        return f"{entry!r} is not executable in image {role.image!r}"
    if "directory" in found:
        return f"{entry!r} is a directory in image {role.image!r}"
    return f"{entry!r} does not exist in image {role.image!r}"


def _shell_problem(api: Any, image: str) -> str | None:
    """Why a time limit cannot be kept in ``image`` (None: it has ``/bin/sh``, or is not on
    the engine yet)."""
    from docker.errors import ImageNotFound

    try:
        cid = api.create_container(image, command=[SHELL], network_disabled=True)["Id"]
    except ImageNotFound:
        return None
    try:
        if _kind(api, cid, SHELL) == "executable":
            return None
    finally:
        api.remove_container(cid, v=True, force=True)
    return (
        f"image {image!r} has no {SHELL}, which keeps a time_limit on {request.BACKEND}"
        " (drop time_limit, or use an image with a shell)"
    )


def _kind(api: Any, cid: str, path: str) -> str | None:
    """``executable``, ``file``, ``directory`` or None (absent) for ``path`` in container
    ``cid`` (a symlink counts as executable: its target is not followed)."""
    from docker.errors import NotFound

    try:
        stream, stat = api.get_archive(cid, path)
    except NotFound:
        return None
    for _ in stream:  # (read to the end: the connection goes back to the pool)
        pass
    mode = int((stat or {}).get("mode") or 0)
    if mode & _MODE_DIR:
        return "directory"
    return "executable" if mode & _MODE_SYMLINK or mode & 0o111 else "file"


def image_python(
    api: Any, image: str, python: str, code: str, pull: bool = True
) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``python -c code`` in a container of ``image`` (no
    network; the image's ENTRYPOINT replaced); the container is removed whatever happens. The
    image is pulled first if it is absent and ``pull`` (cfg ``pull`` ``never``: False; with
    ``always``, the submit that follows pulls it again).

    Raises:
        ValueError: naming ``image`` (absent and not to be pulled, the pull failed, the engine
            rejects it) or ``cfg.python`` (it cannot start).
    """
    from docker.errors import APIError

    images.ensure_image(api, image, "missing" if pull else "never")
    try:
        cid = api.create_container(
            image, [python, "-c", code], entrypoint=[], network_disabled=True,
            labels={LABEL_PROBE: "python"},
        )["Id"]  # fmt: skip
    except APIError as e:
        raise ValueError(f"image: the Docker engine rejects {image!r}: {e.explanation}") from None
    try:
        api.start(cid)
        status = int(api.wait(cid).get("StatusCode", -1))
        out = api.logs(cid, stdout=True, stderr=False)
        err = api.logs(cid, stdout=False, stderr=True)
    except APIError as e:  # (e.g. the interpreter is not in the image)
        raise ValueError(f"cfg.python: cannot run {python} in {image}: {e.explanation}") from None
    finally:
        try:
            api.remove_container(cid, v=True, force=True)
        except APIError as e:
            log.warning("could not remove the probe container %s: %s", cid[:12], e)
    return status, out.decode(errors="replace"), err.decode(errors="replace")
