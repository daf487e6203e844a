"""Containers on Slurm (``container_runtime=oci`` and ``pyxis``) on the Slurm 26.05 cluster of
``scripts/start_slurm26.sh`` (through this host's 26.05 commands: cluster ``local26``), beside
a bare ``sbatch`` of ``srun --container=BUNDLE true`` with a bundle made by hand from the same
image, and of ``srun --container-image=IMAGE true``, in the same run. Both sides are timed from the submit to the job's end as the same
``squeue`` loop sees it (Slurm's scheduling and the runtime dominate both).

slurmctld starts a submitted batch job only at its next scheduling pass, and its background
loop runs one at the start of each wall-clock second (``sched_interval=1``): a job waits 0-1 s
for it, set by when in the second it was submitted. Each side's trials therefore start at the
same evenly spread points of the second (:func:`_at_phase`), so that wait averages out alike on
both sides instead of deciding the row: started right after a job's end, the trials of both
sides used to fall into two groups (about 0.2 s and 0.8 s) and a median landed on either."""

from __future__ import annotations

import itertools
import os
import subprocess
import tempfile
import time
from typing import Any

from bench.common import Ctx
from bench.harness import Row, Section, Target, fill, interleave, ratio, wait_for

SESSION = "benchoci"
PREFIX = "/opt/slurm-26.05.3"
IMAGE = "shipyard-test/busybox:latest"
#: the same image in the loopback registry, as Pyxis imports it (and as enroot names it)
REGISTRY_IMAGE = "127.0.0.1:5000/shipyard-test/busybox:latest"
REMOTE_DIR = os.environ.get("SHIPYARD_REMOTE_DIR", "/var/lib/shipyard-remote")
ROWS: list[tuple[str, Target | None, str]] = [
    ("oci: a container job, submit to end", ratio(1.2), "ms"),
    ("pyxis: a container job, submit to end", ratio(1.2), "ms"),
]


def _problem() -> str | None:
    if not os.path.exists(f"{PREFIX}/etc/oci.conf"):
        return "no Slurm 26.05 with oci.conf (scripts/start_slurm26.sh)"
    p = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    return None if p.returncode == 0 else f"no {IMAGE} (scripts/build_test_images.sh)"


def _slurm(cmd: str, *args: str, stdin: str | None = None) -> str:
    p = subprocess.run([f"{PREFIX}/bin/{cmd}", *args], input=stdin, capture_output=True,
                       text=True, check=True)  # fmt: skip
    return p.stdout.strip()


def _ended(job: str) -> bool:
    state = _slurm("squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
    if state in ("FAILED", "CANCELLED", "TIMEOUT"):
        raise RuntimeError(f"container job {job} ended {state}")
    return state == "COMPLETED"


def _at_phase(phase: float) -> None:
    """Sleeps until the wall clock is ``phase`` (0-1) of the way into a second."""
    time.sleep((phase - time.time() % 1.0) % 1.0)


def _bundle(tmp: str) -> str:
    """A bundle of ``IMAGE`` made as a user would: ``docker export`` and ``runc spec``."""
    bundle = tempfile.mkdtemp(prefix="oci-bundle-", dir=tmp)
    os.mkdir(os.path.join(bundle, "rootfs"))
    cid = subprocess.run(["docker", "create", IMAGE, "/bin/true"], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", f"{bundle}/rootfs"], stdin=export.stdout, check=True)
        export.wait()
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    subprocess.run(["runc", "spec", "--rootless"], cwd=bundle, check=True)
    return bundle


def run(ctx: Ctx) -> list[Row]:
    sec = Section("containers", ctx.runs, ctx.verbose)
    problem = _problem()
    if problem:
        sec.skip_all(problem, ROWS)
        return sec.rows
    os.environ["SHIPYARD_CLUSTERS"] = os.path.join(REMOTE_DIR, "clusters.yaml")
    from core.runner import get_runner
    from core.specs import AppDef, Role

    workdir = tempfile.mkdtemp(prefix="oci-jobs-", dir=ctx.tmp)
    bundle = _bundle(ctx.tmp)
    app = AppDef("oci", [Role("r", image=IMAGE, entrypoint="true")])
    cfg: dict[str, Any] = {"cluster": "local26"}
    runner = get_runner(SESSION)
    os.chdir(workdir)

    runs = ctx.runs * 2
    # the same points of the second for both sides, each once in a side's measured trials
    # (its one warm-up trial takes the first point, the cycle then starts over)
    spread = [(k + 0.5) / runs for k in range(runs)]
    phases = {"shipyard": itertools.cycle(spread), "raw": itertools.cycle(spread)}

    def timed(submit: Any, side: str) -> float:
        _at_phase(next(phases[side]))
        t0 = time.perf_counter()
        job = submit()
        wait_for(lambda: _ended(job), 120, f"container job {job}", interval=0.05)
        return time.perf_counter() - t0

    def shipyard(app: Any, runtime: str) -> str:
        handle = runner.run(app, "slurm", {**cfg, "container_runtime": runtime})
        return str(handle.rsplit(":", 1)[1])

    def raw(option: str) -> str:
        script = f"#!/bin/bash\n{PREFIX}/bin/srun {option} /bin/true\n"
        return _slurm("sbatch", "--parsable", "-o", "/dev/null", stdin=script).split(";")[0]

    subprocess.run(["docker", "tag", IMAGE, REGISTRY_IMAGE], check=True)
    subprocess.run(["docker", "push", "-q", REGISTRY_IMAGE], check=True, capture_output=True)
    pyxis_app = AppDef("pyxis", [Role("r", image=REGISTRY_IMAGE, entrypoint="true")])
    pyxis_ref = REGISTRY_IMAGE.replace("/", "#", 1)
    sides = {
        "oci": (lambda: shipyard(app, "oci"), lambda: raw(f"--container={bundle}"),
                "sbatch of srun --container (a bundle made by hand)"),
        "pyxis": (lambda: shipyard(pyxis_app, "pyxis"),
                  lambda: raw(f"--container-image={pyxis_ref}"),
                  "sbatch of srun --container-image"),
    }  # fmt: skip
    try:
        for name, (ship, bare, raw_name) in sides.items():
            sec.measure(
                sec.row(f"{name}: a container job, submit to end", ratio(1.2), raw_name=raw_name),
                # (twice the runs: the samples spread over the second, see the module's doc)
                lambda row, s=ship, b=bare: fill(  # type: ignore[misc]
                    row, interleave({"shipyard": lambda: timed(s, "shipyard"),
                                     "raw": lambda: timed(b, "raw")}, runs, warmup=1)),
            )  # fmt: skip
    finally:
        runner.close()
    return sec.rows
