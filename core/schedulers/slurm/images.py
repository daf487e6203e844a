"""The images of roles in containers on Slurm (the run option ``container_runtime``): which
roles run in one, and what Slurm must know of each image; :mod:`.containers` runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.mounts import BindMount
from core.specs import AppDef, CfgVal

__all__ = ["RUNTIMES", "RUNTIME_OPT", "Image", "enroot_ref", "resolve", "runtime"]

RUNTIME_OPT = "container_runtime"
RUNTIMES = ("none", "oci", "pyxis")


@dataclass(frozen=True)
class Image:
    """A role's container image as Slurm will run it."""

    #: the role's ``image`` as given
    ref: str
    #: ``oci`` or ``pyxis``
    runtime: str = "oci"
    #: an OCI bundle on the cluster given as the image (an absolute path): used as is
    bundle: str | None = None
    #: the Docker engine's image id (``sha256:...``)
    image_id: str = ""
    #: the image's ``ENV``, ``WORKDIR`` and ``ENTRYPOINT``
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The exported image's name in the OCI directory (from its id)."""
        return self.image_id.removeprefix("sha256:")[:24]


def runtime(cfg: Mapping[str, CfgVal]) -> str:
    """The ``container_runtime`` of ``cfg``, checked."""
    value = cfg.get(RUNTIME_OPT) or "none"
    if value not in RUNTIMES:
        raise ValueError(f"cfg.{RUNTIME_OPT}: expected one of {', '.join(RUNTIMES)}, got {value!r}")
    return str(value)


def resolve(app: AppDef, cfg: Mapping[str, CfgVal]) -> dict[str, Image]:
    """The image of each role that runs in a container (by role name): none unless
    ``container_runtime`` is ``oci`` or ``pyxis``. Checks the roles' images and mounts,
    naming the field.

    Raises:
        ValueError: (``oci``) an image that is neither a bundle path nor in this host's Docker
            engine; a mount Slurm cannot give, or mounts without a container.
    """
    kind = runtime(cfg)
    images: dict[str, Image] = {}
    for i, role in enumerate(app.roles):
        for m in role.mounts:
            _check_mount(i, m, kind if role.image else "none")
        if kind == "oci" and role.image:
            images[role.name] = _image(i, role.image)
        elif kind == "pyxis" and role.image:
            images[role.name] = _pyxis_image(role.image)
    return images


def _check_mount(index: int, mount: object, kind: str) -> None:
    if kind == "none":
        raise ValueError(
            f"roles[{index}].mounts: on Slurm only a role in a container has mounts"
            f" (cfg.{RUNTIME_OPT}=oci or pyxis, and an image)"
        )
    if not isinstance(mount, BindMount):
        raise ValueError(
            f"roles[{index}].mounts: Slurm containers take bind mounts only, got"
            f" {type(mount).__name__}"
        )
    if kind == "pyxis" and any(c in mount.src_path + mount.dst_path for c in ",:"):
        raise ValueError(
            f"roles[{index}].mounts: Pyxis cannot mount a path with ',' or ':'"
            f" ({mount.src_path} -> {mount.dst_path})"
        )


def _pyxis_image(ref: str) -> Image:
    """Pyxis imports the image itself; this host's engine, if it has it, tells its ``ENV``,
    ``WORKDIR`` and ``ENTRYPOINT``."""
    try:
        known = _image(0, ref) if not ref.startswith("/") else None
    except ValueError:
        known = None
    if known is None:
        return Image(ref=ref, runtime="pyxis", workdir="")
    return dataclasses.replace(known, runtime="pyxis", image_id="")


def enroot_ref(ref: str) -> str:
    """A Docker image reference as enroot names it: ``reg:5000/repo:tag`` ->
    ``reg:5000#repo:tag`` (Docker Hub names, paths and enroot's own forms are kept)."""
    if ref.startswith(("/", ".")) or "://" in ref or "#" in ref:
        return ref
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def _image(index: int, ref: str) -> Image:
    if ref.startswith("/"):
        return Image(ref=ref, bundle=ref.rstrip("/") or "/")
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise ValueError(
            f"roles[{index}].image: {ref!r} is not a bundle path, and reading images of the"
            " Docker engine needs the docker SDK (pip install 'shipyard[docker]')"
        ) from None
    try:
        client = docker.from_env(timeout=30)
        try:
            attrs = client.images.get(ref).attrs
        finally:
            client.close()
    except DockerException as e:
        raise ValueError(
            f"roles[{index}].image: {ref!r} is neither an absolute path of an OCI bundle on the"
            f" cluster nor an image of this host's Docker engine ({e})"
        ) from None
    config = attrs.get("Config") or {}
    env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
    return Image(
        ref=ref,
        image_id=str(attrs["Id"]),
        env=env,
        workdir=config.get("WorkingDir") or "/",
        entrypoint=list(config.get("Entrypoint") or []),
    )
