"""The app model: what a job is, how it is configured and how its state is reported.

An :class:`AppDef` is one or more :class:`Role` s; each role runs ``num_replicas`` copies of the
same entrypoint. Schedulers turn an ``AppDef`` plus a validated config (see :class:`runopts`)
into a request (:class:`AppDryRunInfo`) and then into a running app addressed by an app handle
``{scheduler}://{session}/{app_id}``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum, StrEnum
from typing import Any, Generic, TypeVar

from core.handles import (
    AppHandle,
    MalformedAppHandleException,
    ParsedAppHandle,
    is_array_id,
    make_app_handle,
    parse_app_handle,
)
from core.mounts import BindMount, DeviceMount, Mount, VolumeMount, parse_mounts
from core.options import Cfg, CfgVal, cfg_from_str, runopt, runopts

__all__ = [
    "AppDef",
    "AppDryRunInfo",
    "AppHandle",
    "AppState",
    "AppStatus",
    "Attempt",
    "BindMount",
    "Cfg",
    "CfgVal",
    "DeviceMount",
    "ENV_KEY_PATTERN",
    "ElementStatus",
    "MAX_REPLICAS",
    "MISSING",
    "MalformedAppHandleException",
    "NAME_PATTERN",
    "NULL_RESOURCE",
    "ParsedAppHandle",
    "Reason",
    "ReplicaState",
    "ReplicaStatus",
    "Resource",
    "ResourceUsage",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "VolumeMount",
    "cfg_from_str",
    "get_named_resources",
    "is_array_id",
    "is_terminal",
    "macros",
    "make_app_handle",
    "named_resources",
    "parse_app_handle",
    "parse_mounts",
    "resource",
    "runopt",
    "runopts",
    "validate_app",
    "validate_name",
]

MISSING = "<MISSING>"
NONE = "<NONE>"

#: most replicas one role may have: more is a mistake no backend can run, and a dry run would
#: otherwise build a request per replica before any backend could say so
MAX_REPLICAS = 10_000

# Names end up in file names, container names, hostnames and Slurm job names: keep them safe for all.
# (used with fullmatch: `$` would also accept a trailing newline)
#: what an app or role name must match in full (also the app-file JSON Schema's pattern)
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
#: what an environment variable name must match in full
ENV_KEY_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME_RE = re.compile(NAME_PATTERN)
_ENV_KEY_RE = re.compile(ENV_KEY_PATTERN)


# --------------------------------------------------------------------------------------------
# resources
# --------------------------------------------------------------------------------------------


@dataclass
class Resource:
    """Resources a replica asks for.

    Args:
        cpu: number of logical cpu cores
        gpu: number of gpus
        memMB: memory in MiB
        capabilities: scheduler-specific extra capabilities
        devices: named devices and how many of each (e.g. ``{"vpc.amazonaws.com/efa": 1}``)
    """

    cpu: int
    gpu: int
    memMB: int  # noqa: N815 - name fixed by the specification
    capabilities: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """Returns a copy of ``original`` with ``capabilities`` merged into its capabilities."""
        res_capabilities = dict(original.capabilities)
        res_capabilities.update(capabilities)
        return Resource(
            cpu=original.cpu,
            gpu=original.gpu,
            memMB=original.memMB,
            capabilities=res_capabilities,
            devices=dict(original.devices),
        )


#: a resource that asks for nothing in particular (the scheduler's defaults apply)
NULL_RESOURCE: Resource = Resource(cpu=-1, gpu=-1, memMB=-1)

_NAMED: dict[str, Callable[[], Resource]] = {
    "null": lambda: Resource(cpu=-1, gpu=-1, memMB=-1),
    "tiny": lambda: Resource(cpu=1, gpu=0, memMB=256),
    "small": lambda: Resource(cpu=1, gpu=0, memMB=1024),
    "medium": lambda: Resource(cpu=2, gpu=0, memMB=4096),
    "large": lambda: Resource(cpu=4, gpu=0, memMB=16384),
    "gpu.small": lambda: Resource(cpu=4, gpu=1, memMB=16384),
    "gpu.large": lambda: Resource(cpu=16, gpu=4, memMB=65536),
}


def get_named_resources(name: str) -> Resource:
    """Returns a fresh copy of the named resource preset (see :data:`named_resources`)."""
    try:
        return _NAMED[name.lower()]()
    except KeyError:
        raise ValueError(
            f"resource: unknown named resource {name!r}; expected one of {sorted(_NAMED)}"
        ) from None


class _NamedResources(Mapping[str, Resource]):
    def __getitem__(self, key: str) -> Resource:
        return get_named_resources(key)

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMED)

    def __len__(self) -> int:
        return len(_NAMED)


#: named resource presets: ``named_resources["small"]``
named_resources: Mapping[str, Resource] = _NamedResources()


def resource(
    cpu: int | None = None, gpu: int | None = None, memMB: int | None = None, h: str | None = None
) -> Resource:  # noqa: N803
    """Builds a :class:`Resource` from explicit values or from a named preset ``h``.

    ``h`` takes precedence when given; otherwise unspecified fields default to cpu=1, gpu=0,
    memMB=1024.
    """
    if h:
        return get_named_resources(h)
    return Resource(
        cpu=1 if cpu is None else cpu,
        gpu=0 if gpu is None else gpu,
        memMB=1024 if memMB is None else memMB,
    )


# --------------------------------------------------------------------------------------------
# macros
# --------------------------------------------------------------------------------------------


_MACRO_RE = re.compile(r"\$\{(img_root|base_img_root|app_id|replica_id|rank0_env)\}")


class macros:  # noqa: N801 - name fixed by the specification
    """Placeholders substituted into a role's args and env at launch time.

    ``${img_root}`` the root of the role's image on the host; ``${base_img_root}`` the same for
    its base image; ``${app_id}`` the app id the scheduler assigned; ``${replica_id}`` the
    replica's index in its role; ``${rank0_env}`` the name of the environment variable holding
    the host of replica 0 of the first role (for rendezvous).
    """

    img_root = "${img_root}"
    base_img_root = "${base_img_root}"
    app_id = "${app_id}"
    replica_id = "${replica_id}"
    rank0_env = "${rank0_env}"

    @dataclass
    class Values:
        """Values for the macros of one replica."""

        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str
        base_img_root: str = NONE

        def apply(self, role: Role) -> Role:
            """Returns a deep copy of ``role`` with the macros substituted in args and env."""
            role = copy.deepcopy(role)
            role.args = [self.substitute(a) for a in role.args]
            role.env = {k: self.substitute(v) for k, v in role.env.items()}
            return role

        def substitute(self, arg: str) -> str:
            """Substitutes the macros in one string.

            Only ``${name}`` of a known macro is replaced: ``$$``, ``$VAR`` and unknown ``${...}``
            reach the program as written (they often mean something to a shell).
            """
            values = asdict(self)
            return _MACRO_RE.sub(lambda m: str(values[m.group(1)]), arg)


# --------------------------------------------------------------------------------------------
# roles and apps
# --------------------------------------------------------------------------------------------


class RetryPolicy(StrEnum):
    """What is restarted when a replica fails (and ``max_retries`` allows another try).

    REPLICA: only the failed replica. ROLE: every replica of its role. APPLICATION: the whole app.
    Schedulers support the subset their backend offers (Docker: REPLICA; Slurm: APPLICATION).
    """

    REPLICA = "REPLICA"
    APPLICATION = "APPLICATION"
    ROLE = "ROLE"


@dataclass
class Role:
    """A set of identical replicas of one program.

    Args:
        name: the role's name (letters, digits, ``_.-``; used in hostnames and file names)
        image: what the replica runs in: a directory (local_dir), a Docker image (local_docker);
            ignored by local_cwd and slurm
        entrypoint: the command to run
        args: its arguments (macros are substituted)
        env: environment variables (macros are substituted)
        num_replicas: how many replicas to start
        min_replicas: fewest replicas to run with, where the scheduler supports elasticity
        max_retries: how many times a failed replica/app is restarted
        retry_policy: what is restarted (see :class:`RetryPolicy`)
        resource: what each replica asks for
        port_map: named ports the replica listens on
        metadata: free-form, scheduler-specific data
        mounts: bind, volume and device mounts (see :func:`parse_mounts`)
    """

    name: str
    image: str = ""
    base_image: str | None = None
    entrypoint: str = MISSING
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=lambda: copy.deepcopy(NULL_RESOURCE))
    port_map: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)

    def pre_proc(self, scheduler: str, dryrun_info: AppDryRunInfo[Any]) -> AppDryRunInfo[Any]:
        """Hook for a role to adjust the scheduler request; returns it unchanged by default."""
        return dryrun_info


@dataclass
class AppDef:
    """An application: a name and one or more roles.

    Args:
        name: the app's name (letters, digits, ``_.-``)
        roles: the roles that make up the app
        metadata: free-form data carried with the app (schedulers may store it, e.g. as labels)
    """

    name: str
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


def validate_name(value: Any, where: str) -> str:
    """Checks a name used for an app or role; raises ``ValueError`` naming ``where``."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"{where}: expected 1-63 characters of letters, digits, '_', '.', '-' starting with"
            f" a letter or digit, got {value!r}"
        )
    return value


def _check_int(value: Any, where: str, minimum: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: expected {what}, got {value!r}")


def validate_app(app: AppDef) -> None:
    """Validates an app before anything is started.

    Raises:
        ValueError: with the path of the first bad field, e.g.
            ``roles[1].num_replicas: expected a positive integer, got -2``.
    """
    if not isinstance(app, AppDef):
        raise ValueError(f"app: expected an AppDef, got {type(app).__name__}")
    validate_name(app.name, "name")
    if not isinstance(app.roles, list) or not app.roles:
        raise ValueError("roles: expected at least one role, got none")
    seen: set[str] = set()
    for i, role in enumerate(app.roles):
        where = f"roles[{i}]"
        if not isinstance(role, Role):
            raise ValueError(f"{where}: expected a Role, got {type(role).__name__}")
        validate_name(role.name, f"{where}.name")
        if role.name in seen:
            raise ValueError(f"{where}.name: duplicate role name {role.name!r}")
        seen.add(role.name)
        if not isinstance(role.image, str):
            raise ValueError(f"{where}.image: expected a string, got {role.image!r}")
        _check_command(role, where)
        _check_env(role.env, where)
        _check_counts(role, where)
        _check_resources(role, where)


def _check_command(role: Role, where: str) -> None:
    """The role's entrypoint and args: strings without NUL characters."""
    if not isinstance(role.entrypoint, str) or not role.entrypoint or role.entrypoint == MISSING:
        raise ValueError(
            f"{where}.entrypoint: expected a non-empty command, got {role.entrypoint!r}"
        )
    if "\x00" in role.entrypoint:
        raise ValueError(f"{where}.entrypoint: must not contain NUL characters")
    if not isinstance(role.args, list):
        raise ValueError(f"{where}.args: expected a list of strings, got {role.args!r}")
    for j, arg in enumerate(role.args):
        if not isinstance(arg, str):
            raise ValueError(f"{where}.args[{j}]: expected a string, got {arg!r}")
        if "\x00" in arg:
            raise ValueError(f"{where}.args[{j}]: must not contain NUL characters")


def _check_env(env: Any, where: str) -> None:
    """The role's env: variable names to strings without NUL characters."""
    if not isinstance(env, dict):
        raise ValueError(f"{where}.env: expected a mapping of strings, got {env!r}")
    for key, val in env.items():
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            raise ValueError(
                f"{where}.env: expected variable names of letters, digits and '_', got {key!r}"
            )
        if not isinstance(val, str):
            raise ValueError(f"{where}.env.{key}: expected a string, got {val!r}")
        if "\x00" in val:
            raise ValueError(f"{where}.env.{key}: must not contain NUL characters")


def _check_counts(role: Role, where: str) -> None:
    """The role's replica counts, retries and retry policy."""
    _check_int(role.num_replicas, f"{where}.num_replicas", 1, "a positive integer")
    if role.num_replicas > MAX_REPLICAS:
        raise ValueError(
            f"{where}.num_replicas: expected at most {MAX_REPLICAS} replicas per role,"
            f" got {role.num_replicas}"
        )
    if role.min_replicas is not None:
        _check_int(role.min_replicas, f"{where}.min_replicas", 1, "a positive integer")
        if role.min_replicas > role.num_replicas:
            raise ValueError(
                f"{where}.min_replicas: expected at most num_replicas ({role.num_replicas}),"
                f" got {role.min_replicas}"
            )
    _check_int(role.max_retries, f"{where}.max_retries", 0, "a non-negative integer")
    if not isinstance(role.retry_policy, RetryPolicy):
        raise ValueError(
            f"{where}.retry_policy: expected one of {[p.value for p in RetryPolicy]},"
            f" got {role.retry_policy!r}"
        )


def _check_resources(role: Role, where: str) -> None:
    """The role's resource, ports and mounts."""
    res = role.resource
    if not isinstance(res, Resource):
        raise ValueError(f"{where}.resource: expected a Resource, got {res!r}")
    for attr in ("cpu", "gpu", "memMB"):
        val = getattr(res, attr)
        if isinstance(val, bool) or not isinstance(val, int) or val < -1:
            raise ValueError(
                f"{where}.resource.{attr}: expected a non-negative integer (or -1), got {val!r}"
            )
    for name, port in role.port_map.items():
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"{where}.port_map.{name}: expected a port 1-65535, got {port!r}")
    for j, mount in enumerate(role.mounts):
        if not isinstance(mount, BindMount | VolumeMount | DeviceMount):
            raise ValueError(f"{where}.mounts[{j}]: expected a mount, got {mount!r}")


# --------------------------------------------------------------------------------------------
# states
# --------------------------------------------------------------------------------------------


class AppState(IntEnum):
    """State of an app (and of each replica, see :data:`ReplicaState`)."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name


class Reason(StrEnum):
    """Why an app or replica ended (``reason`` of its status): for code; the message stays
    human."""

    EXIT_CODE = "exit_code"  #: its program exited (0 for success)
    SIGNAL = "signal"  #: a signal ended it (exit code -N)
    OOM = "oom"  #: the out-of-memory killer
    TIMEOUT = "timeout"  #: its time limit
    PREEMPTED = "preempted"  #: the scheduler took its resources for other work
    NODE_FAILURE = "node_failure"  #: its node failed
    CANCELLED = "cancelled"  #: someone cancelled it
    SUBMIT_INTERRUPTED = "submit_interrupted"  #: its submission did not complete
    SILENT = "silent"  #: cancelled for printing nothing for max_silence (a hang)
    DEPENDENCY = "dependency"  #: what it waited for ended so that it could never start


_TERMINAL_STATES = frozenset({AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED})

ReplicaState = AppState
_STATES_BY_NAME: dict[str, AppState] = dict(AppState.__members__)


def is_terminal(state: AppState) -> bool:
    """True for SUCCEEDED, FAILED and CANCELLED: the app will not change state again."""
    return state in _TERMINAL_STATES


def format_bytes(n: float) -> str:
    """``3.0 GiB``, ``512 MiB``, ``1 MiB``"""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return (
                f"{value:.1f} {unit}"
                if value < 10 and value != int(value)
                else f"{value:.0f} {unit}"
            )
    return f"{int(n)} B"


@dataclass
class ResourceUsage:
    """What one replica used, as its backend measured it (a field is None where the backend
    could not tell).

    Args:
        wall_time: seconds from its start to its end (or to now, while it runs)
        cpu_time: CPU seconds, user plus system, of the replica and its children
        peak_memory: its peak memory in bytes (resident set / cgroup high-water mark)
        requested_memory: the memory it asked for in bytes (None: no request)
        oom_killed: True if it was killed for running out of memory
        peak_gpu_memory: its GPUs' peak memory in bytes, where the backend gathers it
    """

    wall_time: float | None = None
    cpu_time: float | None = None
    peak_memory: int | None = None
    requested_memory: int | None = None
    oom_killed: bool = False
    peak_gpu_memory: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResourceUsage:
        """The usage of a :meth:`to_json` form (unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def format(self) -> str:
        """``wall 12.0s, cpu 10.2s, peak 3.0 GiB of 4.0 GiB``"""
        parts = []
        if self.wall_time is not None:
            parts.append(f"wall {self.wall_time:.1f}s")
        if self.cpu_time is not None:
            parts.append(f"cpu {self.cpu_time:.1f}s")
        if self.peak_memory is not None:
            of = f" of {format_bytes(self.requested_memory)}" if self.requested_memory else ""
            parts.append(f"peak {format_bytes(self.peak_memory)}{of}")
        if self.peak_gpu_memory is not None:
            parts.append(f"GPU peak {format_bytes(self.peak_gpu_memory)}")
        if self.oom_killed:
            parts.append("OOM killed")
        return ", ".join(parts) or "no figures"


@dataclass
class ReplicaStatus:
    """Status of one replica of a role.

    ``exit_code`` is the replica's exit code once it ended (negative ``-N`` for signal N), else
    ``None``. ``usage`` is what it used where the backend measured it (see
    :class:`ResourceUsage`), else ``None``.
    """

    id: int
    state: AppState
    role: str
    hostname: str
    structured_error_msg: str = NONE
    exit_code: int | None = None
    usage: ResourceUsage | None = None
    #: why it ended (a :class:`Reason` value); None while it runs
    reason: str | None = None


@dataclass
class RoleStatus:
    """Status of every replica of one role."""

    role: str
    replicas: list[ReplicaStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form of this status."""
        return {
            "role": self.role,
            "replicas": [{**asdict(r), "state": r.state.name} for r in self.replicas],
        }


@dataclass
class ElementStatus:
    """Status of one element of an array (see ``Runner.run_array``).

    ``handle`` is the app its latest attempt runs as (None while it waits for a slot),
    ``exit_code`` the first non-zero exit code of its replicas (0 when all succeeded; None while
    it runs), ``attempts`` how many times it was started.
    """

    index: int
    state: AppState
    handle: str | None = None
    exit_code: int | None = None
    attempts: int = 0
    msg: str = ""
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form of this status."""
        return {**self.__dict__, "state": self.state.name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ElementStatus:
        """The inverse of :meth:`to_json`."""
        # (positional, states from a plain dict: an array's status builds one per element,
        # bench row "array follow: status of a running 1,000-element array")
        d = data
        state = _STATES_BY_NAME[d["state"]]
        return cls(
            d["index"], state, d["handle"], d["exit_code"], d["attempts"], d["msg"], d.get("reason")
        )


@dataclass
class Attempt:
    """An ended attempt of an app that was started again (requeued or retried in place):
    its number (0 first), how it ended in the backend's words (``PREEMPTED``), why (a
    :class:`Reason` value; None where the backend does not say) and where it ran."""

    number: int
    state: str
    reason: str | None = None
    nodes: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form of this attempt."""
        return dict(self.__dict__)

    def format(self) -> str:
        """One line: ``attempt 0: PREEMPTED (preempted) on node2``."""
        text = f"attempt {self.number}: {self.state}" + (f" ({self.reason})" if self.reason else "")
        return text + (f" on {self.nodes}" if self.nodes else "")


@dataclass
class AppStatus:
    """Runner-level status of an app: its state plus what the scheduler said about it.

    For an array, ``elements`` holds each element's status (None for an app).
    """

    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = NONE
    ui_url: str | None = None
    roles: list[RoleStatus] = field(default_factory=list)
    elements: list[ElementStatus] | None = None
    #: why it ended (a :class:`Reason` value, see :func:`fill_reasons`); None while it runs
    reason: str | None = None
    #: the ended attempts before the current one, where the backend requeued it in place
    attempts: list[Attempt] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """How many elements of an array are in each state, by name (empty for an app)."""
        out: dict[str, int] = {}
        for e in self.elements or []:
            out[e.state.name] = out.get(e.state.name, 0) + 1
        return out

    def is_terminal(self) -> bool:
        """True if the app reached a final state."""
        return is_terminal(self.state)

    def exit_codes(self) -> dict[str, list[int | None]]:
        """Exit codes by role, one per replica (``None`` for a replica still running)."""
        return {rs.role: [r.exit_code for r in rs.replicas] for rs in self.roles}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form of this status."""
        return {
            "state": self.state.name,
            "reason": self.reason,
            "num_restarts": self.num_restarts,
            "msg": self.msg,
            "structured_error_msg": self.structured_error_msg,
            "ui_url": self.ui_url,
            "roles": [r.to_json() for r in self.roles],
            "attempts": [a.to_json() for a in self.attempts],
            **(
                {"counts": self.counts(), "elements": [e.to_json() for e in self.elements]}
                if self.elements is not None
                else {}
            ),
        }

    def format(self) -> str:
        """A human-readable, multi-line summary."""
        state = f"{self.state.name} ({self.reason})" if self.reason else self.state.name
        lines = [f"State: {state}", f"Num Restarts: {self.num_restarts}"]
        lines += [f"  {a.format()}" for a in self.attempts]
        if self.msg:
            lines.append(f"Msg: {self.msg}")
        if self.ui_url:
            lines.append(f"UI URL: {self.ui_url}")
        if self.elements is not None:
            counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts().items()))
            lines.append(f"Elements: {len(self.elements)} ({counts})")
            for e in self.elements:
                if e.state in (AppState.FAILED, AppState.CANCELLED) and e.handle:
                    code = "" if e.exit_code is None else f" exit_code={e.exit_code}"
                    lines.append(f"  [{e.index}] {e.state.name}{code} {e.handle} {e.msg}".rstrip())
        for rs in self.roles:
            lines.append(f"Role {rs.role}:")
            for r in rs.replicas:
                code = "" if r.exit_code is None else f" exit_code={r.exit_code}"
                host = f" on {r.hostname}" if r.hostname else ""
                used = f" ({r.usage.format()})" if r.usage is not None else ""
                lines.append(f"  {rs.role}/{r.id} {r.state.name}{code}{host}{used}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


# --------------------------------------------------------------------------------------------
# dry runs
# --------------------------------------------------------------------------------------------

T = TypeVar("T")


class AppDryRunInfo(Generic[T]):
    """The request a scheduler would submit, plus a function that prints it.

    ``str(info)`` gives the printable form (for example the sbatch script).
    """

    def __init__(self, request: T, fmt: Callable[[T], str]) -> None:
        self.request = request
        self._fmt = fmt
        self._app: AppDef | None = None
        self._cfg: Mapping[str, CfgVal] | None = None
        self._scheduler: str | None = None
        self._images_to_push: dict[str, tuple[str, str]] = {}
        #: the key that makes scheduling this request happen once (see
        #: ``Scheduler.schedule``); None: every schedule submits
        self.idempotency_key: str | None = None

    # (stored under the specification's private names, which schedulers may still read)

    @property
    def app(self) -> AppDef | None:
        """The app the request was made from (set by ``Scheduler.submit_dryrun``)."""
        return self._app

    @app.setter
    def app(self, app: AppDef | None) -> None:
        self._app = app

    @property
    def cfg(self) -> Mapping[str, CfgVal] | None:
        """The resolved run configuration the request was made with."""
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: Mapping[str, CfgVal] | None) -> None:
        self._cfg = cfg

    @property
    def scheduler(self) -> str | None:
        """The name of the scheduler that made the request (None: not made by one)."""
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: str | None) -> None:
        self._scheduler = scheduler

    def __repr__(self) -> str:
        return self._fmt(self.request)

    def __str__(self) -> str:
        return self._fmt(self.request)
