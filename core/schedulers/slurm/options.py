"""The ``slurm`` scheduler's run options: :func:`run_opts` (what ``shipyard runopts slurm``
prints and ``runopts.resolve`` checks), :data:`SlurmOpts` (the same, typed) and
:func:`validate_options` (the values sbatch gets as text)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypedDict

from core.limits import add_limit_opts, add_requeue_opts
from core.reports import RESULT_REPLICAS_HELP, RESULT_REPLICAS_OPT
from core.schedulers.slurm.script import SBATCH_JOB_OPTIONS
from core.specs import CfgVal, runopts

__all__ = ["SlurmOpts", "run_opts", "validate_options"]

_TIME_RE = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+)$")
_PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
_MAIL_TYPES = frozenset(
    "NONE BEGIN END FAIL REQUEUE ALL INVALID_DEPEND STAGE_OUT TIME_LIMIT TIME_LIMIT_90"
    " TIME_LIMIT_80 TIME_LIMIT_50 ARRAY_TASKS".split()
)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_DEPENDENCY_RE = re.compile(r"[a-z]+(:[0-9]+(_[0-9*]+)?(\+[0-9]+)?)*([,?][a-z]+(:[0-9_*+]+)*)*")
_STR_OPTIONS = (*SBATCH_JOB_OPTIONS, "job_dir", "cluster")


#: The run options of the ``slurm`` scheduler, typed (see :func:`run_opts`; the keys are the
#: cfg's, hence the functional form for ``mail-user`` and ``mail-type``).
SlurmOpts = TypedDict(
    "SlurmOpts",
    {
        "partition": str | None,
        "time": str | None,
        "comment": str | None,
        "constraint": str | None,
        "mail-user": str | None,
        "mail-type": str | None,
        "job_dir": str | None,
        "cluster": str | None,
        "dependency": str | None,
        "result_replicas": str,
        "time_limit": str | None,
        "checkpoint_signal": str | None,
        "checkpoint_grace": float | None,
        "max_requeues": int,
        "requeue_on_timeout": bool,
        "exclude_failed_nodes": bool,
        "container_runtime": str,
    },
    total=False,
)


def run_opts() -> runopts:
    """The run options the ``slurm`` scheduler takes."""
    opts = runopts()
    opts.add("partition", type_=str, help="The partition to run the job in.")
    opts.add(
        "time",
        type_=str,
        help='The maximum time the job is allowed to run for. Formats: "minutes",'
        ' "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes"'
        ' or "days-hours:minutes:seconds"',
    )
    opts.add("comment", type_=str, help="Comment to set on the slurm job.")
    opts.add("constraint", type_=str, help="Constraint to use for the slurm job.")
    opts.add("mail-user", type_=str, help="User to mail on job end.")
    opts.add("mail-type", type_=str, help="What events to mail users on.")
    opts.add(
        "job_dir",
        type_=str,
        help="The directory to place the job code and outputs. The directory must not"
        " exist and will be created (on a named cluster: relative to its remote_dir).",
    )
    opts.add(
        "cluster",
        type_=str,
        help="A named cluster of clusters.yaml (or registered in this process), reached"
        " over SSH or slurmrestd; default: this host's Slurm commands.",
    )
    opts.add(
        "dependency",
        type_=str,
        help="sbatch --dependency, e.g. afterok:123:124 (Shipyard adds --kill-on-invalid-dep=yes:"
        " a dependency that can never be met ends the job CANCELLED); Runner.run(after=...)"
        " sets it for jobs of the same cluster",
    )
    opts.add(RESULT_REPLICAS_OPT, type_=str, default="first", help=RESULT_REPLICAS_HELP)
    add_limit_opts(opts)
    add_requeue_opts(opts)
    opts.add(
        "exclude_failed_nodes",
        type_=bool,
        default=False,
        help="keep a job requeued after a node failure (max_requeues) off the nodes that"
        " failed, while a watch follows it (scontrol update ExcNodeList; not over slurmrestd"
        " 22.05)",
    )
    opts.add(
        "container_runtime",
        type_=str,
        default="none",
        help="none (a role's image is not a container), oci: each role with an image runs in"
        " it (srun --container, the cluster's oci.conf; the image is a Docker image of this"
        " host's engine, copied to the cluster once, or the absolute path of an OCI bundle on"
        " the cluster), or pyxis (srun --container-image: Pyxis and enroot import the image)",
    )
    return opts


def validate_options(cfg: Mapping[str, CfgVal]) -> None:
    """Checks the options sbatch gets as text (each names itself when wrong)."""
    for key in _STR_OPTIONS:
        value = cfg.get(key)
        if value is not None and (not isinstance(value, str) or _CONTROL_RE.search(value)):
            raise ValueError(
                f"cfg.{key}: expected a string without control characters, got {value!r}"
            )
    dep = cfg.get("dependency")
    if dep and not _DEPENDENCY_RE.fullmatch(str(dep)):
        raise ValueError(
            "cfg.dependency: expected sbatch's form, e.g. afterok:123:124 or afterany:7_3,"
            f" got {dep!r}"
        )
    t = cfg.get("time")
    if t and not (_TIME_RE.fullmatch(str(t)) or str(t).upper() in ("UNLIMITED", "INFINITE")):
        raise ValueError(
            "cfg.time: expected minutes, minutes:seconds, hours:minutes:seconds, days-hours,"
            f" days-hours:minutes or days-hours:minutes:seconds, got {t!r}"
        )
    part = cfg.get("partition")
    if part and not _PARTITION_RE.fullmatch(str(part)):
        raise ValueError(
            f"cfg.partition: expected partition name(s) of letters, digits, '_', '.', '-', got {part!r}"
        )
    mail_type = cfg.get("mail-type")
    if mail_type:
        bad = [m for m in str(mail_type).split(",") if m.strip().upper() not in _MAIL_TYPES]
        if bad:
            raise ValueError(
                f"cfg.mail-type: expected a comma-separated list of {sorted(_MAIL_TYPES)},"
                f" got {mail_type!r}"
            )
    for key in ("mail-user", "constraint"):
        value = cfg.get(key)
        if value and re.search(r"\s", str(value)):
            raise ValueError(f"cfg.{key}: expected no whitespace, got {value!r}")
