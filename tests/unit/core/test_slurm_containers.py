"""container_runtime=oci on Slurm without a cluster: the batch script's container lines, and
the checks of images and mounts (the real runs are in tests/integration/slurm/
test_containers_slurm.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from core.mounts import BindMount
from core.schedulers.slurm.containers import containerize
from core.schedulers.slurm.images import Image, enroot_ref, resolve
from core.schedulers.slurm_scheduler import SlurmScheduler
from core.specs import AppDef, Role


def test_a_docker_image_becomes_a_bundle_of_each_replica() -> None:
    role = Role(
        "w",
        image="img",
        entrypoint="python",
        args=["-m", "x"],
        env={"A": "role"},
        num_replicas=2,
        mounts=[BindMount("/data", "/in", read_only=True)],
    )
    app = AppDef("a", [role])
    # (the dry run without the runtime: no Docker engine is asked; containerize does the rest)
    plain = AppDef("a", [dataclasses.replace(role, mounts=[])])
    req = SlurmScheduler("s").submit_dryrun(plain, {}).request
    image = Image(
        "img", image_id="sha256:" + "ab" * 32, env={"A": "image", "B": "image"},
        workdir="/app", entrypoint=["/entry", "--flag"],
    )  # fmt: skip
    containerize(req, app, {"w": image}, "/home/u/shipyard")
    script = req.materialize()
    assert req.oci_dir == "/home/u/shipyard/.shipyard-oci" and req.images == [image]
    for i in (0, 1):
        rep = req.replicas[f"w-{i}"]
        assert rep.container_opts == [f'--container="$PWD/shipyard-oci-$SLURM_JOB_ID/w-{i}"']
        assert rep.env["A"] == "role" and rep.env["B"] == "image"  # (the role's wins)
        assert [rep.entrypoint, *rep.args] == ["/entry", "--flag", "python", "-m", "x"]
    assert script.count("shipyard_rootfs /home/u/shipyard/.shipyard-oci/" + "ab" * 12) == 2
    assert "oci.conf" in script and "shipyard_rootfs() {" in script
    config = json.loads(
        script.split("c='", 1)[1].split("'", 1)[0].replace("@UID@", "7").replace("@GID@", "8")
    )
    assert config["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 7, "size": 1}]
    assert {
        "destination": "/in",
        "type": "none",
        "source": "/data",
        "options": ["rbind", "ro"],
    } in config["mounts"]
    assert config["process"]["cwd"] == "/app" and config["root"]["readonly"] is True


def test_a_bundle_path_is_passed_as_is() -> None:
    app = AppDef("a", [Role("w", image="/opt/bundles/x", entrypoint="true")])
    images = resolve(app, {"container_runtime": "oci"})
    assert images == {"w": Image("/opt/bundles/x", bundle="/opt/bundles/x")}
    req = SlurmScheduler("s").submit_dryrun(app, {"container_runtime": "oci"}).request
    assert req.replicas["w-0"].container_opts == ["--container=/opt/bundles/x"]
    assert "shipyard_rootfs" not in req.materialize()


def test_without_the_runtime_an_image_is_not_a_container() -> None:
    app = AppDef("a", [Role("w", image="/opt/bundles/x", entrypoint="true")])
    req = SlurmScheduler("s").submit_dryrun(app, {}).request
    assert req.replicas["w-0"].container_opts == [] and "--container" not in req.materialize()


@pytest.mark.parametrize(
    ("role", "cfg", "error"),
    [
        (Role("w", entrypoint="t", mounts=[BindMount("/a", "/b")]), {}, r"roles\[0\]\.mounts: on Slurm only"),
        (Role("w", entrypoint="t"), {"container_runtime": "podman"}, r"cfg\.container_runtime: expected one of none, oci, pyxis, got 'podman'"),
        (Role("w", image="x", entrypoint="t", mounts=[BindMount("/a:b", "/b")]), {"container_runtime": "pyxis"}, r"roles\[0\]\.mounts: Pyxis cannot mount a path with"),
    ],
)  # fmt: skip
def test_mounts_and_runtimes_are_checked(role: Role, cfg: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SlurmScheduler("s").submit_dryrun(AppDef("a", [role]), cfg)


def test_pyxis_takes_the_image_and_mounts_as_srun_options() -> None:
    role = Role("w", image="127.0.0.1:5000/team/img:1", entrypoint="true",
                mounts=[BindMount("/data", "/in", read_only=True)])  # fmt: skip
    req = (
        SlurmScheduler("s")
        .submit_dryrun(AppDef("a", [role]), {"container_runtime": "pyxis"})
        .request
    )
    assert req.replicas["w-0"].container_opts == [
        "--container-image='127.0.0.1:5000#team/img:1'",
        '--container-mounts="$PWD:$PWD",/data:/in:ro',
    ]
    script = req.materialize()
    assert "srun --help 2>&1 | grep -q -- --container-image" in script
    assert "shipyard_rootfs" not in script and req.images[0].runtime == "pyxis"


@pytest.mark.parametrize(
    ("ref", "enroot"),
    [("ubuntu:24.04", "ubuntu:24.04"), ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
     ("localhost/x", "localhost#x"), ("/scratch/img.sqsh", "/scratch/img.sqsh"),
     ("nvcr.io#nvidia/x", "nvcr.io#nvidia/x"), ("dockerd://img", "dockerd://img"), ("team/img", "team/img")],
)  # fmt: skip
def test_image_references_as_enroot_names_them(ref: str, enroot: str) -> None:
    assert enroot_ref(ref) == enroot
