"""What Slurm says about a job, whatever the transport: :class:`JobInfo` (one per app, one
:class:`Component` per het-job component) parsed from ``squeue``/``sacct`` text here and from
slurmrestd's JSON in the REST modules, and turned into a :class:`DescribeAppResponse`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.schedulers.api import DescribeAppResponse
from core.specs import (
    NONE,
    AppState,
    Attempt,
    Reason,
    ReplicaStatus,
    ResourceUsage,
    Role,
    RoleStatus,
    is_terminal,
)

__all__ = [
    "SACCT_FIELDS",
    "SEP",
    "SLURM_STATES",
    "SQUEUE_FORMAT",
    "Component",
    "JobInfo",
    "Usage",
    "app_state",
    "array_query_ids",
    "expand_task_ids",
    "parse_sacct",
    "parse_squeue",
    "slurm_state",
    "task_app_id",
    "task_ranges",
    "to_response",
]

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

SEP = "\x1f"  # field separator for squeue/sacct output: cannot occur in validated values
SQUEUE_FIELDS = (
    "HetJobID",
    "HetJobOffset",
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "RestartCnt",
    "DerivedEC",
    "Name",
    "NodeList",
    "WorkDir",
    "Reason",
    "Comment",  # last: free text
)
SQUEUE_FORMAT = ",".join(f"{f}:{SEP}" for f in SQUEUE_FIELDS)
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "WorkDir", "Comment")


#: an ended job's usage by component name (``role-k``): what it used, and its step's state
Usage = dict[str, tuple[ResourceUsage, str]]


@dataclass
class Component:
    """One het-job component (one replica) as Slurm reports it."""

    offset: int
    name: str
    state: str
    nodes: str = ""
    exit_code: int | None = None
    step_state: str | None = None


@dataclass
class JobInfo:
    """One app (a het job, or a job of one component) as Slurm reports it."""

    app_id: str
    state: str
    restarts: int = 0
    reason: str = ""
    workdir: str = ""
    comment: str = ""
    components: dict[int, Component] = field(default_factory=dict)
    source: str = "squeue"
    #: the array job's id when this is one task of a native Slurm array (app id ``J_i``)
    array_job: str = ""
    #: the ended attempts before the current one (from accounting: the controller keeps none)
    attempts: list[Attempt] = field(default_factory=list)
    #: its replicas' usage, when accounting was read for it anyway (``None``: not read)
    usage: Usage | None = None

    @property
    def submit_id(self) -> str:
        """The id its ``sbatch`` returned: the array job's for an array task, else the app's."""
        return self.array_job or self.app_id

    @property
    def held(self) -> bool:
        """True while the job waits for a release (submitted held, or held by its user)."""
        return self.state == "PENDING" and self.reason == "JobHeldUser"


def slurm_state(raw: str) -> str:
    """A state as Slurm prints it (``CANCELLED by 0``, ``RUNNING+``) reduced to its name."""
    return raw.strip().split(" ")[0].rstrip("+").upper() if raw.strip() else "UNKNOWN"


#: Slurm states that say why a job or step ended better than its exit code
SLURM_REASONS = {
    "BOOT_FAIL": Reason.NODE_FAILURE,
    "CANCELLED": Reason.CANCELLED,
    "DEADLINE": Reason.TIMEOUT,
    "NODE_FAIL": Reason.NODE_FAILURE,
    "OUT_OF_MEMORY": Reason.OOM,
    "PREEMPTED": Reason.PREEMPTED,
    "TIMEOUT": Reason.TIMEOUT,
}


def app_state(state: str) -> AppState:
    """The app state of a Slurm state name."""
    return SLURM_STATES.get(state, AppState.UNKNOWN)


def wait_status_code(raw: str | int) -> int | None:
    """squeue's DerivedEC as an exit code (-N for signal N): a raw wait status in Slurm 22.05
    (``768``), ``code:signal`` in today's releases (26.05: ``3:0``)."""
    if isinstance(raw, str) and ":" in raw:
        return colon_code(raw)
    try:
        status = int(raw)
    except ValueError:
        return None
    if status & 0x7F:
        return -(status & 0x7F)
    return (status >> 8) & 0xFF


def colon_code(raw: str) -> int | None:
    """sacct's ``code:signal`` as an exit code (-N for signal N)."""
    code, _, sig = raw.partition(":")
    try:
        signal = int(sig or 0)
        return -signal if signal else int(code)
    except ValueError:
        return None


def split_name(name: str) -> tuple[str, int]:
    """``role-3`` -> ``("role", 3)``: a component's job name is its replica's name."""
    role, _, idx = name.rpartition("-")
    if role and idx.isdigit():
        return role, int(idx)
    return name, 0


_TASKS_RE = re.compile(r"^\[?([0-9,\-]+)(?:%[0-9]+)?\]?$")


def expand_task_ids(text: str) -> list[int]:
    """The array task indices of Slurm's compact form (``2-5%2``, ``[1,3,7-9]``)."""
    m = _TASKS_RE.fullmatch(text.strip())
    if not m:
        return []
    out: list[int] = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def task_ranges(indices: list[int]) -> str:
    """The inverse of :func:`expand_task_ids` (without a cap): ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    n = len(indices)
    if (
        n > 1
        and indices[-1] - indices[0] == n - 1
        and indices == list(range(indices[0], n + indices[0]))
    ):
        return f"{indices[0]}-{indices[-1]}"  # (a whole array: its first submission)
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indices)):
        if run and i != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def array_query_ids(app_ids: list[str]) -> list[str]:
    """The job ids to ask Slurm about for ``app_ids``: an array task ``J_i`` is asked for as its
    array job ``J`` (one answer holds every task), each id once."""
    return list(dict.fromkeys(a.partition("_")[0] for a in app_ids))


def task_app_id(array_job: str, task: int) -> str:
    """The app id of one task of a native array: Slurm's own ``J_i``."""
    return f"{array_job}_{task}"


def add_controller_row(
    jobs: dict[str, JobInfo],
    app_id: str,
    off: int,
    row: dict[str, str],
    array_job: str = "",
) -> None:
    """Adds one controller record of component ``off`` of ``app_id`` to ``jobs``. ``row`` has
    ``state``, ``restarts``, ``derived``, ``name``, ``nodes``, ``workdir``, ``reason`` and
    ``comment`` as strings (how squeue and slurmrestd both report a component); ``array_job``:
    the array job's id if ``app_id`` is an array task."""
    state = slurm_state(row["state"])
    info = jobs.get(app_id)
    if info is None or off == 0:
        if info is None:
            info = jobs[app_id] = JobInfo(app_id=app_id, state=state, array_job=array_job)
        info.state = state
        info.restarts = int(row["restarts"]) if row["restarts"].isdigit() else 0
        info.reason = "" if row["reason"] in ("None", "(null)") else row["reason"]
        info.workdir = row["workdir"]
        info.comment = "" if row["comment"] == "(null)" else row["comment"]
    info.components[off] = Component(
        offset=off,
        name=row["name"],
        state=state,
        nodes=row["nodes"],
        exit_code=_controller_exit_code(state, row),
    )


def add_controller_rows(
    jobs: dict[str, JobInfo],
    app_id: str,
    off: int,
    row: dict[str, str],
    array_job: str = "",
    tasks: list[int] | None = None,
) -> None:
    """Adds one controller record (see :func:`add_controller_row`): of component ``off`` of
    ``app_id``, or of each array task in ``tasks`` (the tasks still pending share one record)."""
    if not tasks:
        add_controller_row(jobs, app_id, off, row)
    for t in tasks or []:
        add_controller_row(jobs, task_app_id(array_job, t), 0, row, array_job)


def _controller_exit_code(state: str, row: dict[str, str]) -> int | None:
    """A component's exit code as the controller knows it; none if it never ran or while it
    runs. DerivedEC is the highest exit code of the component's steps in *every* attempt of a
    requeued job: a completed job's last attempt exited 0 everywhere, but for a failed one it is
    only the best guess the controller has (accounting has each attempt's own)."""
    if not is_terminal(app_state(state)) or not row["nodes"]:
        return None
    if state == "COMPLETED" and row["restarts"] not in ("", "0"):
        return 0
    return wait_status_code(row["derived"])


def parse_squeue(out: str) -> dict[str, JobInfo]:
    """Parses ``squeue -O SQUEUE_FORMAT`` rows (one per het-job component) into jobs keyed by
    app id."""
    jobs: dict[str, JobInfo] = {}
    n = len(SQUEUE_FIELDS)
    for line in out.splitlines():
        parts = line.split(SEP)
        if len(parts) < n:
            continue
        het_id, offset, job_id, array_job, task, state, restarts, derived, name, nodes = (
            p.strip() for p in parts[:10]
        )
        workdir, reason = parts[10].strip(), parts[11].strip()
        comment = SEP.join(parts[n - 1 :]).rstrip(SEP)
        if het_id.isdigit() and het_id != "0":
            app_id, off = het_id, int(offset) if offset.isdigit() else 0
        else:  # a job of one component is not heterogeneous
            app_id, off = job_id, 0
        tasks = expand_task_ids(task) if array_job.isdigit() and array_job != "0" else []
        row = {
            "state": state,
            "restarts": restarts,
            "derived": derived,
            "name": name,
            "nodes": nodes,
            "workdir": workdir,
            "reason": reason,
            "comment": comment,
        }
        if not tasks:
            add_controller_row(jobs, app_id, off, row)
        for t in tasks:  # (one row per task with squeue -r; a pending range without it)
            add_controller_row(jobs, task_app_id(array_job, t), 0, row, array_job)
    return jobs


class AccountingParser:
    """Builds jobs from accounting records in the order ``sacct -D`` gives them: a requeued job
    has one allocation record per attempt, each followed by its steps; the last attempt's
    records win."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobInfo] = {}
        self._attempts: dict[str, int] = {}
        self._leader_state: dict[str, str] = {}

    def allocation(self, app_id: str, off: int, rec: dict[str, str], array_job: str = "") -> None:
        """A component's allocation record (``name``, ``state``, ``nodes``, ``workdir``,
        ``comment``): starts a new attempt of it (``array_job``: of an array task)."""
        info = self.jobs.setdefault(
            app_id, JobInfo(app_id=app_id, state="UNKNOWN", source="sacct", array_job=array_job)
        )
        state = slurm_state(rec["state"])
        if off == 0 and self._leader_state.get(app_id, "REQUEUED") not in _REQUEUED_STATES:
            # the previous record ended without a requeue: it was another job whose id was
            # reused (the controller's job ids were reset); only the newest counts
            info.components.clear()
            info.attempts.clear()
            self._attempts[app_id] = 0
        elif off == 0 and app_id in self._attempts:  # the previous attempt was requeued
            info.attempts.append(_ended_attempt(self._attempts[app_id] - 1, info))
        nodes = rec["nodes"]
        info.components[off] = Component(
            offset=off,
            name=rec["name"],
            state=state,
            nodes="" if nodes in ("None assigned", "(null)") else nodes,
        )
        if off == 0:
            self._attempts[app_id] = self._attempts.get(app_id, 0) + 1
            self._leader_state[app_id] = state
            info.state = state
            info.workdir = rec["workdir"]
            info.comment = rec["comment"]

    def step(self, app_id: str, off: int, state: str, exit_code: int | None) -> None:
        """An ``srun`` step of component ``off``: the replica itself."""
        info = self.jobs.get(app_id)
        if info is not None and off in info.components:
            comp = info.components[off]
            comp.step_state = slurm_state(state)
            comp.exit_code = exit_code

    def record(
        self,
        app_id: str,
        off: int,
        rec: dict[str, str],
        steps: list[tuple[str, int | None]],
        array_job: str = "",
        tasks: list[int] | None = None,
    ) -> None:
        """One allocation record with its ``srun`` steps (state, exit code): of component
        ``off`` of ``app_id``, or of each array task in ``tasks``."""
        for one in [task_app_id(array_job, t) for t in tasks or []] or [app_id]:
            self.allocation(one, off, rec, array_job)
            for state, exit_code in steps:
                self.step(one, off, state, exit_code)

    def result(self) -> dict[str, JobInfo]:
        """The jobs, with their restart counts."""
        for app_id, count in self._attempts.items():
            self.jobs[app_id].restarts = max(0, count - 1)
        return self.jobs


#: how an attempt that was followed by another one may have ended (a preempted job, or one
#: whose node failed, is requeued in place when it may be)
_REQUEUED_STATES = frozenset({"REQUEUED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})


def _ended_attempt(number: int, info: JobInfo) -> Attempt:
    """Attempt ``number`` of a job, from its records so far (its last attempt's)."""
    comps = [info.components[o] for o in sorted(info.components)]
    reason = SLURM_REASONS.get(info.state)
    if reason is None:  # requeued by the job itself: a replica that failed (a retry), or not
        failed = [c.step_state for c in comps if c.step_state in ("FAILED", "OUT_OF_MEMORY")]
        reason = SLURM_REASONS.get(failed[0], Reason.EXIT_CODE) if failed else None
    nodes = ",".join(dict.fromkeys(c.nodes for c in comps if c.nodes))
    return Attempt(number, info.state, reason, nodes)


def parse_sacct(out: str) -> dict[str, JobInfo]:
    """Parses ``sacct -D -P --delimiter=SEP -o SACCT_FIELDS`` rows."""
    parser = AccountingParser()
    n = len(SACCT_FIELDS)
    for line in out.splitlines():
        parts = line.split(SEP)
        if len(parts) < n:
            continue
        job_id, name, state, exit_code, nodes, workdir = parts[: n - 1]
        comment = SEP.join(parts[n - 1 :])
        alloc, _, step = job_id.partition(".")
        app_id, _, off_s = alloc.partition("+")
        array_job, _, task = app_id.partition("_")
        if not array_job.isdigit():
            continue
        off = int(off_s) if off_s.isdigit() else 0
        ids = [task_app_id(array_job, t) for t in expand_task_ids(task)] if task else [app_id]
        for one in ids:  # (tasks that never started share one record: J_[2-5%2])
            if not step:
                rec = {"name": name, "state": state, "nodes": nodes, "workdir": workdir}
                parser.allocation(one, off, {**rec, "comment": comment}, array_job if task else "")
            elif step.isdigit():
                parser.step(one, off, state, colon_code(exit_code))
    return parser.result()


def to_response(info: JobInfo, app_id: str | None = None) -> DescribeAppResponse:
    """The :class:`DescribeAppResponse` of a job (``app_id``: the id it is known by, e.g. with
    its cluster's name; default the job id)."""
    state = app_state(info.state)
    if is_terminal(state) and not all(
        is_terminal(app_state(c.state)) for c in info.components.values()
    ):
        # a het job's leader ended while another component is still COMPLETING: that one's
        # exit code is not final yet, so the job is not either
        state = AppState.RUNNING
    roles: dict[str, RoleStatus] = {}
    for off in sorted(info.components):
        comp = info.components[off]
        role, idx = split_name(comp.name)
        roles.setdefault(role, RoleStatus(role))
        roles[role].replicas.append(_replica_status(comp, state, role, idx))
    job_reason = SLURM_REASONS.get(info.state) if is_terminal(state) else None
    if state == AppState.CANCELLED and info.reason == "DependencyNeverSatisfied":
        job_reason = Reason.DEPENDENCY  # (--kill-on-invalid-dep)
    for rs in roles.values():
        rs.replicas.sort(key=lambda r: r.id)
        for r in rs.replicas:  # (a job's timeout or preemption cancels its steps: say why)
            if job_reason not in (None, Reason.CANCELLED) and r.state != AppState.SUCCEEDED:
                r.reason = job_reason
    msg = info.state
    if info.reason:
        msg += f" ({info.reason})"
    return DescribeAppResponse(
        app_id=app_id or info.app_id,
        state=state,
        reason=job_reason,
        num_restarts=info.restarts,
        attempts=list(info.attempts),
        msg=msg,
        structured_error_msg=NONE,
        roles_statuses=list(roles.values()),
        roles=[
            Role(name=r, image=info.workdir, num_replicas=len(rs.replicas))
            for r, rs in roles.items()
        ],
    )


def _replica_status(comp: Component, job_state: AppState, role: str, idx: int) -> ReplicaStatus:
    state = job_state
    exit_code = comp.exit_code
    if comp.step_state is not None:
        step = app_state(comp.step_state)
        if is_terminal(step):
            state = step
    elif is_terminal(job_state) and exit_code is not None and job_state != AppState.CANCELLED:
        state = AppState.SUCCEEDED if exit_code == 0 else AppState.FAILED
    if job_state == AppState.SUCCEEDED and exit_code is None and comp.nodes:
        exit_code = 0
    if not is_terminal(state):
        exit_code = None
    reason = SLURM_REASONS.get(comp.step_state or "") if is_terminal(state) else None
    return ReplicaStatus(
        id=idx, state=state, role=role, hostname=comp.nodes, exit_code=exit_code, reason=reason
    )
