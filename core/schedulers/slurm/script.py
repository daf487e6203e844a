"""The batch script of an app: one heterogeneous-job component per replica, one ``srun``.

Replicas' environment values never reach a command line (``ps`` shows every process's argv to
every user): the script exports each value under a private name, and each component's command
starts with a small ``/bin/sh -c`` prelude that copies those names to the real ones and drops
the private ones. The script itself is readable by its owner only (Slurm keeps it in its state
directory; a ``job_dir`` copy is written with mode 0600).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.limits import ATTEMPT_ENV, CHECKPOINT_DIR_ENV
from core.reports import RESULT_FILE_ENV
from core.schedulers.slurm.images import Image
from core.specs import CfgVal, Role, macros

__all__ = [
    "EXCLUDE_MARK",
    "RANK0_ENV",
    "SBATCH_JOB_OPTIONS",
    "SlurmBatchRequest",
    "SlurmReplicaRequest",
    "comment_key",
    "key_mark",
]

#: cfg options passed to ``sbatch`` for every component of the job
SBATCH_JOB_OPTIONS: tuple[str, ...] = (
    "partition",
    "time",
    "comment",
    "constraint",
    "mail-user",
    "mail-type",
    "dependency",
)

#: the environment variable, set in every replica, that names the node of replica 0 of role 0
#: (that replica is not always component 0: see :meth:`SlurmBatchRequest.order_components`)
RANK0_ENV = "SHIPYARD_RANK0_HOST"
#: the batch shell's own warning before the time limit when there is no checkpoint signal to
#: pass on (``requeue_on_timeout`` needs one): never forwarded to the replicas
WARN_SIGNAL = "USR2"

_APP_ID_EXPR = '"$SLURM_JOB_ID"'  # the app id is the het job's (leader's) id, known at run time
# a native array's task: Slurm's own J_i
_TASK_APP_ID_EXPR = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
_RESULT_DIR = "SHIPYARD_RESULT_DIR"
#: ``${array_index}`` (a native array task's index) and ``${shipyard_value_N}`` (the value of
#: this task in :attr:`SlurmBatchRequest.array_values`): run-time values, as ``${app_id}``
_RUNTIME_RE = re.compile(r"\$\{(app_id|array_index|shipyard_value_[0-9]+)\}")
_RUNTIME_EXPR = {"array_index": '"$SLURM_ARRAY_TASK_ID"'}


def array_value_macro(n: int) -> str:
    """The placeholder of the ``n``-th per-task value of a native array (see
    :attr:`SlurmBatchRequest.array_values`)."""
    return f"${{shipyard_value_{n}}}"


def result_dir_name(job_id: str) -> str:
    """The directory, in the job's working directory, where its replicas' results go (each
    ``<role>-<k>.json``; a file ``all`` says every replica's is collected)."""
    return f"shipyard-results-{job_id}"


_KEY_MARK = "shipyard-key="
#: the word in a job's comment that asks to keep its requeues off failed nodes (``.nodefail``)
EXCLUDE_MARK = "shipyard-exclude-failed"
#: sbatch options of the whole job, not of one het component: the leader (component 0) has them
JOB_WIDE = ("requeue", "no-requeue", "open-mode", "signal")
_LOST_MARK = "shipyard-lost="
_KEY_IN_COMMENT_RE = re.compile(r"(?:^|\s)shipyard-key=(\S+)")
_SAFE_KEY_RE = re.compile(r"^[A-Za-z0-9_.:@+-]{1,100}$")
_SAFE_SBATCH_RE = re.compile(r"^[A-Za-z0-9_.,:/@%+=-]+$")


def shell_quote(value: str, app_id_expr: str = _APP_ID_EXPR) -> str:
    """Quotes ``value`` for bash, turning ``${app_id}`` into the job id at run time (and a
    native array's ``${array_index}`` and per-task values into theirs)."""
    parts = _RUNTIME_RE.split(value)
    if len(parts) == 1:
        return shlex.quote(value)
    out = []
    for i, p in enumerate(parts):
        if i % 2 == 0:
            out.append(shlex.quote(p) if p else "")
        elif p == "app_id":
            out.append(app_id_expr)
        else:
            out.append(_RUNTIME_EXPR.get(p) or f'"${p.upper()}"')
    return "".join(out)


def _sbatch_value(value: str) -> str:
    """Quotes a value for sbatch's own ``#SBATCH`` line parser (which honours ``"`` and ``\\``)."""
    if _SAFE_SBATCH_RE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def key_token(key: str) -> str:
    """How an idempotency key is stored in the job's comment (hashed unless plainly safe)."""
    if _SAFE_KEY_RE.fullmatch(key):
        return key
    import hashlib  # (lazily: OpenSSL takes ~3 ms to load, a start-up cost)

    return "sha256-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def key_mark(key: str) -> str:
    """The comment word that carries idempotency ``key``."""
    return _KEY_MARK + key_token(key)


def lost_comment(comment: str) -> str:
    """``comment`` with its key word turned into the mark of a submission that lost the race
    for its key (so that nothing finds it by the key again)."""
    return comment.replace(_KEY_MARK, _LOST_MARK)


def comment_key(comment: str) -> str | None:
    """The idempotency-key token stored in a job comment, if any."""
    found = _KEY_IN_COMMENT_RE.findall(comment)
    return found[-1] if found else None


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
    #: ``srun``'s container options, shell words (``container_runtime``: ``--container=``...)
    container_opts: list[str] = field(default_factory=list)

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
        if "dependency" in sbatch_opts:  # one that can never be met ends the job (not PENDING)
            sbatch_opts["kill-on-invalid-dep"] = "yes"
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

    def sbatch_group(self) -> list[str]:
        """The ``#SBATCH`` option tokens of this component, quoted for sbatch's parser."""
        return [
            f"--{k}" if v is None else f"--{k}={_sbatch_value(v)}"
            for k, v in self.sbatch_opts.items()
        ]

    def env_exports(self, index: int, app_id_expr: str = _APP_ID_EXPR) -> list[str]:
        """Script lines exporting this replica's environment values under private names."""
        return [
            f"export {_private_name(index, i)}={shell_quote(v, app_id_expr)}"
            for i, v in enumerate(self.env.values())
        ]

    def srun_group(
        self, index: int, all_private: list[str], app_id_expr: str = _APP_ID_EXPR
    ) -> list[str]:
        """The ``srun`` tokens of this component (quoted for bash): options, then a ``sh -c``
        prelude that sets the replica's variables from their private names (values never in
        argv), drops every component's private names, and runs the command."""
        srun = [f"--{k}={shell_quote(v, app_id_expr)}" for k, v in self.srun_opts.items()]
        srun += self.container_opts
        sets = [f'{k}="${_private_name(index, i)}"' for i, k in enumerate(self.env)]
        sets.append(f'{RESULT_FILE_ENV}="${_RESULT_DIR}/{self.name}.json"')
        prelude = f"export {' '.join(sets)}; " + (
            f"unset {' '.join(all_private)}; " if all_private else ""
        )
        cmd = [self.entrypoint, *self.args]
        if ":" in cmd:
            # srun splits its command line at every bare ":" (the het-job separator), even
            # among the program's arguments: such a command is part of the sh -c string
            inner = " ".join(shell_quote(c, '"$SHIPYARD_APP_ID"') for c in cmd)
            return [*srun, "/bin/sh", "-c", shlex.quote(f"{prelude}exec {inner}")]
        body = shlex.quote(f'{prelude}exec "$@"')
        args = (shell_quote(c, app_id_expr) for c in cmd)
        return [*srun, "/bin/sh", "-c", body, "shipyard-replica", *args]

    def private_names(self, index: int) -> list[str]:
        """The private names :meth:`env_exports` uses."""
        return [_private_name(index, i) for i in range(len(self.env))]

    def materialize(self) -> tuple[list[str], list[str]]:
        """The ``#SBATCH`` group and the ``srun`` group of this replica as component 0 of a
        job of its own (see :meth:`SlurmBatchRequest.materialize`)."""
        return self.sbatch_group(), self.srun_group(0, self.private_names(0))


def _private_name(component: int, index: int) -> str:
    return f"SHIPYARD_ENV_{component}_{index}"


@dataclass
class SlurmBatchRequest:
    """A whole app for ``sbatch``: the command, the replicas (in het-component order), the
    directory the job runs in (None: the current one, or the cluster's ``remote_dir``) and how
    often a failed job is requeued."""

    cmd: list[str]
    replicas: dict[str, SlurmReplicaRequest]
    job_dir: str | None
    max_retries: int
    app_name: str = ""
    #: the replica whose node is the app's rank 0 (default: the first)
    rank0: str = ""
    #: the named cluster the job goes to (None: this host's Slurm)
    cluster: str | None = None
    #: the directory of the cluster's Slurm commands, if not on the job's ``PATH``
    slurm_bin: str | None = None
    #: the idempotency key's token (see :func:`key_token`), also in every component's comment
    key: str | None = None
    #: whose results are collected: ``first`` (replica 0 of each role) or ``all``
    result_replicas: str = "first"
    #: the signal (``USR1``) that ``--signal=B:...`` sends the batch shell before the time
    #: limit: the script passes it on to every replica (through ``srun``)
    checkpoint_signal: str | None = None
    #: a native array (``sbatch --array``): its tasks, e.g. ``0-999%4`` (one component only)
    array: str | None = None
    #: a native array's per-task values: ``array_values[n][i]`` is what
    #: :func:`array_value_macro` ``(n)`` stands for in task ``i``
    array_values: list[dict[int, str]] = field(default_factory=list)
    #: how often a preempted job, or one whose node failed, may be requeued (by Slurm: the
    #: script turns the job's requeue off on its last allowed attempt)
    max_requeues: int = 0
    #: ``requeue_on_timeout``: seconds from the warning before the time limit to the requeue
    timeout_requeue_in: int | None = None
    #: the job turns its own requeue off as it starts (for a submission that cannot ask for
    #: ``--no-requeue``: slurmrestd's v0.0.38 API ignores ``requeue: false``)
    requeue_off_in_script: bool = False
    #: script lines that make the replicas' container bundles (``containers.bundle_lines``)
    container_setup: list[str] = field(default_factory=list)
    #: the Docker images to put on the cluster before submitting, and where
    #: (``containers.stage``)
    images: list[Image] = field(default_factory=list)
    oci_dir: str = ""

    def order_components(self) -> None:
        """Puts the replicas that ask for no memory first: sbatch carries ``--mem`` from one
        het component to the next one that does not set it, and the only way to say "no
        request" after one that asked is ``--mem=0``, which claims whole nodes where memory is
        tracked. A later component without GPUs after one with them gets
        ``--gpus-per-task=0`` (asks for none, as it should). Options of the whole job
        (:data:`JOB_WIDE`) move to the component that comes first, the het job's leader, whose
        batch shell they concern."""
        self.rank0 = self.rank0 or next(iter(self.replicas), "")
        ordered = sorted(self.replicas.values(), key=lambda r: "mem" in r.sbatch_opts)
        job_wide = {
            k: r.sbatch_opts.pop(k) for r in ordered for k in JOB_WIDE if k in r.sbatch_opts
        }
        ordered[0].sbatch_opts.update(job_wide)
        seen_gpu = False
        for rep in ordered:
            if "gpus-per-task" in rep.sbatch_opts:
                seen_gpu = True
            elif seen_gpu:
                rep.sbatch_opts["gpus-per-task"] = "0"
        self.replicas = {r.name: r for r in ordered}

    def materialize(self) -> str:
        """The batch script (pass it to ``sbatch`` on stdin): every replica is one het-job
        component."""
        reps = list(self.replicas.values())
        names = list(self.replicas)
        rank0 = names.index(self.rank0) if self.rank0 in self.replicas else 0
        private = [n for i, r in enumerate(reps) for n in r.private_names(i)]
        lines = self._header(len(reps))
        app_expr = _TASK_APP_ID_EXPR if self.array else _APP_ID_EXPR
        for i, rep in enumerate(reps):
            if i:
                lines.append("#SBATCH hetjob")
            array = [f"--array={self.array}"] if self.array and not i else []
            lines.append("#SBATCH " + " ".join([*rep.sbatch_group(), *array]))
        lines += [
            "",
            "export PYTHONUNBUFFERED=1",
            "export SLURM_UNBUFFEREDIO=1",
            *([f'export PATH={shlex.quote(self.slurm_bin)}:"$PATH"'] if self.slurm_bin else []),
            f"# the node of rank 0 ({self.rank0 or names[0]}: het component {rank0}; a job of one"
            " component is not heterogeneous)",
            f'export {RANK0_ENV}="${{SLURM_JOB_NODELIST_HET_GROUP_{rank0}:-$SLURM_JOB_NODELIST}}"',
            *self._first_attempt(app_expr),
            "# results ($SHIPYARD_RESULT_FILE) and a memory sample every second (sacct MaxRSS)",
            f'export {_RESULT_DIR}="$PWD/{result_dir_name(app_expr.strip(chr(34)))}"',
            f'mkdir -p "${_RESULT_DIR}"'
            + (f' && : > "${_RESULT_DIR}/all"' if self.result_replicas == "all" else ""),
            'export SLURM_ACCTG_FREQ="${SLURM_ACCTG_FREQ:-task=1}"',
            "# the attempt (a requeued job keeps its id) and a checkpoint directory kept across them",
            f'export {ATTEMPT_ENV}="${{SLURM_RESTART_COUNT:-0}}"',
            f'export {CHECKPOINT_DIR_ENV}="$PWD/shipyard-checkpoint-{app_expr.strip(chr(34))}"',
            f'mkdir -p "${CHECKPOINT_DIR_ENV}"',
        ]
        lines += self._array_values()
        lines += self._requeue_setup(app_expr)
        lines += self.container_setup
        lines.append("# the replicas' environment, kept out of every command line")
        for i, rep in enumerate(reps):
            lines += rep.env_exports(i, app_expr)
        if len(reps) > 1:
            lines += [
                "# srun refuses components that mix the cluster's DefMemPerCPU with --mem; those"
                " without a request get their allocation's memory",
                "unset $(compgen -v SLURM_MEM_PER_CPU)",
            ]
        lines += ["", "srun \\"]
        for i, rep in enumerate(reps):
            if i:
                lines.append("  : \\")
            tail = " \\" if i < len(reps) - 1 else ""
            lines.append("    " + " ".join(rep.srun_group(i, private, app_expr)) + tail)
        if self._warned:
            lines[-1] += " &"
        lines += self._srun_end()
        if self.max_retries > 0:
            lines += [
                f"# max_retries={self.max_retries}: a failed attempt requeues the whole job",
                'if [ "$exitcode" -ne 0 ] && [ "$shipyard_retries" -lt'
                f" {int(self.max_retries)} ]; then",
                '    echo "shipyard: attempt $SHIPYARD_ATTEMPT failed with exit code $exitcode,'
                ' requeueing job $SLURM_JOB_ID" >&2',
                '    echo retry >>"$shipyard_retries_file"',
                '    scontrol update JobId="$SLURM_JOB_ID" Requeue=1',
                '    scontrol requeue "$SLURM_JOB_ID"',
                "fi",
            ]
        lines += ['exit "$exitcode"', ""]
        return "\n".join(lines)

    def _header(self, n_replicas: int) -> list[str]:
        """The script's opening comment: what it runs, how to submit it, where its logs go."""
        return [
            "#!/bin/bash",
            "#",
            f"# Shipyard app {self.app_name or '(unnamed)'}: {n_replicas} replica(s), one"
            " heterogeneous-job component each"
            + (
                f"; array tasks {self.array} (one app each: <job id>_<task>)."
                if self.array
                else "."
            ),
            "# Submit with: sbatch --parsable <this file>",
            "# Logs: slurm-<job id>-<role>-<replica id>.out and .err in the job's directory.",
            "#",
        ]

    def _first_attempt(self, app_expr: str) -> list[str]:
        """On the first attempt, clears what an earlier job of the same id left in this
        directory (another cluster sharing it, or a controller whose ids started again): logs
        are opened for appending (a requeue keeps its earlier lines), so stale lines would mix
        in, and stale results or retry counts would be taken for this job's."""
        job = app_expr.strip(chr(34))
        logs = [
            ": >" + shell_quote(rep.srun_opts[k], app_expr)
            for rep in self.replicas.values()
            for k in ("output", "error")
            if k in rep.srun_opts
        ]
        ckpt = f'"$PWD/shipyard-checkpoint-{job}"'
        return [
            "# a first attempt starts clean: an earlier job of this id may have left files here",
            'if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then',
            f'    rm -rf "$PWD/{result_dir_name(job)}" "$PWD/shipyard-retries-{job}"',
            *(f"    {line}" for line in logs),
            f'    [ ! -e {ckpt} ] || mv -T {ckpt} {ckpt[:-1]}.earlier-$(date +%s)"',
            "fi",
        ]

    @property
    def _warned(self) -> bool:
        """Whether the batch shell takes a signal before the time limit (and so runs ``srun``
        in the background to be free to take it)."""
        return self.checkpoint_signal is not None or self.timeout_requeue_in is not None

    def _requeue_setup(self, app_expr: str) -> list[str]:
        """Counts this attempt's earlier retries and requeues; on the last attempt that
        ``max_requeues`` allows, turns the job's requeue off (a preemption or a node failure
        then ends it)."""
        if not (self.max_retries or self.max_requeues):
            if not self.requeue_off_in_script:
                return []
            return [
                "# not to be requeued (sbatch --no-requeue could not be asked for)",
                'scontrol update JobId="$SLURM_JOB_ID" Requeue=0 ||'
                ' echo "shipyard: could not turn the requeue of job $SLURM_JOB_ID off" >&2',
            ]
        name = f"shipyard-retries-{app_expr.strip(chr(34))}"
        return [
            "# Slurm's restart count spans requeues (preemption, node failure, time limit) and",
            "# retries (max_retries): each retry is one line of this file",
            f'shipyard_retries_file="$PWD/{name}"',
            'shipyard_retries=$(grep -c . "$shipyard_retries_file" 2>/dev/null)',
            "shipyard_requeues=$(( ${SLURM_RESTART_COUNT:-0} - ${shipyard_retries:=0} ))",
            f'if [ "$shipyard_requeues" -ge {int(self.max_requeues)} ]; then',
            f"    # no requeue left (max_requeues={self.max_requeues}): a preemption or a node"
            " failure ends the job",
            '    scontrol update JobId="$SLURM_JOB_ID" Requeue=0 ||'
            ' echo "shipyard: could not turn the requeue of job $SLURM_JOB_ID off" >&2',
            "fi",
        ]

    def _srun_end(self) -> list[str]:
        """The lines after the ``srun`` command: its exit code; with a checkpoint signal,
        ``srun`` runs in the background so that the batch shell can take the signal and pass
        it on (``srun`` forwards it to every task) while it waits."""
        if not self._warned:
            return ["exitcode=$?", ""]
        sig = self.checkpoint_signal or WARN_SIGNAL
        return [
            "srun_pid=$!",
            f"# the warning before the time limit (sbatch --signal=B:{sig}@...) reaches this"
            " shell only",
            "shipyard_at_limit() {",
            *self._at_limit(),
            "}",
            f"trap shipyard_at_limit {sig}",
            'wait "$srun_pid"; exitcode=$?',
            "# past 128: the trap cut the wait short (wait again), or srun's own signal (127 next)",
            'while [ "$exitcode" -gt 128 ]; do',
            '    wait "$srun_pid"; next=$?',
            '    [ "$next" -eq 127 ] && break',
            "    exitcode=$next",
            "done",
            *self._requeue_now(),
            "",
        ]

    def _at_limit(self) -> list[str]:
        """The body of the batch shell's trap of the warning before the time limit."""
        body = []
        if self.checkpoint_signal is not None:
            sig = self.checkpoint_signal
            body += [
                f'    echo "shipyard: checkpoint signal {sig}" >&2',
                f'    kill -{sig} "$srun_pid"',
            ]
        if self.timeout_requeue_in is not None:
            delay = int(self.timeout_requeue_in)
            body += [
                f'    [ "$shipyard_requeues" -lt {int(self.max_requeues)} ] || return 0',
                f'    echo "shipyard: time limit near: requeueing job $SLURM_JOB_ID in {delay} s"'
                " >&2",
                f'    (sleep {delay}; scontrol requeue "$SLURM_JOB_ID") &',
                "    shipyard_requeue_pid=$!",
            ]
        return body

    def _requeue_now(self) -> list[str]:
        """With a time-limit requeue on its way: replicas that ended without success after
        the warning are requeued at once (the requeue is not a retry)."""
        if self.timeout_requeue_in is None:
            return []
        return [
            'if [ -n "${shipyard_requeue_pid:-}" ]; then',
            '    kill "$shipyard_requeue_pid" 2>/dev/null',
            '    if [ "$exitcode" -ne 0 ]; then scontrol requeue "$SLURM_JOB_ID"; exit "$exitcode"; fi',
            "fi",
        ]

    def _array_values(self) -> list[str]:
        """The lines that set this task's values of a native array (``SHIPYARD_VALUE_n``)."""
        if not self.array_values:
            return []
        lines = ["# this array task's values", 'case "$SLURM_ARRAY_TASK_ID" in']
        for i in sorted(set().union(*self.array_values)):
            sets = [
                f"SHIPYARD_VALUE_{n}={shlex.quote(values[i])}"
                for n, values in enumerate(self.array_values)
                if i in values
            ]
            lines.append(f"  {i}) export {' '.join(sets)} ;;")
        lines.append("esac")
        return lines

    def __str__(self) -> str:
        return self.materialize()
