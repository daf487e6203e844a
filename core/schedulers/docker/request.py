"""The ``local_docker`` run options, validation of an app for the engine, and the request (one
:class:`DockerContainer` per replica) a dry run builds. Nothing here talks to the engine."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import TypedDict

from core.limits import (
    ATTEMPT_ENV,
    CHECKPOINT_DIR_ENV,
    Limits,
    Requeue,
    add_limit_opts,
    add_requeue_opts,
    limits_from_cfg,
    requeue_from_cfg,
)
from core.reports import (
    RESULT_FILE_ENV,
    RESULT_REPLICAS_HELP,
    RESULT_REPLICAS_OPT,
    result_replicas,
)
from core.schedulers.docker.model import (
    BACKEND,
    DEFAULT_RECORD_RETENTION,
    DEFAULT_RETENTION,
    DEFAULT_STOP_TIMEOUT,
    LABEL_APP_ID,
    LABEL_APP_NAME,
    LABEL_MAX_RETRIES,
    LABEL_NETWORK,
    LABEL_NUM_REPLICAS,
    LABEL_RECORD_RETENTION,
    LABEL_REPLICA_ID,
    LABEL_REQUEUES,
    LABEL_RESULT_FILE,
    LABEL_RESULT_REPLICAS,
    LABEL_RETENTION,
    LABEL_ROLE_NAME,
    LABEL_ROLES,
    LABEL_SESSION,
    LABEL_STOP_TIMEOUT,
    LABEL_SUBMITTED,
    LABEL_TIME_LIMIT,
    LABEL_VERSION,
    RANK0_ENV,
    RESULT_PATH,
    DockerContainer,
    DockerJob,
    container_name,
    hostname,
)
from core.schedulers.docker.timelimit import CHECKPOINT_PATH, wrapper
from core.specs import (
    AppDef,
    BindMount,
    CfgVal,
    DeviceMount,
    RetryPolicy,
    Role,
    VolumeMount,
    macros,
    runopts,
)

log = logging.getLogger(__name__)

#: the values of the ``pull`` run option (as ``docker run --pull``)
PULL_POLICIES = ("missing", "always", "never")
DEFAULT_PULL = "missing"
PULL_HELP = (
    "when to pull the roles' images, as docker run --pull: missing (those the engine lacks),"
    " always (at every submit), never (they must be on the engine). Pulls use the Docker"
    " client's registry login (docker login, or the Airflow connection's or Prefect block's)"
)


class DockerOpts(TypedDict, total=False):
    """The run options of ``local_docker`` (see :func:`run_opts`)."""

    copy_env: list[str] | None
    env: dict[str, str] | None
    image_repo: str | None
    quiet: bool
    stop_timeout: int
    retention: int
    record_retention: int
    result_replicas: str
    pull: str
    time_limit: str | None
    checkpoint_signal: str | None
    checkpoint_grace: float | None
    max_requeues: int
    requeue_on_timeout: bool


# docker distribution's reference grammar (simplified): [registry[:port]/]path[:tag][@digest]
_IMAGE_REF_RE = re.compile(
    r"^(?:(?P<registry>[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_IMAGE_ID_RE = re.compile(r"^(?:sha256:)?[0-9a-f]{12,64}$")
_VOLUME_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def run_opts() -> runopts:
    """The run options ``local_docker`` takes."""
    opts = runopts()
    opts.add(
        "copy_env",
        type_=list[str],
        default=None,
        help="list of glob patterns of environment variables to copy if not set in AppDef."
        " Ex: FOO_*",
    )
    opts.add(
        "env",
        type_=dict[str, str],
        default=None,
        help="environment variables to be passed to the run. The separator sign can be either"
        " comma or semicolon (e.g. ENV1:v1,ENV2:v2,ENV3:v3 or ENV1:V1;ENV2:V2). Environment"
        " variables from env will be applied on top of the ones from copy_env",
    )
    opts.add(
        "image_repo",
        type_=str,
        default=None,
        help="(remote jobs) the image repository to use when pushing patched images, must"
        " have push access. Ex: 127.0.0.1:5000/shipyard",
    )
    opts.add(
        "quiet",
        type_=bool,
        default=False,
        help="whether to suppress verbose output for image building. Defaults to ``False``.",
    )
    opts.add(
        "stop_timeout",
        type_=int,
        default=DEFAULT_STOP_TIMEOUT,
        help="seconds a replica gets to exit after SIGTERM when the app is cancelled, before"
        " it is killed",
    )
    opts.add(
        "retention",
        type_=int,
        default=DEFAULT_RETENTION,
        help="seconds an ended app's containers are kept; then their logs are archived in the"
        " app's record volume (log_iter still reads them) and the containers are removed",
    )
    opts.add(
        "record_retention",
        type_=int,
        default=DEFAULT_RECORD_RETENTION,
        help="seconds a retired app's record (final state, usage, archived logs, idempotency"
        " key) is kept once its containers are gone; then the app is unknown",
    )
    opts.add(RESULT_REPLICAS_OPT, type_=str, default="first", help=RESULT_REPLICAS_HELP)
    opts.add("pull", type_=str, default=DEFAULT_PULL, help=PULL_HELP)
    add_limit_opts(opts)
    add_requeue_opts(opts)
    return opts


def is_image_id(ref: str) -> bool:
    """Whether ``ref`` is an image id (``sha256:...`` or hex), which no registry serves."""
    return bool(_IMAGE_ID_RE.match(ref))


def match_image_ref(ref: str) -> re.Match[str] | None:
    """Matches a Docker image reference; like docker, the first component is a registry only
    if it has a '.' or ':' or is 'localhost' (otherwise it is a lower-case path component)."""
    m = _IMAGE_REF_RE.match(ref)
    if m and m.group("registry"):
        reg = m.group("registry")
        if not ("." in reg or ":" in reg or reg == "localhost") and reg != reg.lower():
            return None
    return m


# -- validation -------------------------------------------------------------------------------


def validate(app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
    """Raises a ValueError naming the first bad field of ``cfg`` or of the app's roles."""
    _validate_cfg(cfg)
    for i, role in enumerate(app.roles):
        _validate_role(role, f"roles[{i}]")


def _validate_cfg(cfg: Mapping[str, CfgVal]) -> None:
    env = cfg.get("env") or {}
    assert isinstance(env, dict)
    for key in env:
        if not _ENV_NAME_RE.match(key):
            raise ValueError(
                f"cfg.env: expected variable names of letters, digits and '_', got {key!r}"
            )
    for pattern in cfg.get("copy_env") or []:  # type: ignore[union-attr]
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"cfg.copy_env: expected glob patterns, got {pattern!r}")
    repo = cfg.get("image_repo")
    if repo is not None:
        m = match_image_ref(str(repo))
        if not repo or not m or m.group("tag") or m.group("digest"):
            raise ValueError(
                "cfg.image_repo: expected a repository without tag, e.g."
                f" 127.0.0.1:5000/shipyard, got {repo!r}"
            )
    result_replicas(cfg.get(RESULT_REPLICAS_OPT))
    check_pull_policy(cfg.get("pull"))
    requeue_from_cfg(cfg, limits_from_cfg(cfg))  # (raises naming the option)
    for name in ("stop_timeout", "retention", "record_retention"):
        value = cfg.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"cfg.{name}: expected seconds >= 0, got {value!r}")


def check_pull_policy(value: object) -> str:
    """The pull policy ``value`` names (None: the default).

    Raises:
        ValueError: naming ``cfg.pull`` when it is not one of :data:`PULL_POLICIES`.
    """
    if value is None:
        return DEFAULT_PULL
    if value not in PULL_POLICIES:
        raise ValueError(f"cfg.pull: expected one of {', '.join(PULL_POLICIES)}, got {value!r}")
    return str(value)


def _validate_role(role: Role, where: str) -> None:
    if not role.image:
        raise ValueError(f"{where}.image: a Docker image is required for {BACKEND}")
    name = role.image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    if len(name) > 255:
        raise ValueError(
            f"{where}.image: the repository name must be at most 255 characters, got {len(name)}"
        )
    if not (match_image_ref(role.image) or is_image_id(role.image)):
        raise ValueError(
            f"{where}.image: not a valid Docker image reference (lower-case"
            f" [registry/]name[:tag][@digest]), got {role.image!r}"
        )
    host = hostname(role.name, role.num_replicas - 1)
    if len(host) > 63:
        raise ValueError(
            f"{where}.name: the replica hostname {host!r} is longer than 63 characters;"
            " use a shorter role name"
        )
    for j, mount in enumerate(role.mounts):
        check_mount(mount, f"{where}.mounts[{j}]")
    for dev in role.resource.devices:
        log.warning(
            "%s.resource.devices: %s is not supported by %s and is ignored", where, dev, BACKEND
        )


def check_mount(mount: BindMount | VolumeMount | DeviceMount, where: str) -> None:
    """Raises a ValueError naming ``where`` if the mount cannot work on this engine's host
    (a bind source or device that does not exist, a relative path, a bad volume name)."""
    if isinstance(mount, BindMount):
        if not os.path.isabs(mount.src_path):
            raise ValueError(f"{where}.src: expected an absolute host path, got {mount.src_path!r}")
        if not os.path.exists(mount.src_path):
            raise ValueError(f"{where}.src: bind source {mount.src_path!r} does not exist")
    elif isinstance(mount, VolumeMount):
        if not _VOLUME_NAME_RE.match(mount.src):
            raise ValueError(
                f"{where}.src: expected a volume name of letters, digits and _.-, got {mount.src!r}"
            )
    elif not os.path.exists(mount.src_path):
        raise ValueError(f"{where}.src: device {mount.src_path!r} does not exist on this host")
    if not mount.dst_path.startswith("/"):
        raise ValueError(
            f"{where}.dst: expected an absolute container path, got {mount.dst_path!r}"
        )


# -- the request ------------------------------------------------------------------------------


def build_job(app: AppDef, cfg: Mapping[str, CfgVal], session_name: str) -> DockerJob:
    """The containers of ``app``: one per replica, with its labels, environment and limits."""
    app_id = f"{app.name}-{os.urandom(5).hex()}"
    env = _base_env(cfg)
    limits = limits_from_cfg(cfg)
    requeue = requeue_from_cfg(cfg, limits)
    checkpoint = (
        f"{app_id}-checkpoint" if limits.time_limit is not None or requeue.max_requeues else None
    )
    total = sum(role.num_replicas for role in app.roles)
    network = app_id if total > 1 else None
    common = _common_labels(app, cfg, session_name, app_id, network)
    rank0_host = hostname(app.roles[0].name, 0)
    containers: list[DockerContainer] = []
    for role in app.roles:
        for replica_id in range(role.num_replicas):
            values = macros.Values(
                img_root="", app_id=app_id, replica_id=str(replica_id), rank0_env=RANK0_ENV
            )
            replica_role = values.apply(role)
            replica_env = {
                **env,
                **replica_role.env,
                "SHIPYARD_APP_ID": app_id,
                "SHIPYARD_APP_NAME": app.name,
                "SHIPYARD_ROLE_NAME": role.name,
                "SHIPYARD_REPLICA_ID": str(replica_id),
                "SHIPYARD_NUM_REPLICAS": str(role.num_replicas),
                RANK0_ENV: rank0_host,
                ATTEMPT_ENV: "0",
                **({CHECKPOINT_DIR_ENV: CHECKPOINT_PATH} if checkpoint else {}),
            }
            result_file = replica_role.env.get(RESULT_FILE_ENV) or RESULT_PATH
            replica_env[RESULT_FILE_ENV] = result_file
            kwargs = _container_kwargs(role, replica_id, app_id, network, cfg)
            kwargs["environment"] = replica_env
            kwargs["labels"] = {
                **common,
                LABEL_ROLE_NAME: role.name,
                LABEL_REPLICA_ID: str(replica_id),
                LABEL_NUM_REPLICAS: str(role.num_replicas),
                LABEL_MAX_RETRIES: str(role.max_retries),
                LABEL_RESULT_FILE: result_file,
                LABEL_RESULT_REPLICAS: result_replicas(cfg.get(RESULT_REPLICAS_OPT)),
            }
            _add_limits(kwargs, role, limits, requeue, checkpoint)
            command = [replica_role.entrypoint, *replica_role.args]
            containers.append(DockerContainer(image=role.image, command=command, kwargs=kwargs))
    pull = check_pull_policy(cfg.get("pull"))
    return DockerJob(app_id, containers, pull=pull, checkpoint_volume=checkpoint)


def _add_limits(
    kwargs: dict[str, object],
    role: Role,
    limits: Limits,
    requeue: Requeue,
    checkpoint: str | None,
) -> None:
    """The checkpoint volume's mount, and a time limit's script (which also retries the
    replica in place of the engine's restart policy: see :mod:`.timelimit`)."""
    if checkpoint:
        mount = {"Type": "volume", "Source": checkpoint, "Target": CHECKPOINT_PATH}
        mounts = kwargs.setdefault("mounts", [])
        assert isinstance(mounts, list)
        mounts.append({**mount, "ReadOnly": False})
    if limits.time_limit is None:
        return
    requeues = requeue.max_requeues if requeue.on_timeout else 0
    stop = kwargs.get("stop_timeout")
    kill_after = stop if isinstance(stop, int) else DEFAULT_STOP_TIMEOUT
    kwargs["entrypoint"] = wrapper(limits, kill_after, role.max_retries, requeues)
    kwargs.pop("restart_policy", None)
    labels = kwargs["labels"]
    assert isinstance(labels, dict)
    labels[LABEL_TIME_LIMIT] = f"{limits.time_limit:g}"
    labels[LABEL_REQUEUES] = str(requeues)


def _base_env(cfg: Mapping[str, CfgVal]) -> dict[str, str]:
    """``copy_env`` matches from this process's environment, then ``env`` over them."""
    env: dict[str, str] = {}
    patterns = list(cfg.get("copy_env") or [])  # type: ignore[arg-type]
    if patterns:
        env.update(
            {
                k: v
                for k, v in os.environ.items()
                if any(fnmatch.fnmatchcase(k, p) for p in patterns)
            }
        )
    env.update(cfg.get("env") or {})  # type: ignore[arg-type]
    return env


def _common_labels(
    app: AppDef, cfg: Mapping[str, CfgVal], session_name: str, app_id: str, network: str | None
) -> dict[str, str]:
    roles = [
        {
            "name": r.name,
            "image": r.image,
            "num_replicas": r.num_replicas,
            "max_retries": r.max_retries,
        }
        for r in app.roles
    ]
    labels = {
        LABEL_VERSION: "1",
        LABEL_SESSION: session_name,
        LABEL_APP_ID: app_id,
        LABEL_APP_NAME: app.name,
        LABEL_ROLES: json.dumps(roles, separators=(",", ":")),
        LABEL_NETWORK: network or "",
        LABEL_STOP_TIMEOUT: str(cfg.get("stop_timeout")),
        LABEL_RETENTION: str(cfg.get("retention")),
        LABEL_RECORD_RETENTION: str(cfg.get("record_retention")),
        LABEL_SUBMITTED: repr(time.time()),
    }
    return labels


def _container_kwargs(
    role: Role, replica_id: int, app_id: str, network: str | None, cfg: Mapping[str, CfgVal]
) -> dict[str, object]:
    host = hostname(role.name, replica_id)
    kwargs: dict[str, object] = {
        "name": container_name(app_id, role.name, replica_id),
        "hostname": host,
        "stop_timeout": cfg.get("stop_timeout"),
    }
    if network:
        kwargs["network"] = network
        kwargs["networking_config"] = {network: {"Aliases": [host]}}
    if role.max_retries > 0:
        if role.retry_policy != RetryPolicy.REPLICA:
            log.debug(
                "role %s: %s restarts failed replicas alone (retry_policy %s)",
                role.name,
                BACKEND,
                role.retry_policy.value,
            )
        kwargs["restart_policy"] = {"Name": "on-failure", "MaximumRetryCount": role.max_retries}
    res = role.resource
    if res.cpu > 0:
        kwargs["nano_cpus"] = int(res.cpu * 1_000_000_000)
    if res.memMB > 0:
        kwargs["mem_limit"] = f"{res.memMB}m"
    if res.gpu > 0:
        kwargs["device_requests"] = [{"count": res.gpu, "capabilities": [["gpu"]]}]
    _add_mounts(role.mounts, kwargs)
    return kwargs


def _add_mounts(
    role_mounts: Iterable[BindMount | VolumeMount | DeviceMount], kwargs: dict[str, object]
) -> None:
    mounts: list[dict[str, object]] = []
    devices: list[str] = []
    for mount in role_mounts:
        if isinstance(mount, DeviceMount):
            devices.append(f"{mount.src_path}:{mount.dst_path}:{mount.permissions}")
            continue
        kind, src = (
            ("bind", mount.src_path) if isinstance(mount, BindMount) else ("volume", mount.src)
        )
        mounts.append(
            {"Type": kind, "Source": src, "Target": mount.dst_path, "ReadOnly": mount.read_only}
        )
    if mounts:
        kwargs["mounts"] = mounts
    if devices:
        kwargs["devices"] = devices
