"""Roles in containers on the real Slurm 26.05 cluster, through every transport:
``container_runtime=oci`` (Slurm's own ``srun --container`` over runc; ``scripts/
start_slurm26.sh`` writes its ``oci.conf``; the image built by this host's Docker engine and
copied to the cluster by Shipyard) and ``container_runtime=pyxis`` (Pyxis and enroot, built by
``scripts/build_enroot_pyxis.sh``, import the image from the loopback registry); and the Slurm
22.05 cluster, which has neither, as the cluster that lacks the runtime."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.mounts import BindMount, VolumeMount
from core.runner import Runner
from core.specs import AppDef, AppState, Role, make_app_handle
from tests.integration.slurm.slurm_clusters import Cluster, make_cluster
from tests.services import docker_problem, require

PROBE = "shipyard-test/oci-probe:latest"
#: the same image in the loopback registry of scripts/start_docker.sh (for Pyxis)
REGISTRY_PROBE = f"127.0.0.1:5000/{PROBE}"
_DOCKERFILE = """FROM shipyard-test/busybox:latest
RUN echo 'ID=shipyard-oci-probe' > /etc/os-release && mkdir -p /work
ENV GREETING=from-image
WORKDIR /work
"""


@pytest.fixture(scope="module")
def probe_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image of this host's engine whose os-release, environment and working directory are
    its own (built locally, from the test busybox image)."""
    require("docker", docker_problem())
    ctx = tmp_path_factory.mktemp("oci-probe")
    (ctx / "Dockerfile").write_text(_DOCKERFILE)
    subprocess.run(
        ["docker", "build", "-q", "-t", PROBE, str(ctx)], check=True, capture_output=True
    )
    subprocess.run(["docker", "tag", PROBE, REGISTRY_PROBE], check=True)
    subprocess.run(["docker", "push", "-q", REGISTRY_PROBE], check=True, capture_output=True)
    return PROBE


@pytest.fixture(params=["local-26", "ssh-26", "rest-26"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


@pytest.fixture
def local26(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The 26.05 cluster through this host's commands (jobs run as root)."""
    yield from make_cluster("local-26", tmp_path, monkeypatch)


@pytest.fixture
def local22(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The 22.05 cluster (no oci.conf) through this host's commands."""
    yield from make_cluster("local", tmp_path, monkeypatch)


def _probe_app(image: str, data: Path) -> AppDef:
    script = (
        "cat /etc/os-release; echo $GREETING $MINE $PWD; cat /data/in;"
        ' echo written > /data/out; echo \'{"inside": true}\' > "$SHIPYARD_RESULT_FILE";'
        " touch /etc/x 2>/dev/null && echo writable-root || echo read-only-root"
    )
    role = Role(
        "probe",
        image=image,
        entrypoint="sh",
        args=["-c", script],
        env={"MINE": "role-env"},
        mounts=[BindMount(str(data), "/data")],
    )
    return AppDef("oci", [role])


@pytest.mark.parametrize("runtime", ["oci", "pyxis"])
def test_a_role_runs_in_its_image_with_its_mount_and_env(
    cluster: Cluster, probe_image: str, runtime: str
) -> None:
    data = cluster.scratch / "data"
    data.mkdir()
    (data / "in").write_text("from the host\n")
    if cluster.remote:
        subprocess.run(["chown", "-R", "hpcuser:hpcuser", str(data)], check=True)
    image = probe_image if runtime == "oci" else REGISTRY_PROBE
    app_id = cluster.submit(_probe_app(image, data), {"container_runtime": runtime})
    done = cluster.wait_done(app_id)
    assert done.state == AppState.SUCCEEDED, done
    lines = list(cluster.sched.log_iter(app_id, "probe", 0))
    # the image's os-release (the host's is Debian's), its ENV and WORKDIR, the role's env
    assert lines[:3] == [
        "ID=shipyard-oci-probe\n",
        "from-image role-env /work\n",
        "from the host\n",
    ]
    assert lines[3:] == ["read-only-root\n"]
    assert (data / "out").read_text() == "written\n"  # (the bind mount is writable)
    # the result file is in the job's directory, mounted at its own path
    runner = Runner("test", {"slurm": lambda session, **kw: cluster.sched})
    result = runner.result(make_app_handle("slurm", "test", app_id))
    assert result.values() == {"probe": {0: {"inside": True}}}


def test_a_bundle_path_is_used_as_is(local26: Cluster, tmp_path: Path) -> None:
    require("docker", docker_problem())
    cluster = local26
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    cid = subprocess.run(
        ["docker", "create", "shipyard-test/busybox:latest", "/bin/true"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(bundle / "rootfs")], stdin=export.stdout, check=True)
        assert export.wait() == 0
    finally:
        subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True)
    subprocess.run(["runc", "spec", "--rootless"], cwd=bundle, check=True)
    script = "ls /; cat /etc/os-release || echo none"
    role = Role("w", image=str(bundle), entrypoint="/bin/sh", args=["-c", script])
    app_id = cluster.submit(AppDef("bundle", [role]), {"container_runtime": "oci"})
    done = cluster.wait_done(app_id)
    assert done.state == AppState.SUCCEEDED, done
    lines = list(cluster.sched.log_iter(app_id, "w", 0))
    assert "none\n" in lines and "usr\n" in lines  # (busybox's file system: no os-release)


@pytest.mark.parametrize(
    ("runtime", "missing"),
    [("oci", "the cluster has no oci.conf"), ("pyxis", "the cluster has no Pyxis")],
)
def test_a_cluster_without_the_runtime_is_named_before_and_stops_the_job(
    local22: Cluster, probe_image: str, runtime: str, missing: str
) -> None:
    """Slurm 22.05 here has neither oci.conf (Slurm would run the command outside any
    container) nor Pyxis (its srun would refuse the option)."""
    cluster = local22
    app = AppDef("no-rt", [Role("w", image=probe_image, entrypoint="sh", args=["-c", "true"])])
    dryrun = cluster.sched.submit_dryrun(app, {"container_runtime": runtime})
    problems = [p for p in cluster.sched.preflight(dryrun) if p.field == "cfg.container_runtime"]
    assert problems and problems[0].severity == "error", problems
    assert ("oci.conf" if runtime == "oci" else "--container-image") in problems[0].message
    app_id = cluster.submit(app, {"container_runtime": runtime})
    done = cluster.wait_done(app_id)
    assert done.state == AppState.FAILED
    batch = Path(f"slurm-{cluster.job_id(app_id)}.out").read_text()
    assert f"shipyard: {missing}" in batch


def test_bad_images_and_mounts_are_refused_before_anything_is_queued(local26: Cluster) -> None:
    cluster = local26
    missing = f"shipyard-test/no-such-image:{uuid.uuid4().hex[:8]}"
    role = Role("w", image=missing, entrypoint="true")
    with pytest.raises(ValueError, match=r"roles\[0\]\.image: .*neither an absolute path"):
        cluster.submit(AppDef("x", [role]), {"container_runtime": "oci"})
    vol = Role("w", image=PROBE, entrypoint="true", mounts=[VolumeMount("v", "/v")])
    with pytest.raises(ValueError, match=r"roles\[0\]\.mounts: Slurm containers take bind mounts"):
        cluster.submit(AppDef("x", [vol]), {"container_runtime": "oci"})
    bind = Role("w", entrypoint="true", mounts=[BindMount("/tmp", "/t")])
    with pytest.raises(ValueError, match=r"roles\[0\]\.mounts: on Slurm only a role in a"):
        cluster.submit(AppDef("x", [bind]))
    with pytest.raises(ValueError, match=r"cfg\.container_runtime: expected one of none, oci,"):
        cluster.submit(AppDef("x", [Role("w", entrypoint="true")]), {"container_runtime": "docker"})
    assert cluster.jobs == []


def test_the_batch_script_shows_the_container(
    local26: Cluster, tmp_path: Path, probe_image: str
) -> None:
    app = _probe_app(probe_image, tmp_path)
    script = str(local26.sched.submit_dryrun(app, local26.cfg({"container_runtime": "oci"})))
    assert '--container="$PWD/shipyard-oci-$SLURM_JOB_ID/probe-0"' in script
    text = script.split("c='", 1)[1].split("'", 1)[0]
    config = json.loads(text.replace("@UID@", "0").replace("@GID@", "0"))
    assert config["root"]["readonly"] is True and config["process"]["cwd"] == "/work"
    data = {"destination": "/data", "type": "none", "source": str(tmp_path)}
    assert {**data, "options": ["rbind", "rw"]} in config["mounts"]
    assert "role-env" not in text  # (the role's env goes by private names, as ever)
