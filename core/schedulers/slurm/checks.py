"""Pre-flight checks of a Slurm app (``SlurmScheduler.preflight``): what a submit would hit,
found without queueing anything; every problem is reported, each naming its field.

- Over the command transports (this host's Slurm, an SSH login node): ``sbatch --test-only``
  of each component alone (partition, constraint, time, resources), with Slurm's estimated
  start time as an ``info``; and every role's entrypoint resolved on the submit host, in the
  job's directory and with the role's ``PATH`` (one shell call for all roles; the script goes
  on stdin, so no env value reaches an argv).
- slurmrestd has no test-only submission: the partition is looked up and the memory asked
  for is compared with its nodes'; time and constraint are left to the submit (a warning).
- Roles in containers (``container_runtime``): over the command transports, the cluster has
  ``oci.conf`` beside its ``slurm.conf`` (``oci``: without it Slurm runs the command outside
  any container) or its ``srun`` has ``--container-image`` (``pyxis``); a bundle given as the
  image has its ``config.json``.
"""

from __future__ import annotations

import posixpath
import re
import shlex

from core.reports import Problem
from core.schedulers.slurm.script import SlurmBatchRequest
from core.schedulers.slurm.transport import (
    CommandClient,
    Shell,
    SlurmClient,
    TransportError,
    submit_error,
)
from core.specs import AppDef

__all__ = ["preflight"]

_START_RE = re.compile(r"to start at (\S+)(?: using (\d+) processors)?(?: on nodes (\S+))?")

# found CMD PATH: CMD (with a slash: as a path) is an executable file, else one on PATH
# (an empty PATH entry is the current directory, as exec sees it)
_FOUND = """found() {
  case $1 in */*) [ -f "$1" ] && [ -x "$1" ]; return ;; esac
  (set -f; IFS=:; for d in $2; do [ -f "${d:-.}/$1" ] && [ -x "${d:-.}/$1" ] && exit 0; done
   exit 1)
}
"""


def preflight(
    client: SlurmClient,
    app: AppDef | None,
    req: SlurmBatchRequest,
    workdir: str | None,
    in_job_dir: bool,
) -> list[Problem]:
    """The problems of ``req`` (see the module docs). ``workdir`` is where the commands run;
    ``in_job_dir``: it is the job's own directory (else relative entrypoints, which resolve
    in a directory the submit creates, are not checked)."""
    try:
        found = _container_problems(client, app, req)
        if not isinstance(client, CommandClient):
            return found + _rest_problems(client, app, req)
        found += _test_only(client, req, workdir)
        if app is not None:
            found += _entrypoint_problems(client.shell, app, req, workdir, in_job_dir)
        return found
    except TransportError as e:
        return [Problem("cfg.cluster", f"cannot reach the cluster: {e}")]


def _test_only(client: CommandClient, req: SlurmBatchRequest, workdir: str | None) -> list[Problem]:
    problems = []
    for name, rep in req.replicas.items():
        one = SlurmBatchRequest(cmd=req.cmd, replicas={name: rep}, job_dir=req.job_dir,
                                max_retries=0, app_name=req.app_name)  # fmt: skip
        p = client.shell.run(
            ["sbatch", "--test-only"], stdin=one.materialize(), cwd=workdir, retry=True
        )
        text = (p.stderr + p.stdout).strip()
        if p.returncode != 0:
            opts: dict[str, object] = dict(rep.sbatch_opts)
            err = submit_error(text.replace("sbatch: error: ", ""), opts)
            problems.append(_problem(name, str(err)))
            continue
        m = _START_RE.search(text)
        when = f"would start at {m.group(1)}" if m else text
        if m and m.group(3):
            when += f" on {m.group(3)}"
        problems.append(Problem(f"replica {name}", when, "info"))
    return problems


def _problem(name: str, text: str) -> Problem:
    field, sep, rest = text.partition(": ")
    if sep and (field.startswith("cfg.") or field.startswith("resource.")):
        return Problem(field, f"{name}: {rest}")
    return Problem(f"replica {name}", text)


def _entrypoint_problems(
    shell: Shell, app: AppDef, req: SlurmBatchRequest, workdir: str | None, in_job_dir: bool
) -> list[Problem]:
    """Each role's entrypoint (as its replica 0 runs it) looked up on the submit host, in
    ``workdir`` (relative paths only if it is the job's directory)."""
    checked: dict[int, str] = {}
    lines = [_FOUND]
    for i, role in enumerate(app.roles):
        rep = req.replicas.get(f"{role.name}-0")
        if rep is None:
            continue
        if rep.container_opts or (not in_job_dir and _in_new_dir(rep.entrypoint, req.job_dir)):
            continue  # (a container's entrypoint is in its image)
        path = shlex.quote(rep.env["PATH"]) if "PATH" in rep.env else '"$PATH"'
        lines.append(f"found {shlex.quote(rep.entrypoint)} {path} || echo {i}")
        checked[i] = rep.entrypoint
    if not checked:
        return []
    p = shell.run(["/bin/sh", "-s"], stdin="\n".join([*lines, "exit 0", ""]), cwd=workdir)
    if p.returncode != 0:
        detail = (p.stderr or p.stdout).strip()
        return [Problem("roles", f"entrypoints not checked: {detail}", "warning")]
    missing = {int(w) for w in p.stdout.split() if w.isdigit() and int(w) in checked}
    return [
        Problem(f"roles[{i}].entrypoint", _not_found(checked[i], workdir)) for i in sorted(missing)
    ]


def _container_problems(
    client: SlurmClient, app: AppDef | None, req: SlurmBatchRequest
) -> list[Problem]:
    if not req.images:
        return []
    problems: list[Problem] = []
    files = client.files
    roles = {r.image: i for i, r in enumerate(app.roles)} if app else {}
    for image in req.images:
        config = posixpath.join(image.bundle or "", "config.json")
        if image.bundle and files is not None and not files.exists(config):
            field = f"roles[{roles.get(image.ref, 0)}].image"
            problems.append(
                Problem(field, f"no OCI bundle at {image.ref} on the cluster ({config})")
            )
    if not isinstance(client, CommandClient):
        note = "the runtime is not checked over slurmrestd (a job without it stops with a message)"
        return [*problems, Problem("cfg.container_runtime", note, "warning")]
    if req.images[0].runtime == "pyxis":
        p = client.shell.run(["srun", "--help"])
        if "--container-image" not in p.stdout + p.stderr:
            text = "pyxis: the cluster's srun has no --container-image (Pyxis is not installed)"
            problems.append(Problem("cfg.container_runtime", text))
        return problems
    p = client.shell.run(["scontrol", "show", "config"])
    conf = re.search(r"^SLURM_CONF\s*=\s*(\S+)", p.stdout, re.M)
    oci = posixpath.join(posixpath.dirname(conf.group(1)), "oci.conf") if conf else ""
    if oci and files is not None and not files.exists(oci):
        problems.append(
            Problem(
                "cfg.container_runtime",
                f"oci: the cluster has no {oci} (Slurm's OCI support): Slurm would run the"
                " roles outside any container",
            )
        )
    return problems


def _in_new_dir(entrypoint: str, job_dir: str | None) -> bool:
    """The entrypoint resolves in the directory the submit creates (a relative path, or one
    under the new ``job_dir``, as ``${img_root}/run.sh`` becomes): nothing to look up yet."""
    if "/" in entrypoint and not entrypoint.startswith("/"):
        return True
    return bool(job_dir) and entrypoint.startswith(f"{job_dir}/")


def _not_found(entrypoint: str, workdir: str | None) -> str:
    if "/" not in entrypoint:
        return f"{entrypoint!r} was not found on PATH on the cluster's submit host"
    where = "" if entrypoint.startswith("/") else f" in {workdir or 'the job directory'}"
    return f"{entrypoint!r} does not exist{where} or is not executable on the cluster"


def _rest_problems(
    client: SlurmClient, app: AppDef | None, req: SlurmBatchRequest
) -> list[Problem]:
    """The partition exists and its nodes have the memory each role asks for."""
    memory, default = client.partitions()
    first = next(iter(req.replicas.values()), None)
    wanted = (first.sbatch_opts.get("partition") if first else None) or default or ""
    parts = [p for p in wanted.split(",") if p]
    known = ", ".join(sorted(memory)) or "none"
    problems = [
        Problem("cfg.partition", f"no partition {p!r} on the cluster (it has: {known})")
        for p in parts
        if p not in memory
    ]
    biggest = max((memory[p] for p in parts if p in memory), default=None)
    for i, role in enumerate(app.roles if app else []):
        rep = req.replicas.get(f"{role.name}-0")
        mem = rep.sbatch_opts.get("mem") if rep else None
        if mem and biggest is not None and int(mem) > biggest:
            problems.append(
                Problem(
                    f"roles[{i}].resource.memMB",
                    f"{role.name}: asks for {mem} MB, but the nodes of {wanted} have {biggest} MB",
                )
            )
    problems.append(
        Problem(
            "cfg.cluster",
            "slurmrestd has no test-only submission: time, constraint and free resources are"
            " checked at submit",
            "warning",
        )
    )
    return problems
