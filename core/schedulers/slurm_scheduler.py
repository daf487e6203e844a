"""The ``slurm`` scheduler: every app is one heterogeneous Slurm job.

Each replica of each role is one component of a heterogeneous job submitted with ``sbatch``; the
batch script starts all of them with a single ``srun`` whose per-component command lines are
joined by `` : ``. The Slurm CLI (``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``sinfo``) must
be installed and talk to the cluster; job accounting (slurmdbd) is used once a job has left the
controller, and is optional.

Logs are written as ``slurm-<jobid>-<role>-<replica_id>.out`` (stdout) and ``.err`` (stderr) in the
job's working directory: ``cfg.job_dir`` if given (a new directory; with a workspace, a snapshot
of it), else the directory the job was submitted from. The working directory is read back from
Slurm itself, so logs can be followed from any process and any directory.

Jobs inherit the submitting environment (``sbatch --export=ALL``, the default): an activated
virtualenv or conda environment is active in the replicas too.

    $ shipyard run --scheduler slurm ...
    $ shipyard status slurm://session/1234
    $ less slurm-1234-trainer-0.out
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.schedulers.api import (
    IDEMPOTENCY_KEY,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
    filter_regex,
)
from core.specs import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    ReplicaStatus,
    RetryPolicy,
    Role,
    RoleStatus,
    is_terminal,
    macros,
    runopts,
)
from core.workspace import DirWorkspaceMixin

log = logging.getLogger(__name__)

__all__ = [
    "SLURM_STATES",
    "SlurmBatchRequest",
    "SlurmReplicaRequest",
    "SlurmScheduler",
    "create_scheduler",
]

#: cfg options passed to ``sbatch`` for every component of the job
SBATCH_JOB_OPTIONS: tuple[str, ...] = (
    "partition",
    "time",
    "comment",
    "constraint",
    "mail-user",
    "mail-type",
)

#: Slurm job/step states and the app state each maps to
SLURM_STATES: dict[str, AppState] = {
    "BOOT_FAIL": AppState.FAILED,
    "CANCELLED": AppState.CANCELLED,
    "COMPLETED": AppState.SUCCEEDED,
    "CONFIGURING": AppState.PENDING,
    "COMPLETING": AppState.RUNNING,
    "DEADLINE": AppState.FAILED,
    "FAILED": AppState.FAILED,
    "NODE_FAIL": AppState.FAILED,
    "OUT_OF_MEMORY": AppState.FAILED,
    "PENDING": AppState.PENDING,
    "PREEMPTED": AppState.FAILED,
    "RUNNING": AppState.RUNNING,
    "RESV_DEL_HOLD": AppState.PENDING,
    "REQUEUE_FED": AppState.PENDING,
    "REQUEUE_HOLD": AppState.PENDING,
    "REQUEUED": AppState.PENDING,
    "RESIZING": AppState.RUNNING,
    "REVOKED": AppState.FAILED,
    "SIGNALING": AppState.RUNNING,
    "SPECIAL_EXIT": AppState.FAILED,
    "STAGE_OUT": AppState.RUNNING,
    "STOPPED": AppState.PENDING,
    "SUSPENDED": AppState.PENDING,
    "TIMEOUT": AppState.FAILED,
}

#: the environment variable, set in every replica, that names the node of replica 0 of role 0
RANK0_ENV = "SLURM_JOB_NODELIST_HET_GROUP_0"

_APP_ID_EXPR = '"$SLURM_JOB_ID"'  # the app id is the het job's (leader's) id, known at run time
_KEY_MARK = "shipyard-key="
_KEY_IN_COMMENT_RE = re.compile(r"(?:^|\s)shipyard-key=(\S+)")
_SAFE_KEY_RE = re.compile(r"^[A-Za-z0-9_.:@+-]{1,100}$")
_SAFE_SBATCH_RE = re.compile(r"^[A-Za-z0-9_.,:/@%+=-]+$")
_TIME_RE = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+)$")
_PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
_MAIL_TYPES = frozenset(
    {
        "NONE",
        "BEGIN",
        "END",
        "FAIL",
        "REQUEUE",
        "ALL",
        "INVALID_DEPEND",
        "STAGE_OUT",
        "TIME_LIMIT",
        "TIME_LIMIT_90",
        "TIME_LIMIT_80",
        "TIME_LIMIT_50",
        "ARRAY_TASKS",
    }
)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_JOB_ID_RE = re.compile(r"^[0-9]+$")
_SEP = "\x1f"  # field separator for squeue/sacct output: cannot occur in validated values
_SQUEUE_FIELDS = (
    "HetJobID",
    "HetJobOffset",
    "JobID",
    "State",
    "RestartCnt",
    "DerivedEC",
    "Name",
    "NodeList",
    "WorkDir",
    "Reason",
    "Comment",  # last: free text
)
_SQUEUE_FORMAT = ",".join(f"{f}:{_SEP}" for f in _SQUEUE_FIELDS)
_SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "WorkDir", "Comment")
_LOG_CHUNK = 1 << 20


# ---------------------------------------------------------------------------------------------
# quoting
# ---------------------------------------------------------------------------------------------


def _shell(value: str, app_id_expr: str = _APP_ID_EXPR) -> str:
    """Quotes ``value`` for bash, turning ``${app_id}`` into the job id at run time."""
    parts = value.split(macros.app_id)
    if len(parts) == 1:
        return shlex.quote(value)
    return app_id_expr.join(shlex.quote(p) if p else "" for p in parts)


def _sbatch_value(value: str) -> str:
    """Quotes a value for sbatch's own ``#SBATCH`` line parser (which honours ``"`` and ``\\``)."""
    if _SAFE_SBATCH_RE.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _key_token(key: str) -> str:
    """How an idempotency key is stored in the job's comment (hashed unless plainly safe)."""
    if _SAFE_KEY_RE.match(key):
        return key
    return "sha256-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def _comment_key(comment: str) -> str | None:
    """The idempotency-key token stored in a job comment, if any."""
    found = _KEY_IN_COMMENT_RE.findall(comment)
    return found[-1] if found else None


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------


@dataclass
class SlurmReplicaRequest:
    """One replica (one het-job component): its ``#SBATCH`` options and its ``srun`` command.

    ``args``, ``env`` values and ``srun_opts`` values are plain strings (quoted when
    materialized); ``${app_id}`` in them becomes the job id at run time.
    """

    name: str
    entrypoint: str
    args: list[str]
    srun_opts: dict[str, str]
    sbatch_opts: dict[str, str | None]
    env: dict[str, str]

    @classmethod
    def from_role(
        cls, name: str, role: Role, cfg: Mapping[str, CfgVal], nomem: bool
    ) -> SlurmReplicaRequest:
        """The request for replica ``name`` (``{role}-{replica_id}``) of ``role``.

        ``role`` has its macros already substituted. Resources come from ``role.resource``
        (``--cpus-per-task``, ``--mem`` unless ``nomem``, ``--gpus-per-task``); the job options
        of ``cfg`` (partition, time, comment, constraint, mail-user, mail-type) are set too.
        """
        sbatch_opts: dict[str, str | None] = {"job-name": name, "ntasks": "1"}
        for key in SBATCH_JOB_OPTIONS:
            value = cfg.get(key)
            if value is not None and value != "":
                sbatch_opts[key] = str(value)
        res = role.resource
        if res.cpu > 0:
            sbatch_opts["cpus-per-task"] = str(res.cpu)
        if res.memMB > 0 and not nomem:
            sbatch_opts["mem"] = str(res.memMB)
        if res.gpu > 0:
            sbatch_opts["gpus-per-task"] = str(res.gpu)
        srun_opts = {
            "output": f"slurm-{macros.app_id}-{name}.out",
            "error": f"slurm-{macros.app_id}-{name}.err",
            # a requeued job appends to the logs of its earlier attempts
            "open-mode": "append",
        }
        return cls(
            name=name,
            entrypoint=role.entrypoint,
            args=list(role.args),
            srun_opts=srun_opts,
            sbatch_opts=sbatch_opts,
            env=dict(role.env),
        )

    def materialize(self) -> tuple[list[str], list[str]]:
        """The ``#SBATCH`` option group and the ``srun`` group of this replica.

        Both are lists of already-quoted tokens: the sbatch group for sbatch's ``#SBATCH``
        parser, the srun group for bash. Groups of several replicas are combined with
        ``#SBATCH hetjob`` and `` : `` respectively.
        """
        sbatch = [
            f"--{k}" if v is None else f"--{k}={_sbatch_value(v)}"
            for k, v in self.sbatch_opts.items()
        ]
        srun = [f"--{k}={_shell(v)}" for k, v in self.srun_opts.items()]
        # `env` sets the replica's variables: values may hold any character (no --export parsing)
        srun += ["env", *(f"{k}={_shell(v)}" for k, v in self.env.items())]
        cmd = [self.entrypoint, *self.args]
        if ":" in cmd or "=" in self.entrypoint:
            # srun splits its command line at every bare ":" (the het-job separator), even
            # among the program's arguments, and `env` would take an entrypoint with "=" for a
            # variable: hand such a command to sh as one quoted string.
            inner = " ".join(_shell(c, '"$SHIPYARD_APP_ID"') for c in cmd)
            srun += ["/bin/sh", "-c", shlex.quote(f"exec {inner}")]
        else:
            srun += [_shell(c) for c in cmd]
        return sbatch, srun


@dataclass
class SlurmBatchRequest:
    """A whole app for ``sbatch``: the command, the replicas (in het-component order), the
    directory the job runs in (None: the current one) and how often a failed job is requeued."""

    cmd: list[str]
    replicas: dict[str, SlurmReplicaRequest]
    job_dir: str | None
    max_retries: int
    app_name: str = ""

    def materialize(self) -> str:
        """The batch script (pass it to ``sbatch``): every replica is one het-job component."""
        groups = [r.materialize() for r in self.replicas.values()]
        lines = [
            "#!/bin/bash",
            "#",
            f"# Shipyard app {self.app_name or '(unnamed)'}: {len(groups)} replica(s), one"
            " heterogeneous-job component each.",
            "# Submit with: sbatch --parsable <this file>",
            "# Logs: slurm-<job id>-<role>-<replica id>.out and .err in the job's directory.",
            "#",
        ]
        for i, (sbatch, _) in enumerate(groups):
            if i:
                lines.append("#SBATCH hetjob")
            lines.append("#SBATCH " + " ".join(sbatch))
        lines += [
            "",
            "export PYTHONUNBUFFERED=1",
            "export SLURM_UNBUFFEREDIO=1",
            f"# a job of one component is not heterogeneous: {RANK0_ENV} is set for it here",
            f'export {RANK0_ENV}="${{{RANK0_ENV}:-$SLURM_JOB_NODELIST}}"',
            "",
            "srun \\",
        ]
        for i, (_, srun) in enumerate(groups):
            if i:
                lines.append("  : \\")
            tail = " \\" if i < len(groups) - 1 else ""
            lines.append("    " + " ".join(srun) + tail)
        lines += ["exitcode=$?", ""]
        if self.max_retries > 0:
            lines += [
                f"# max_retries={self.max_retries}: a failed attempt requeues the whole job",
                'if [ "$exitcode" -ne 0 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt'
                f" {int(self.max_retries)} ]; then",
                '    echo "shipyard: attempt ${SLURM_RESTART_COUNT:-0} failed with exit code'
                ' $exitcode, requeueing job $SLURM_JOB_ID" >&2',
                '    scontrol requeue "$SLURM_JOB_ID"',
                "fi",
            ]
        lines += ['exit "$exitcode"', ""]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.materialize()


# ---------------------------------------------------------------------------------------------
# what Slurm says about a job
# ---------------------------------------------------------------------------------------------


@dataclass
class _Component:
    """One het-job component (one replica) as Slurm reports it."""

    offset: int
    name: str
    state: str
    nodes: str = ""
    exit_code: int | None = None
    step_state: str | None = None


@dataclass
class _JobInfo:
    app_id: str
    state: str
    restarts: int = 0
    reason: str = ""
    workdir: str = ""
    comment: str = ""
    components: dict[int, _Component] = field(default_factory=dict)
    source: str = "squeue"


def _slurm_state(raw: str) -> str:
    # sacct says "CANCELLED by 0"; squeue may add "+" suffixes in some versions
    return raw.strip().split(" ")[0].rstrip("+").upper() if raw.strip() else "UNKNOWN"


def _app_state(slurm_state: str) -> AppState:
    return SLURM_STATES.get(slurm_state, AppState.UNKNOWN)


def _wait_status_code(raw: str) -> int | None:
    """A raw wait status (squeue's DerivedEC) as an exit code (-N for signal N)."""
    try:
        status = int(raw)
    except ValueError:
        return None
    if status & 0x7F:
        return -(status & 0x7F)
    return (status >> 8) & 0xFF


def _colon_code(raw: str) -> int | None:
    """sacct's ``code:signal`` as an exit code (-N for signal N)."""
    code, _, sig = raw.partition(":")
    try:
        signal = int(sig or 0)
        return -signal if signal else int(code)
    except ValueError:
        return None


def _split_name(name: str) -> tuple[str, int]:
    role, _, idx = name.rpartition("-")
    if role and idx.isdigit():
        return role, int(idx)
    return name, 0


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _parse_squeue(out: str) -> dict[str, _JobInfo]:
    """Parses ``squeue -O`` rows (one per het-job component) into jobs keyed by app id."""
    jobs: dict[str, _JobInfo] = {}
    n = len(_SQUEUE_FIELDS)
    for line in out.splitlines():
        parts = line.split(_SEP)
        if len(parts) < n:
            continue
        het_id, offset, job_id, state, restarts, derived, name, nodes, workdir, reason = (
            p.strip() for p in parts[: n - 1]
        )
        comment = _SEP.join(parts[n - 1 :]).rstrip(_SEP)
        if het_id.isdigit() and het_id != "0":
            app_id, off = het_id, int(offset) if offset.isdigit() else 0
        else:  # a job of one component is not heterogeneous
            app_id, off = job_id, 0
        slurm_state = _slurm_state(state)
        info = jobs.get(app_id)
        if info is None or off == 0:
            if info is None:
                info = jobs[app_id] = _JobInfo(app_id=app_id, state=slurm_state)
            info.state = slurm_state
            info.restarts = int(restarts) if restarts.isdigit() else 0
            info.reason = "" if reason in ("None", "(null)") else reason
            info.workdir = workdir
            info.comment = "" if comment == "(null)" else comment
        terminal = is_terminal(_app_state(slurm_state))
        info.components[off] = _Component(
            offset=off,
            name=name,
            state=slurm_state,
            nodes=nodes,
            # DerivedEC: the highest exit code of the component's steps; none if it never ran
            exit_code=_wait_status_code(derived) if terminal and nodes else None,
        )
    return jobs


def _parse_sacct(out: str) -> dict[str, _JobInfo]:
    """Parses ``sacct -D -P`` rows. A requeued job has one allocation record per attempt, each
    followed by its steps: the last attempt's records win."""
    jobs: dict[str, _JobInfo] = {}
    attempts: dict[str, int] = {}
    last_leader_state: dict[str, str] = {}
    n = len(_SACCT_FIELDS)
    for line in out.splitlines():
        parts = line.split(_SEP)
        if len(parts) < n:
            continue
        job_id, name, state, exit_code, nodes, workdir = parts[: n - 1]
        comment = _SEP.join(parts[n - 1 :])
        alloc, _, step = job_id.partition(".")
        app_id, _, off_s = alloc.partition("+")
        if not app_id.isdigit():
            continue
        off = int(off_s) if off_s.isdigit() else 0
        info = jobs.setdefault(app_id, _JobInfo(app_id=app_id, state="UNKNOWN", source="sacct"))
        slurm_state = _slurm_state(state)
        if not step:  # a component's allocation record: starts a new attempt of it
            if off == 0 and last_leader_state.get(app_id, "REQUEUED") != "REQUEUED":
                # the previous record ended without a requeue: it was another job whose id
                # was reused (the controller's job ids were reset); only the newest counts
                info.components.clear()
                attempts[app_id] = 0
            info.components[off] = _Component(
                offset=off,
                name=name,
                state=slurm_state,
                nodes="" if nodes in ("None assigned", "(null)") else nodes,
            )
            if off == 0:
                attempts[app_id] = attempts.get(app_id, 0) + 1
                last_leader_state[app_id] = slurm_state
                info.state = slurm_state
                info.workdir = workdir
                info.comment = comment
        elif step.isdigit() and off in info.components:  # an srun step: the replica itself
            comp = info.components[off]
            comp.step_state = slurm_state
            comp.exit_code = _colon_code(exit_code)
    for app_id, count in attempts.items():
        jobs[app_id].restarts = max(0, count - 1)
    return jobs


# ---------------------------------------------------------------------------------------------
# the scheduler
# ---------------------------------------------------------------------------------------------


class SlurmScheduler(DirWorkspaceMixin, Scheduler[SlurmBatchRequest]):
    """Runs apps on a Slurm cluster as heterogeneous jobs (see the module docs).

    ``describe`` asks ``squeue --states=all`` (one call; it also reports jobs that ended
    recently, with each component's exit code) and ``sacct`` only for jobs the controller no
    longer knows or that were requeued. Without accounting (``sacct`` fails), a finished job is
    described from the controller's own records, the ones ``scontrol show job`` prints, until
    the controller purges them (``MinJobAge``). Replica ``k`` of role ``r`` is the het-job
    component named ``r-k``.

    Args:
        session_name: the session the apps are submitted under
    """

    def __init__(self, session_name: str, **kwargs: Any) -> None:
        super().__init__("slurm", session_name)
        self._partition_mem: dict[str, int] | None = None
        self._default_partition: str | None = None
        self._workdirs: dict[str, str] = {}
        self._created_job_dirs: set[str] = set()

    # -- options --------------------------------------------------------------------------

    def _run_opts(self) -> runopts:
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
            " exist and will be created.",
        )
        return opts

    # -- workspace ------------------------------------------------------------------------

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Snapshots ``workspace`` into the new ``cfg.job_dir``, where the job then runs."""
        super().build_workspace_and_update_role(role, workspace, cfg)
        job_dir = cfg.get("job_dir")
        if isinstance(job_dir, str) and job_dir:
            self._created_job_dirs.add(os.path.abspath(job_dir))

    # -- validation -----------------------------------------------------------------------

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        for key in (*SBATCH_JOB_OPTIONS, "job_dir"):
            value = cfg.get(key)
            if value is not None and (not isinstance(value, str) or _CONTROL_RE.search(value)):
                raise ValueError(
                    f"cfg.{key}: expected a string without control characters, got {value!r}"
                )
        t = cfg.get("time")
        if t and not (_TIME_RE.match(str(t)) or str(t).upper() in ("UNLIMITED", "INFINITE")):
            raise ValueError(
                f"cfg.time: expected minutes, minutes:seconds, hours:minutes:seconds, days-hours,"
                f" days-hours:minutes or days-hours:minutes:seconds, got {t!r}"
            )
        part = cfg.get("partition")
        if part and not _PARTITION_RE.match(str(part)):
            raise ValueError(
                f"cfg.partition: expected partition name(s) of letters, digits, '_', '.', '-',"
                f" got {part!r}"
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
        job_dir = cfg.get("job_dir")
        if job_dir:
            path = os.path.abspath(str(job_dir))
            if os.path.exists(path) and path not in self._created_job_dirs:
                raise ValueError(f"cfg.job_dir: must not exist (it is created), but {path} exists")
        for i, role in enumerate(app.roles):
            if role.max_retries > 0 and role.retry_policy != RetryPolicy.APPLICATION:
                raise ValueError(
                    f"roles[{i}].retry_policy: slurm supports only APPLICATION (the whole job is"
                    f" requeued), got {role.retry_policy.value}"
                )
            if role.mounts:
                raise ValueError(f"roles[{i}].mounts: the slurm scheduler does not support mounts")

    # -- submitting -----------------------------------------------------------------------

    def _partition_memmb(self, partition: str | None) -> int | None:
        """The smallest RealMemory (MB) of ``partition``'s nodes (cached; one sinfo call)."""
        if self._partition_mem is None:
            self._partition_mem = {}
            try:
                p = _run(["sinfo", "-h", "-o", f"%P{_SEP}%m"], timeout=30)
            except (OSError, subprocess.TimeoutExpired) as e:
                log.debug("sinfo failed: %s", e)
                return None
            for line in p.stdout.splitlines():
                name, _, mem = line.partition(_SEP)
                if name.endswith("*"):
                    name = name[:-1]
                    self._default_partition = name
                try:
                    value = int(mem.strip().rstrip("+"))
                except ValueError:
                    continue
                # a partition whose nodes differ is listed once per kind of node: keep the least
                self._partition_mem[name] = min(value, self._partition_mem.get(name, value))
        wanted = partition or self._default_partition
        if wanted is None:
            return None
        return self._partition_mem.get(wanted.split(",")[0])

    def _submit_dryrun(
        self, app: AppDef, cfg: Mapping[str, CfgVal]
    ) -> AppDryRunInfo[SlurmBatchRequest]:
        job_dir_cfg = cfg.get("job_dir")
        job_dir = os.path.abspath(str(job_dir_cfg)) if job_dir_cfg else None
        nomem = False
        if any(role.resource.memMB > 0 for role in app.roles):
            part = cfg.get("partition")
            mem = self._partition_memmb(str(part) if part else None)
            # partitions with (almost) no RealMemory configured reject any --mem request
            nomem = mem is not None and mem < 1000
        job_cfg = dict(cfg)
        key = app.metadata.get(IDEMPOTENCY_KEY)
        if key:
            user_comment = str(cfg.get("comment") or "")
            mark = _KEY_MARK + _key_token(str(key))
            job_cfg["comment"] = f"{user_comment} {mark}" if user_comment else mark
        img_root = job_dir or os.getcwd()
        replicas: dict[str, SlurmReplicaRequest] = {}
        for role in app.roles:
            for replica_id in range(role.num_replicas):
                values = macros.Values(
                    img_root=img_root,
                    app_id=macros.app_id,
                    replica_id=str(replica_id),
                    rank0_env=RANK0_ENV,
                )
                replica_role = values.apply(role)
                replica_role.env.update(
                    {
                        "SHIPYARD_APP_ID": macros.app_id,
                        "SHIPYARD_ROLE_NAME": role.name,
                        "SHIPYARD_REPLICA_ID": str(replica_id),
                        "SHIPYARD_NUM_REPLICAS": str(role.num_replicas),
                    }
                )
                name = f"{role.name}-{replica_id}"
                replicas[name] = SlurmReplicaRequest.from_role(name, replica_role, job_cfg, nomem)
        # sbatch carries some options of a het component over to the next one (e.g. --mem):
        # components that ask for none after one that did get the "no particular request" value.
        seen_mem = seen_gpu = False
        for rep in replicas.values():
            if "mem" in rep.sbatch_opts:
                seen_mem = True
            elif seen_mem:
                rep.sbatch_opts["mem"] = "0"
            if "gpus-per-task" in rep.sbatch_opts:
                seen_gpu = True
            elif seen_gpu:
                rep.sbatch_opts["gpus-per-task"] = "0"
        max_retries = max(role.max_retries for role in app.roles)
        if max_retries > 0:
            first = next(iter(replicas.values()))
            first.sbatch_opts["requeue"] = None
        req = SlurmBatchRequest(
            cmd=["sbatch", "--parsable"],
            replicas=replicas,
            job_dir=job_dir,
            max_retries=max_retries,
            app_name=app.name,
        )
        return AppDryRunInfo(req, lambda r: r.materialize())

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        """Submits the batch script with ``sbatch`` (in ``job_dir`` if set) and returns the job id.

        Raises:
            ValueError: sbatch rejected an option (e.g. an unknown partition): nothing was queued.
            RuntimeError: sbatch failed for another reason: nothing was queued.
        """
        req = dryrun_info.request
        script = req.materialize()
        cwd = None
        created = False
        if req.job_dir:
            cwd = req.job_dir
            if not os.path.isdir(cwd):
                os.makedirs(cwd)
                created = True
            with open(os.path.join(cwd, "shipyard-sbatch.sh"), "w") as f:
                f.write(script)
        try:
            p = subprocess.run(req.cmd, input=script, capture_output=True, text=True, cwd=cwd)
        except OSError as e:
            self._undo_job_dir(req.job_dir, created)
            raise RuntimeError(f"sbatch could not be run ({e}); is Slurm installed?") from e
        if p.returncode != 0:
            self._undo_job_dir(req.job_dir, created)
            raise _submit_error(p.stderr.strip() or p.stdout.strip(), dryrun_info._cfg or {})
        job_id = p.stdout.strip().split(";")[0]
        if not _JOB_ID_RE.match(job_id):
            raise RuntimeError(f"sbatch: unexpected output {p.stdout!r}")
        if req.job_dir:
            self._workdirs[job_id] = req.job_dir
            self._created_job_dirs.discard(req.job_dir)
        log.info("submitted slurm job %s (%d replicas)", job_id, len(req.replicas))
        return job_id

    @staticmethod
    def _undo_job_dir(job_dir: str | None, created: bool) -> None:
        if job_dir and created:
            try:
                os.remove(os.path.join(job_dir, "shipyard-sbatch.sh"))
                os.rmdir(job_dir)
            except OSError:
                pass

    # -- describing -----------------------------------------------------------------------

    def _squeue(self, app_ids: list[str]) -> tuple[dict[str, _JobInfo], str | None]:
        """What the controller knows of ``app_ids``, and why squeue failed (None if it did not:
        a job the controller does not know is simply left out)."""
        cmd = ["squeue", "-h", "-t", "all", "-j", ",".join(app_ids), "-O", _SQUEUE_FORMAT]
        try:
            p = _run(cmd)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {}, str(e)
        if p.returncode != 0:
            if "Invalid job id" in p.stderr:
                return {}, None
            log.warning("squeue failed: %s", p.stderr.strip())
            return {}, p.stderr.strip() or f"exit code {p.returncode}"
        return {k: v for k, v in _parse_squeue(p.stdout).items() if k in app_ids}, None

    def _sacct(self, app_ids: list[str]) -> dict[str, _JobInfo] | None:
        """What accounting knows of ``app_ids`` (None if accounting is not available)."""
        try:
            p = _run(
                [
                    "sacct",
                    "-n",
                    "-P",
                    "-D",
                    f"--delimiter={_SEP}",
                    "-j",
                    ",".join(app_ids),
                    "-o",
                    ",".join(_SACCT_FIELDS),
                ]
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.debug("sacct failed: %s", e)
            return None
        if p.returncode != 0:
            log.debug("sacct failed: %s", p.stderr.strip())
            return None
        return _parse_sacct(p.stdout)

    def _job_infos(self, app_ids: list[str]) -> dict[str, _JobInfo]:
        ids = [a for a in dict.fromkeys(app_ids) if _JOB_ID_RE.match(a)]
        if not ids:
            return {}
        found, squeue_error = self._squeue(ids)
        # sacct for jobs the controller forgot, and for requeued ones that ended (squeue's
        # derived exit codes span every attempt; sacct has each attempt's steps)
        need = [
            a
            for a in ids
            if a not in found or (found[a].restarts > 0 and is_terminal(_app_state(found[a].state)))
        ]
        if need:
            acct = self._sacct(need) or {}
            for a in need:
                info = acct.get(a)
                if info is None or not info.components:
                    continue
                if a in found and (
                    not is_terminal(_app_state(info.state))
                    or set(info.components) != set(found[a].components)
                ):
                    continue  # accounting lags behind the controller: keep squeue's answer
                if a in found:
                    info.restarts = max(info.restarts, found[a].restarts)
                found[a] = info
        if squeue_error is not None:
            unknown = [a for a in ids if a not in found]
            if unknown:
                # the controller did not answer: "no such job" would be a lie
                raise RuntimeError(
                    f"slurm: cannot describe job(s) {', '.join(unknown)}: squeue failed"
                    f" ({squeue_error}) and accounting does not know them"
                )
        for a, info in found.items():
            if info.workdir:
                self._workdirs[a] = info.workdir
        return found

    def _to_response(self, info: _JobInfo) -> DescribeAppResponse:
        app_state = _app_state(info.state)
        roles: dict[str, RoleStatus] = {}
        counts: dict[str, int] = {}
        for off in sorted(info.components):
            comp = info.components[off]
            role, idx = _split_name(comp.name)
            state = app_state
            exit_code = comp.exit_code
            if comp.step_state is not None:
                step = _app_state(comp.step_state)
                if is_terminal(step):
                    state = step
            elif is_terminal(app_state) and exit_code is not None:
                if app_state != AppState.CANCELLED:
                    state = AppState.SUCCEEDED if exit_code == 0 else AppState.FAILED
            if app_state == AppState.SUCCEEDED and exit_code is None and comp.nodes:
                exit_code = 0
            if not is_terminal(state):
                exit_code = None
            roles.setdefault(role, RoleStatus(role))
            roles[role].replicas.append(
                ReplicaStatus(
                    id=idx, state=state, role=role, hostname=comp.nodes, exit_code=exit_code
                )
            )
            counts[role] = counts.get(role, 0) + 1
        msg = info.state
        if info.reason:
            msg += f" ({info.reason})"
        return DescribeAppResponse(
            app_id=info.app_id,
            state=app_state,
            num_restarts=info.restarts,
            msg=msg,
            structured_error_msg=NONE,
            roles_statuses=list(roles.values()),
            roles=[Role(name=r, image=info.workdir, num_replicas=n) for r, n in counts.items()],
        )

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state, restarts and per-replica states, exit codes and nodes (None if
        Slurm does not know ``app_id``). One ``squeue`` call while the controller knows it."""
        info = self._job_infos([app_id]).get(app_id)
        return self._to_response(info) if info else None

    def describe_many(self, app_ids: Iterable[str]) -> dict[str, DescribeAppResponse | None]:
        """Describes several jobs with one ``squeue`` call (and at most one ``sacct``)."""
        ids = list(app_ids)
        infos = self._job_infos(ids)
        return {a: (self._to_response(infos[a]) if a in infos else None) for a in ids}

    def list(self) -> list[ListAppResponse]:
        """The user's Slurm jobs: those the controller knows plus today's from accounting."""
        out: dict[str, AppState] = {}
        acct = _run(
            ["sacct", "-n", "-P", "-X", f"--delimiter={_SEP}", "-o", "JobID,State"], timeout=60
        )
        if acct.returncode == 0:
            for line in acct.stdout.splitlines():
                job_id, _, state = line.partition(_SEP)
                app_id, _, off = job_id.partition("+")
                if app_id.isdigit() and off in ("", "0"):
                    out[app_id] = _app_state(_slurm_state(state))
        p = _run(["squeue", "-h", "-t", "all", "--me", "-O", _SQUEUE_FORMAT])
        if p.returncode == 0:
            for app_id, info in _parse_squeue(p.stdout).items():
                out[app_id] = _app_state(info.state)
        return [ListAppResponse(app_id=a, state=s) for a, s in sorted(out.items(), key=_id_key)]

    def find_by_idempotency_key(self, key: str) -> str | None:
        """The newest job submitted with idempotency ``key`` (stored in its ``--comment``)."""
        token = _key_token(key)
        p = _run(["squeue", "-h", "-t", "all", "--me", "-O", _SQUEUE_FORMAT])
        if p.returncode == 0:
            hits = [
                int(a)
                for a, info in _parse_squeue(p.stdout).items()
                if _comment_key(info.comment) == token
            ]
            if hits:
                return str(max(hits))
        acct = _run(
            [
                "sacct",
                "-n",
                "-P",
                "-X",
                f"--delimiter={_SEP}",
                "-S",
                "now-30days",
                "-o",
                "JobID,Comment",
            ]
        )
        best: int | None = None
        if acct.returncode == 0:
            for line in acct.stdout.splitlines():
                job_id, _, comment = line.partition(_SEP)
                app_id, _, off = job_id.partition("+")
                if app_id.isdigit() and off in ("", "0") and _comment_key(comment) == token:
                    best = max(best or 0, int(app_id))
        return str(best) if best is not None else None

    # -- cancelling -----------------------------------------------------------------------

    def cancel(self, app_id: str) -> None:
        """Cancels the job with ``scancel`` (every component). Idempotent: cancelling a job
        that ended or that Slurm does not know does nothing."""
        if not _JOB_ID_RE.match(app_id):
            return
        self._cancel_existing(app_id)

    def _cancel_existing(self, app_id: str) -> None:
        p = _run(["scancel", app_id])
        if p.returncode != 0:
            err = p.stderr.strip()
            if "already completing or completed" in err or "Invalid job id" in err:
                log.debug("scancel %s: %s", app_id, err)
                return
            raise RuntimeError(f"scancel {app_id} failed: {err}")

    # -- logs -----------------------------------------------------------------------------

    def _workdir(self, app_id: str) -> str | None:
        if app_id not in self._workdirs:
            self._job_infos([app_id])
        return self._workdirs.get(app_id)

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Lines of ``slurm-<app_id>-<role>-<k>.out`` (stdout, the default) or ``.err``
        (stderr) in the job's directory, found through Slurm. ``since``/``until`` are ignored
        (lines carry no times); with ``should_tail`` it follows the file until the job ends.

        Raises:
            ValueError: for ``streams=combined`` (stdout and stderr are separate files), or if
                Slurm does not know the job.
        """
        stream = check_stream(streams, [Stream.STDOUT, Stream.STDERR])
        workdir = self._workdir(app_id)
        if workdir is None:
            raise ValueError(f"app_id: slurm does not know job {app_id!r}")
        ext = "err" if stream == Stream.STDERR else "out"
        path = os.path.join(workdir, f"slurm-{app_id}-{role_name}-{k}.{ext}")
        lines = _read_lines(path, self._terminal_check(app_id) if should_tail else None)
        return filter_regex(regex, lines)

    def _terminal_check(self, app_id: str) -> Callable[[], bool]:
        def ended() -> bool:
            try:
                desc = self.describe(app_id)
            except RuntimeError as e:  # controller briefly away: keep following
                log.debug("describe %s while tailing: %s", app_id, e)
                return False
            return desc is None or is_terminal(desc.state)

        return ended


def _id_key(item: tuple[str, AppState]) -> int:
    return int(item[0])


def _submit_error(stderr: str, cfg: Mapping[str, CfgVal]) -> Exception:
    low = stderr.lower()
    for key, needle in (
        ("partition", "partition"),
        ("time", "time limit"),
        ("constraint", "feature"),
        ("mail-user", "mail"),
    ):
        if needle in low:
            return ValueError(f"cfg.{key}: sbatch rejected {cfg.get(key)!r}: {stderr}")
    if "memory" in low:
        return ValueError(f"resource.memMB: sbatch rejected the memory request: {stderr}")
    return RuntimeError(f"sbatch failed, nothing was queued: {stderr}")


def _split_chunk(text: str) -> list[str]:
    """Splits ``text`` (ending in ``\\n``) into lines that keep their ``\\n``; only ``\\n``
    ends a line (``\\r`` and other separators stay inside their line)."""
    lines = text.splitlines(True)
    if len(lines) == text.count("\n"):
        return lines
    parts = text.split("\n")
    parts.pop()
    return [p + "\n" for p in parts]


def _read_lines(path: str, ended: Callable[[], bool] | None = None) -> Iterator[str]:
    """Yields the lines of ``path``; with ``ended`` (a callable), follows the file until
    ``ended()`` is true and nothing more arrives. A line is never split across reads."""
    f = None
    buf = ""
    delay = 0.01
    next_check = 0.0
    finishing = False
    try:
        while True:
            if f is None:
                try:
                    f = open(path, encoding="utf-8", errors="replace", newline="")  # noqa: SIM115
                except FileNotFoundError:
                    if ended is None:
                        return
            if f is not None:
                chunk = f.read(_LOG_CHUNK)
                if chunk:
                    if buf:
                        chunk = buf + chunk
                    cut = chunk.rfind("\n") + 1
                    if cut:
                        buf = chunk[cut:]
                        yield from _split_chunk(chunk[:cut] if cut < len(chunk) else chunk)
                    else:
                        buf = chunk
                    delay = 0.01
                    continue
            if ended is None or finishing:
                break
            now = time.monotonic()
            if now >= next_check:
                if ended():
                    finishing = True  # one more read: what was written before the job ended
                    continue
                next_check = now + 1.0
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        if buf:
            yield buf
    finally:
        if f is not None:
            f.close()


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    """The ``slurm`` scheduler factory (entry point ``shipyard.schedulers``)."""
    return SlurmScheduler(session_name, **kwargs)
