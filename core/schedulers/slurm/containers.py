"""Roles in containers on Slurm: the run option ``container_runtime``.

``oci``: each replica of a role with an ``image`` runs inside it through Slurm's own OCI support
(``srun --container=BUNDLE``; the cluster's ``oci.conf`` runs runc or crun, rootless). The
``image`` is either an absolute path (an OCI bundle on the cluster, used as is) or an image of
this host's Docker engine. A Docker image's file system is exported once per image and cluster
into ``<oci dir>/<image id>.tar`` (:func:`stage`); the first job that needs it unpacks it into a
root file system that the jobs of that image share read-only, and each replica gets a bundle of
its own in the job's directory (:func:`bundle_lines`): the image's environment, working
directory and entrypoint, the role's bind mounts, the job's directory at its own path (results,
checkpoints, logs) and a private ``/tmp``.

``pyxis``: each such replica runs in it through Pyxis and enroot (``srun --container-image``,
``--container-mounts``, ``--container-workdir``), which import the image themselves (from a
registry: ``registry:port/repo:tag`` is given to enroot as ``registry:port#repo:tag``; a
squashfs file path is used as is); the image's ``ENV``, ``WORKDIR`` and ``ENTRYPOINT`` are
applied as on Docker where this host's engine has the image.

``none`` (the default): the role's ``image`` is not a container (as before).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from core.mounts import BindMount
from core.schedulers.slurm.images import Image, enroot_ref
from core.schedulers.slurm.script import SlurmBatchRequest
from core.schedulers.slurm.transport import Files
from core.specs import AppDef

log = logging.getLogger(__name__)

__all__ = ["bundle_lines", "containerize", "stage"]

OCI_DIR = ".shipyard-oci"
_TEMPLATE_MOUNTS: list[dict[str, Any]] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
     "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
     "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
     "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "none", "source": "/sys",
     "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "nodev", "mode=1777"]},
]  # fmt: skip


def stage(files: Files, images: Iterable[Image], oci_dir: str) -> None:
    """Puts each Docker image's file system on the cluster (``<oci_dir>/<key>.tar``), unless
    an earlier job put it there; a ``.done`` file marks a complete copy."""
    for image in {i.key: i for i in images if i.bundle is None and i.runtime == "oci"}.values():
        done = posixpath.join(oci_dir, f"{image.key}.done")
        if files.exists(done):
            continue
        files.mkdir(oci_dir, mode=0o755, parents=True)
        import tempfile  # (lazily: start-up)

        with tempfile.TemporaryDirectory(prefix="shipyard-oci-") as tmp:
            local = os.path.join(tmp, "rootfs.tar")
            _export(image, local)
            log.info("copying image %s (%d MB) to the cluster", image.ref, _mb(local))
            files.put(local, posixpath.join(oci_dir, f"{image.key}.tar"), mode=0o644)
        files.write(done, image.ref.encode(), mode=0o644)


def _export(image: Image, path: str) -> None:
    """The image's file system as a tar file at ``path`` (``docker export`` of a container
    that is created, never started)."""
    import docker

    client = docker.from_env(timeout=300)
    try:
        container = client.containers.create(image.image_id, command=["/shipyard-export"])
        try:
            with open(path, "wb") as f:
                for chunk in container.export():
                    f.write(chunk)
        finally:
            container.remove(force=True)
    finally:
        client.close()


def _mb(path: str) -> int:
    return os.path.getsize(path) // 2**20


def containerize(
    req: SlurmBatchRequest, app: AppDef, images: Mapping[str, Image], base: str | None
) -> None:
    """Runs each replica of the roles in ``images`` in its image: the image's environment
    under the role's, and its entrypoint before the role's command (as the Docker engine runs
    it). ``base``: the cluster's default directory, where ``oci`` images go (None: this
    host's home)."""
    if not images:
        return
    kind = next(iter(images.values())).runtime
    oci_dir = posixpath.join(base or os.path.expanduser("~/.cache/shipyard"), OCI_DIR)
    req.images, req.oci_dir = list(images.values()), oci_dir
    req.container_setup += [f"# the replicas' containers (container_runtime={kind})", _CHECKS[kind]]
    if any(i.bundle is None and i.runtime == "oci" for i in images.values()):
        req.container_setup += ROOTFS_FUNCTION
    for role in app.roles:
        image = images.get(role.name)
        for replica_id in range(role.num_replicas if image else 0):
            assert image is not None
            rep = req.replicas[f"{role.name}-{replica_id}"]
            mounts = [m for m in role.mounts if isinstance(m, BindMount)]
            if kind == "pyxis":
                rep.container_opts = _pyxis_opts(image, mounts)
            else:
                req.container_setup += bundle_lines(rep.name, image, mounts, oci_dir)
                bundle = shlex.quote(image.bundle) if image.bundle else bundle_dir(rep.name)
                rep.container_opts = [f"--container={bundle}"]
            rep.env = {**image.env, **rep.env}
            if image.entrypoint:
                rep.args = [*image.entrypoint[1:], rep.entrypoint, *rep.args]
                rep.entrypoint = image.entrypoint[0]


#: what the job checks first: the cluster can run the containers (else Slurm would run the
#: command outside any container, or srun would fail on an option it does not know)
_CHECKS = {
    "oci": '[ -f "$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")/oci.conf" ] || { echo'
    " 'shipyard: the cluster has no oci.conf (Slurm OCI support): no container' >&2; exit 1; }",
    "pyxis": "srun --help 2>&1 | grep -q -- --container-image || { echo 'shipyard: the"
    " cluster has no Pyxis (srun --container-image)' >&2; exit 1; }",
}


def _pyxis_opts(image: Image, mounts: list[BindMount]) -> list[str]:
    """``srun``'s Pyxis options (shell words): the image, the job's directory and the role's
    bind mounts, the image's working directory."""
    binds = "".join(f",{m.src_path}:{m.dst_path}{':ro' if m.read_only else ''}" for m in mounts)
    opts = [
        f"--container-image={shlex.quote(enroot_ref(image.ref))}",
        f'--container-mounts="$PWD:$PWD"{shlex.quote(binds) if binds else ""}',
    ]
    if image.workdir:
        opts.append(f"--container-workdir={shlex.quote(image.workdir)}")
    return opts


def bundle_dir(replica: str) -> str:
    """The replica's bundle in the job's directory (a shell word: the job's own id)."""
    return f'"$PWD/shipyard-oci-$SLURM_JOB_ID/{replica}"'


def bundle_lines(replica: str, image: Image, mounts: list[BindMount], oci_dir: str) -> list[str]:
    """Batch script lines that make the replica's bundle (and, once per image and cluster, the
    image's shared root file system); none for a bundle given as the image."""
    if image.bundle is not None:
        return []
    lines: list[str] = []
    tar = shlex.quote(posixpath.join(oci_dir, f"{image.key}.tar"))
    root = shlex.quote(posixpath.join(oci_dir, image.key))
    lines.append(f"shipyard_rootfs {tar} {root}")
    config = json.dumps(_config(image, mounts, posixpath.join(oci_dir, image.key, "rootfs")))
    config = config.replace('"@UID@"', "@UID@").replace('"@GID@"', "@GID@")  # (numbers)
    target = bundle_dir(replica)
    lines += [
        f"mkdir -p {target}",
        f"c={shlex.quote(config)}; c=${{c//@UID@/$(id -u)}}; c=${{c//@GID@/$(id -g)}}",
        f'printf "%s\\n" "${{c//@PWD@/$PWD}}" > {target}/config.json',
    ]
    return lines


#: the shell function that unpacks an image once per cluster (under a lock, into a new
#: directory renamed into place: a job that died half-way leaves nothing half-made)
ROOTFS_FUNCTION = [
    "shipyard_rootfs() {",
    '    [ -d "$2/rootfs" ] && return',
    '    ( flock 9; [ -d "$2/rootfs" ] && exit 0',
    '      rm -rf "$2.new" && mkdir -p "$2.new/rootfs" &&',
    "      tar --exclude='./dev/*' --exclude='dev/*' -xf \"$1\" -C \"$2.new/rootfs\" &&",
    '      mv "$2.new" "$2" ) 9>"$2.lock" || { echo "shipyard: cannot unpack $1" >&2; exit 1; }',
    "}",
]


def _config(image: Image, mounts: list[BindMount], rootfs: str) -> dict[str, Any]:
    """The bundle's ``config.json`` (rootless: the user is root in the container;
    ``@UID@``, ``@GID@`` and ``@PWD@`` are filled in by the job)."""
    binds = [
        {"destination": "@PWD@", "type": "none", "source": "@PWD@", "options": ["rbind", "rw"]},
        *(
            {
                "destination": m.dst_path,
                "type": "none",
                "source": m.src_path,
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in mounts
        ),
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh"],
            "env": [f"{k}={v}" for k, v in image.env.items()],
            "cwd": image.workdir,
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": True},
        "mounts": [*_TEMPLATE_MOUNTS, *binds],
        "linux": {
            "uidMappings": [{"containerID": 0, "hostID": "@UID@", "size": 1}],
            "gidMappings": [{"containerID": 0, "hostID": "@GID@", "size": 1}],
            "namespaces": [{"type": t} for t in ("pid", "ipc", "mount", "user")],
        },
    }
