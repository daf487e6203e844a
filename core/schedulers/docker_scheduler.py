"""The ``local_docker`` scheduler: each replica of an app is a container on a local Docker engine.

Replicas of an app with more than one container share a per-app bridge network (named after the
app id) on which each replica is reachable by the hostname ``{role}-{replica_id}``. An app with a
single container runs on the engine's default bridge network (a network per app would only add
start-up time there); its hostname is still ``{role}-0``.

Everything the scheduler knows lives in container labels (``shipyard.*``), so ``describe``,
``list``, ``log_iter`` and ``cancel`` work from any process; the client keeps no state.

``max_retries`` becomes the containers' ``on-failure`` restart policy: Docker restarts a failed
replica alone (there is no gang restart), up to ``max_retries`` times, whatever the role's
``retry_policy`` says.

Cancelling an app stops its containers (SIGTERM, then SIGKILL after ``stop_timeout`` seconds, all
replicas in parallel), removes them and the app's network, and leaves a *tombstone*: an empty,
labelled Docker volume ``shipyard-tombstone-{app_id}`` that records the app's final state
(CANCELLED, or the terminal state it had already reached) and its replicas. ``describe`` then
keeps answering CANCELLED from any process instead of "unknown", without any container or
network left behind. The logs of a cancelled app are gone with its containers.
:meth:`DockerScheduler.purge` removes the tombstone too.

The docker SDK is imported lazily: importing this module stays cheap.
"""

from __future__ import annotations

import codecs
import fnmatch
import functools
import json
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from core.schedulers.api import (
    IDEMPOTENCY_KEY,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
    filter_regex,
    split_lines,
)
from core.specs import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    BindMount,
    CfgVal,
    DeviceMount,
    ReplicaStatus,
    RetryPolicy,
    Role,
    RoleStatus,
    VolumeMount,
    is_terminal,
    macros,
    runopts,
)
from core.workspace import DockerWorkspaceMixin

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

__all__ = [
    "DockerContainer",
    "DockerJob",
    "DockerScheduler",
    "create_scheduler",
    "has_docker",
]

BACKEND = "local_docker"

LABEL_PREFIX = "shipyard."
LABEL_VERSION = "shipyard.version"
LABEL_SESSION = "shipyard.session"
LABEL_APP_ID = "shipyard.app_id"
LABEL_APP_NAME = "shipyard.app_name"
LABEL_ROLE_NAME = "shipyard.role_name"
LABEL_REPLICA_ID = "shipyard.replica_id"
LABEL_NUM_REPLICAS = "shipyard.num_replicas"
LABEL_MAX_RETRIES = "shipyard.max_retries"
LABEL_ROLES = "shipyard.roles"
LABEL_NETWORK = "shipyard.network"
LABEL_STOP_TIMEOUT = "shipyard.stop_timeout"
LABEL_SUBMITTED = "shipyard.submitted"
LABEL_IDEMPOTENCY_KEY = "shipyard.idempotency_key"
# tombstone volumes only
LABEL_TOMBSTONE = "shipyard.tombstone"
LABEL_STATE = "shipyard.state"
LABEL_REPLICAS = "shipyard.replicas"
LABEL_NUM_RESTARTS = "shipyard.num_restarts"
LABEL_MSG = "shipyard.msg"

TOMBSTONE_PREFIX = "shipyard-tombstone-"
#: cancel renames each container ``{name}{CANCELLED_SUFFIX}`` before stopping it, so that a
#: concurrent describe knows the replica's exit is a cancellation (not a failure or success)
CANCELLED_SUFFIX = "--cancelled"
#: environment variable holding the hostname of replica 0 of the first role
RANK0_ENV = "SHIPYARD_RANK0_HOST"
DEFAULT_STOP_TIMEOUT = 10
_MAX_WORKERS = 16

# docker distribution's reference grammar (simplified): [registry[:port]/]path[:tag][@digest]
# patterns compiled on first use (re caches them): keeps the import cheap
_IMAGE_REF_RE = (
    r"^(?:(?P<registry>[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_IMAGE_ID_RE = r"^(?:sha256:)?[0-9a-f]{12,64}$"
_VOLUME_NAME_RE = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# the payload size in a log frame's 8-byte header (stream, 0, 0, 0, size as big-endian uint32)
_FRAME_SIZE = struct.Struct(">I").unpack_from
# a log message's timestamp prefix: RFC3339NanoFixed in UTC plus a space
_TS_LEN = len("2006-01-02T15:04:05.000000000Z ")
_EXIT_CODE_RE = re.compile(r"\((-?\d+)\)")

#: entries of the containers list API
_Containers = list[dict[str, Any]]


# --------------------------------------------------------------------------------------------
# request types
# --------------------------------------------------------------------------------------------


@dataclass
class DockerContainer:
    """One container to create: its image, command, and the keyword arguments of the docker SDK's
    ``client.containers.create`` (``name``, ``hostname``, ``environment``, ``labels``, ``mounts``,
    ``network``, ``restart_policy``, ...), plus ``stop_timeout``."""

    image: str
    command: list[str]
    kwargs: dict[str, object] = field(default_factory=dict)


@dataclass
class DockerJob:
    """The request :meth:`DockerScheduler.schedule` submits: the app id and its containers."""

    app_id: str
    containers: list[DockerContainer]

    def __str__(self) -> str:
        return json.dumps(
            {
                "app_id": self.app_id,
                "containers": [
                    {"image": c.image, "command": c.command, "kwargs": c.kwargs}
                    for c in self.containers
                ],
            },
            indent=2,
            default=str,
        )


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def has_docker() -> bool:
    """True if the docker SDK is installed and a Docker engine answers."""
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception:
        return False
    return True


def _match_image_ref(ref: str) -> re.Match[str] | None:
    """Matches a Docker image reference; like docker, the first component is a registry only
    if it has a '.' or ':' or is 'localhost' (otherwise it is a lower-case path component)."""
    m = re.match(_IMAGE_REF_RE, ref)
    if m and m.group("registry"):
        reg = m.group("registry")
        if not ("." in reg or ":" in reg or reg == "localhost") and reg != reg.lower():
            return None
    return m


def _hash_key(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def _timestamp(value: datetime | None, where: str) -> float | None:
    """A positive UNIX timestamp for the docker logs API (naive datetimes are local time)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f"{where}: expected a datetime, got {value!r}")
    ts = value.timestamp()
    # the API treats 0 as "unset": anything at or before the epoch means "from the start".
    return ts if ts > 0 else 1e-9


def _parse_docker_time(value: str) -> float | None:
    """Seconds since the epoch of a Docker RFC 3339 (nanosecond) timestamp, None for 'never'."""
    if not value or value.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", value)
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + tz).timestamp()
    frac = m.group(2) or "0"
    return base + int(frac) / 10 ** len(frac)


def _env_matching(patterns: Iterable[str]) -> dict[str, str]:
    patterns = list(patterns)
    return {k: v for k, v in os.environ.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def _cancelling(container: Mapping[str, Any]) -> bool:
    """Whether cancel has renamed this container (it is about to be stopped and removed)."""
    return any(n.endswith(CANCELLED_SUFFIX) for n in container.get("Names") or ())


def _hostname(role_name: str, replica_id: int) -> str:
    return f"{role_name}-{replica_id}"


def _container_name(app_id: str, role_name: str, replica_id: int) -> str:
    return f"{app_id}-{role_name}-{replica_id}"


def _replica_state(state: str, status: str) -> tuple[AppState, int | None]:
    """Replica state and exit code from the ``State``/``Status`` of a containers list entry."""
    if state == "running":
        return AppState.RUNNING, None
    if state in ("created", "restarting", "paused"):
        # restarting: it failed and Docker starts it again after a back-off
        return AppState.PENDING, None
    if state == "exited":
        m = _EXIT_CODE_RE.search(status)
        code = int(m.group(1)) if m else None
        if code is None:
            return AppState.UNKNOWN, None
        return (AppState.SUCCEEDED if code == 0 else AppState.FAILED), code
    if state == "dead":
        return AppState.FAILED, None
    if state == "removing":
        return AppState.CANCELLED, None
    return AppState.UNKNOWN, None


def _body_reader(raw: Any) -> Iterator[bytes]:
    """The body of a streamed HTTP response (a urllib3 response), in pieces of whatever has
    arrived: one read of the socket buffer at a time, de-chunked here when the body is chunked,
    instead of one read per HTTP chunk (the engine sends one chunk per log message)."""
    hres = getattr(raw, "_fp", None)  # the http.client response
    fp = getattr(hres, "fp", None)  # its buffered socket reader
    if fp is None or not hasattr(fp, "read1") or getattr(hres, "chunk_left", None) is not None:
        while data := raw.read1(1 << 16) if hasattr(raw, "read1") else raw.read(1 << 12):
            yield data
        return
    if not getattr(hres, "chunked", False):
        left = getattr(hres, "length", None)  # None: until the connection closes
        while (left is None or left > 0) and (
            data := fp.read1(1 << 16 if left is None else min(left, 1 << 16))
        ):
            if left is not None:
                left -= len(data)
            yield data
        return
    pending = bytearray()
    while data := fp.read1(1 << 16):
        pending += data
        pieces: list[bytearray] = []
        pos, n = 0, len(pending)
        # whole chunks only ("<hex size>\r\n<data>\r\n"): a partial one waits for more data
        while (eol := pending.find(b"\r\n", pos)) >= 0:
            head = pending[pos:eol]
            try:
                size = int(head, 16)
            except ValueError:  # chunk extensions
                size = int(bytes(head).split(b";")[0], 16)
            start = eol + 2
            end = start + size
            if end + 2 > n:
                break
            if size == 0:
                if pieces:
                    yield b"".join(pieces)
                return
            pieces.append(pending[start:end])
            pos = end + 2
        del pending[:pos]
        if pieces:
            yield b"".join(pieces)


# --------------------------------------------------------------------------------------------
# the scheduler
# --------------------------------------------------------------------------------------------


class DockerScheduler(DockerWorkspaceMixin, Scheduler[DockerJob]):
    """Runs apps on the local Docker engine, one container per replica (``local_docker``).

    Docker does not gang-schedule: if one replica fails, only that replica is restarted (up to
    its role's ``max_retries``). ``describe`` gives the app's state and every replica's status
    but not the complete original AppDef. Workspaces are overlaid on the role's image (see
    :meth:`build_workspace_image`); with ``image_repo`` the patched image is pushed there.

    Args:
        session_name: the session apps are submitted under
        docker_client: a ``docker.DockerClient`` to use (default: ``docker.from_env()``)
    """

    def __init__(self, session_name: str, docker_client: Any | None = None) -> None:
        super().__init__(BACKEND, session_name)
        self.__client = docker_client
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    # -- resources ---------------------------------------------------------------------------

    @property
    def _docker_client(self) -> Any:
        """The docker SDK client (created on first use)."""
        if self.__client is None:
            with self._lock:
                if self.__client is None:
                    import docker

                    self.__client = docker.from_env(max_pool_size=_MAX_WORKERS * 2)
        return self.__client

    @property
    def _api(self) -> Any:
        return self._docker_client.api

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=_MAX_WORKERS, thread_name_prefix="shipyard-docker"
                    )
        return self._pool

    def close(self) -> None:
        """Closes the thread pool and the docker client. Never raises."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        client, self.__client = self.__client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                log.debug("closing the docker client failed", exc_info=True)

    # -- options -----------------------------------------------------------------------------

    def _run_opts(self) -> runopts:
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
        return opts

    # -- validation and dry run --------------------------------------------------------------

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
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
            m = _match_image_ref(str(repo))
            if not repo or not m or m.group("tag") or m.group("digest"):
                raise ValueError(
                    "cfg.image_repo: expected a repository without tag, e.g."
                    f" 127.0.0.1:5000/shipyard, got {repo!r}"
                )
        stop_timeout = cfg.get("stop_timeout")
        if not isinstance(stop_timeout, int) or stop_timeout < 0:
            raise ValueError(f"cfg.stop_timeout: expected seconds >= 0, got {stop_timeout!r}")

        for i, role in enumerate(app.roles):
            where = f"roles[{i}]"
            if not role.image:
                raise ValueError(f"{where}.image: a Docker image is required for {BACKEND}")
            name = role.image.split("@", 1)[0]
            if ":" in name.rsplit("/", 1)[-1]:
                name = name.rsplit(":", 1)[0]
            if len(name) > 255:
                raise ValueError(
                    f"{where}.image: the repository name must be at most 255 characters,"
                    f" got {len(name)}"
                )
            if not (_match_image_ref(role.image) or re.match(_IMAGE_ID_RE, role.image)):
                raise ValueError(
                    f"{where}.image: not a valid Docker image reference (lower-case"
                    f" [registry/]name[:tag][@digest]), got {role.image!r}"
                )
            host = _hostname(role.name, role.num_replicas - 1)
            if len(host) > 63:
                raise ValueError(
                    f"{where}.name: the replica hostname {host!r} is longer than 63 characters;"
                    " use a shorter role name"
                )
            for j, mount in enumerate(role.mounts):
                mwhere = f"{where}.mounts[{j}]"
                if isinstance(mount, BindMount):
                    if not os.path.isabs(mount.src_path):
                        raise ValueError(
                            f"{mwhere}.src: expected an absolute host path, got {mount.src_path!r}"
                        )
                    if not os.path.exists(mount.src_path):
                        raise ValueError(
                            f"{mwhere}.src: bind source {mount.src_path!r} does not exist"
                        )
                    dst = mount.dst_path
                elif isinstance(mount, VolumeMount):
                    if not re.match(_VOLUME_NAME_RE, mount.src):
                        raise ValueError(
                            f"{mwhere}.src: expected a volume name of letters, digits and _.-,"
                            f" got {mount.src!r}"
                        )
                    dst = mount.dst_path
                else:
                    if not os.path.exists(mount.src_path):
                        raise ValueError(
                            f"{mwhere}.src: device {mount.src_path!r} does not exist on this host"
                        )
                    dst = mount.dst_path
                if not dst.startswith("/"):
                    raise ValueError(
                        f"{mwhere}.dst: expected an absolute container path, got {dst!r}"
                    )
            for dev in role.resource.devices:
                log.warning(
                    "%s.resource.devices: %s is not supported by %s and is ignored",
                    where,
                    dev,
                    BACKEND,
                )

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[DockerJob]:
        import uuid

        app_id = f"{app.name}-{uuid.uuid4().hex[:10]}"
        images_to_push = self.dryrun_push_images(app, cfg)

        env: dict[str, str] = {}
        copy_env = cfg.get("copy_env")
        if copy_env:
            env.update(_env_matching(copy_env))  # type: ignore[arg-type]
        cfg_env = cfg.get("env")
        if cfg_env:
            env.update(cfg_env)  # type: ignore[arg-type]

        total = sum(role.num_replicas for role in app.roles)
        network = app_id if total > 1 else None
        stop_timeout = cfg.get("stop_timeout")
        assert isinstance(stop_timeout, int)
        rank0_host = _hostname(app.roles[0].name, 0)
        roles_label = json.dumps(
            [
                {
                    "name": r.name,
                    "image": r.image,
                    "num_replicas": r.num_replicas,
                    "max_retries": r.max_retries,
                }
                for r in app.roles
            ],
            separators=(",", ":"),
        )
        common_labels = {
            LABEL_VERSION: "1",
            LABEL_SESSION: self.session_name,
            LABEL_APP_ID: app_id,
            LABEL_APP_NAME: app.name,
            LABEL_ROLES: roles_label,
            LABEL_NETWORK: network or "",
            LABEL_STOP_TIMEOUT: str(stop_timeout),
            LABEL_SUBMITTED: repr(time.time()),
        }
        key = app.metadata.get(IDEMPOTENCY_KEY)
        if key:
            common_labels[LABEL_IDEMPOTENCY_KEY] = _hash_key(str(key))

        containers: list[DockerContainer] = []
        for role in app.roles:
            for replica_id in range(role.num_replicas):
                values = macros.Values(
                    img_root="",
                    app_id=app_id,
                    replica_id=str(replica_id),
                    rank0_env=RANK0_ENV,
                )
                replica_role = values.apply(role)
                hostname = _hostname(role.name, replica_id)
                replica_env = {
                    **env,
                    **replica_role.env,
                    "SHIPYARD_APP_ID": app_id,
                    "SHIPYARD_APP_NAME": app.name,
                    "SHIPYARD_ROLE_NAME": role.name,
                    "SHIPYARD_REPLICA_ID": str(replica_id),
                    "SHIPYARD_NUM_REPLICAS": str(role.num_replicas),
                    RANK0_ENV: rank0_host,
                }
                labels = {
                    **common_labels,
                    LABEL_ROLE_NAME: role.name,
                    LABEL_REPLICA_ID: str(replica_id),
                    LABEL_NUM_REPLICAS: str(role.num_replicas),
                    LABEL_MAX_RETRIES: str(role.max_retries),
                }
                kwargs: dict[str, object] = {
                    "name": _container_name(app_id, role.name, replica_id),
                    "hostname": hostname,
                    "environment": replica_env,
                    "labels": labels,
                    "stop_timeout": stop_timeout,
                }
                if network:
                    kwargs["network"] = network
                    kwargs["networking_config"] = {network: {"Aliases": [hostname]}}
                if role.max_retries > 0:
                    if role.retry_policy != RetryPolicy.REPLICA:
                        log.debug(
                            "role %s: %s restarts failed replicas alone (retry_policy %s)",
                            role.name,
                            BACKEND,
                            role.retry_policy.value,
                        )
                    kwargs["restart_policy"] = {
                        "Name": "on-failure",
                        "MaximumRetryCount": role.max_retries,
                    }
                self._add_resources(role, kwargs)
                self._add_mounts(role, kwargs)
                containers.append(
                    DockerContainer(
                        image=role.image,
                        command=[replica_role.entrypoint, *replica_role.args],
                        kwargs=kwargs,
                    )
                )

        info: AppDryRunInfo[DockerJob] = AppDryRunInfo(DockerJob(app_id, containers), str)
        info._images_to_push = images_to_push
        return info

    @staticmethod
    def _add_resources(role: Role, kwargs: dict[str, object]) -> None:
        res = role.resource
        if res.cpu > 0:
            kwargs["nano_cpus"] = int(res.cpu * 1_000_000_000)
        if res.memMB > 0:
            kwargs["mem_limit"] = f"{res.memMB}m"
        if res.gpu > 0:
            kwargs["device_requests"] = [{"count": res.gpu, "capabilities": [["gpu"]]}]

    @staticmethod
    def _add_mounts(role: Role, kwargs: dict[str, object]) -> None:
        mounts: list[dict[str, object]] = []
        devices: list[str] = []
        for mount in role.mounts:
            if isinstance(mount, BindMount):
                mounts.append(
                    {
                        "Type": "bind",
                        "Source": mount.src_path,
                        "Target": mount.dst_path,
                        "ReadOnly": mount.read_only,
                    }
                )
            elif isinstance(mount, VolumeMount):
                mounts.append(
                    {
                        "Type": "volume",
                        "Source": mount.src,
                        "Target": mount.dst_path,
                        "ReadOnly": mount.read_only,
                    }
                )
            elif isinstance(mount, DeviceMount):
                devices.append(f"{mount.src_path}:{mount.dst_path}:{mount.permissions}")
        if mounts:
            kwargs["mounts"] = mounts
        if devices:
            kwargs["devices"] = devices

    # -- submitting --------------------------------------------------------------------------

    def schedule(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        """Creates the app's network and containers and starts them; returns the app id.

        The images must be present on the engine (they are never pulled). If anything fails,
        every container and the network created so far are removed before the error is raised.
        """
        from docker.errors import APIError, ImageNotFound

        req = dryrun_info.request
        self.push_images(dryrun_info._images_to_push)
        single = len(req.containers) == 1
        if not single:
            self._check_images(req, dryrun_info._app)
        # (a lone container needs no check first: if its image is missing, creating it fails
        # before anything started, with the same error)

        api = self._api
        network = next(
            (c.kwargs["network"] for c in req.containers if c.kwargs.get("network")), None
        )
        created: list[str] = []
        created_lock = threading.Lock()

        def create_and_start(container: DockerContainer) -> None:
            kwargs = self._create_kwargs(container)
            cid = api.create_container(**kwargs)["Id"]
            with created_lock:
                created.append(cid)
            api.start(cid)

        try:
            if network:
                api.create_network(
                    str(network),
                    driver="bridge",
                    labels={
                        LABEL_VERSION: "1",
                        LABEL_SESSION: self.session_name,
                        LABEL_APP_ID: req.app_id,
                    },
                )
            if single:
                create_and_start(req.containers[0])
            else:
                for fut in [self._executor().submit(create_and_start, c) for c in req.containers]:
                    fut.result()
        except BaseException as e:
            self._cleanup_failed_submit(created, network)
            if single and not created and isinstance(e, APIError):
                image = req.containers[0].image
                if isinstance(e, ImageNotFound):
                    raise self._missing_image_error(image, dryrun_info._app) from None
                why = str(e.explanation or e)
                if any(w in why.lower() for w in ("reference", "repository", "image", "tag")):
                    raise ValueError(
                        f"{self._image_field(image, dryrun_info._app)}: the Docker engine"
                        f" rejects image {image!r}: {why}"
                    ) from None
            if isinstance(e, APIError):
                why = str(e.explanation or e)
                if "docker0" in why:
                    why += (
                        " (the engine's default bridge docker0 is gone - a dockerd started with"
                        " --bridge=none on this host removes it; restart dockerd,"
                        " e.g. scripts/start_docker.sh)"
                    )
                raise RuntimeError(
                    f"{BACKEND}: submitting {req.app_id} failed (nothing left behind): {why}"
                ) from e
            raise
        log.info("submitted %s: %d container(s)", req.app_id, len(req.containers))
        return req.app_id

    def _create_kwargs(self, container: DockerContainer) -> dict[str, Any]:
        """``DockerContainer`` (``containers.create`` kwargs) → ``APIClient.create_container`` kwargs."""
        from docker.models.containers import _create_container_args

        kwargs = dict(container.kwargs)
        stop_timeout = kwargs.pop("stop_timeout", None)
        kwargs["image"] = container.image
        kwargs["command"] = list(container.command)
        kwargs["version"] = self._api._version
        create_kwargs = _create_container_args(kwargs)
        if stop_timeout is not None:
            create_kwargs["stop_timeout"] = stop_timeout
        return create_kwargs  # type: ignore[no-any-return]

    @staticmethod
    def _image_field(image: str, app: AppDef | None) -> str:
        for i, role in enumerate(app.roles if app is not None else []):
            if role.image == image:
                return f"roles[{i}].image"
        return "image"

    def _missing_image_error(self, image: str, app: AppDef | None) -> ValueError:
        return ValueError(
            f"{self._image_field(image, app)}: image {image!r} is not present on the Docker"
            " engine; build or load it first (local_docker never pulls images)"
        )

    def _check_images(self, req: DockerJob, app: AppDef | None) -> None:
        """Fails with a ValueError naming the role if an image is not on the engine."""
        from docker.errors import APIError, ImageNotFound

        images = list(dict.fromkeys(c.image for c in req.containers))

        def check(image: str) -> None:
            try:
                self._api.inspect_image(image)
            except ImageNotFound:
                raise self._missing_image_error(image, app) from None
            except APIError as e:
                raise ValueError(
                    f"{self._image_field(image, app)}: the Docker engine rejects image"
                    f" {image!r}: {e.explanation or e}"
                ) from None

        if len(images) == 1:
            check(images[0])
        else:
            for fut in [self._executor().submit(check, img) for img in images]:
                fut.result()

    def _cleanup_failed_submit(self, created: list[str], network: object) -> None:
        api = self._api
        for cid in created:
            try:
                api.remove_container(cid, force=True)
            except Exception:
                log.warning("could not remove container %s", cid[:12], exc_info=True)
        if network:
            try:
                api.remove_network(str(network))
            except Exception as e:
                if getattr(e, "status_code", None) != 404:
                    log.warning("could not remove network %s", network, exc_info=True)

    # -- describing --------------------------------------------------------------------------

    def _containers(self, label_filter: str) -> _Containers:
        return self._api.containers(  # type: ignore[no-any-return]
            all=True, filters={"label": label_filter}
        )

    def _tombstones(self, label_filter: str) -> _Containers:
        res = self._api.volumes(filters={"label": [LABEL_TOMBSTONE, label_filter]})
        return list(res.get("Volumes") or [])

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's state and the status of every replica, from one containers list call;
        ``None`` if the engine has no trace of the app. Roles are partial (name, image,
        num_replicas, max_retries)."""
        containers = self._containers(f"{LABEL_APP_ID}={app_id}")

        def tombstone() -> Mapping[str, str] | None:
            found = self._tombstones(f"{LABEL_APP_ID}={app_id}")
            return found[0]["Labels"] if found else None

        return self._resolve(app_id, containers, tombstone)

    def describe_many(self, app_ids: Iterable[str]) -> dict[str, DescribeAppResponse | None]:
        """Describes several apps from one containers list call (plus one volume list call if
        some of them have no containers or are being cancelled)."""
        app_ids = list(app_ids)
        if len(app_ids) == 1:
            return {app_ids[0]: self.describe(app_ids[0])}
        by_app: dict[str, _Containers] = {a: [] for a in app_ids}
        for c in self._containers(LABEL_APP_ID):
            app_id = (c.get("Labels") or {}).get(LABEL_APP_ID)
            if app_id in by_app:
                by_app[app_id].append(c)
        tombstones: dict[str, Mapping[str, str]] | None = None

        def tombstone_of(app_id: str) -> Mapping[str, str] | None:
            nonlocal tombstones
            if tombstones is None:
                tombstones = {
                    v["Labels"][LABEL_APP_ID]: v["Labels"]
                    for v in self._tombstones(LABEL_APP_ID)
                    if (v.get("Labels") or {}).get(LABEL_APP_ID)
                }
            return tombstones.get(app_id)

        return {
            app_id: self._resolve(app_id, by_app[app_id], functools.partial(tombstone_of, app_id))
            for app_id in app_ids
        }

    def _resolve(
        self,
        app_id: str,
        containers: _Containers,
        tombstone: Callable[[], Mapping[str, str] | None],
    ) -> DescribeAppResponse | None:
        """The response from the app's containers, or from its tombstone when it has no
        containers left or is being cancelled (its containers renamed); the tombstone is
        only looked up in those cases."""
        if not containers or any(_cancelling(c) for c in containers):
            tomb = tombstone()
            if tomb is not None:
                return self._from_tombstone(app_id, tomb)
            if not containers:
                return None
        resp = self._from_containers(app_id, containers)
        assert resp is not None
        if resp.state == AppState.UNKNOWN:  # replicas missing, the others ended
            tomb = tombstone()
            if tomb is not None:
                return self._from_tombstone(app_id, tomb)
            resp.state = AppState.FAILED
        return resp

    def _restart_counts(self, containers: _Containers) -> dict[str, int]:
        """RestartCount of the containers that may restart (the list API does not carry it)."""
        ids = [
            c["Id"]
            for c in containers
            if int((c.get("Labels") or {}).get(LABEL_MAX_RETRIES, "0") or 0) > 0
        ]
        if not ids:
            return {}
        from docker.errors import NotFound

        def count(cid: str) -> int:
            try:
                return int(self._api.inspect_container(cid).get("RestartCount") or 0)
            except NotFound:
                return 0

        if len(ids) == 1:
            return {ids[0]: count(ids[0])}
        futs = {cid: self._executor().submit(count, cid) for cid in ids}
        return {cid: f.result() for cid, f in futs.items()}

    def _from_containers(self, app_id: str, containers: _Containers) -> DescribeAppResponse | None:
        """Builds the response from containers list entries; state UNKNOWN when replicas are
        missing and the rest have ended (the caller decides between cancelled and failed)."""
        if not containers:
            return None
        labels0 = containers[0].get("Labels") or {}
        try:
            role_specs = json.loads(labels0.get(LABEL_ROLES, "[]"))
        except ValueError:
            role_specs = []
        restarts = self._restart_counts(containers)

        replicas: dict[tuple[str, int], ReplicaStatus] = {}
        msgs: list[str] = []
        for c in containers:
            labels = c.get("Labels") or {}
            role = labels.get(LABEL_ROLE_NAME, "")
            try:
                rid = int(labels.get(LABEL_REPLICA_ID, "0"))
            except ValueError:
                continue
            state, code = _replica_state(c.get("State", ""), c.get("Status", ""))
            if _cancelling(c):
                state = AppState.CANCELLED
            status = ReplicaStatus(
                id=rid,
                state=state,
                role=role,
                hostname=_hostname(role, rid),
                exit_code=code,
            )
            n = restarts.get(c["Id"], 0)
            if state == AppState.FAILED:
                what = f"exited with code {code}" if code is not None else "died"
                more = f" after {n} restart(s)" if n else ""
                status.structured_error_msg = json.dumps(
                    {"message": f"{role}/{rid} {what}{more}", "exit_code": code}
                )
                msgs.append(f"{role}/{rid} {what}{more}")
            replicas[(role, rid)] = status

        roles_statuses: list[RoleStatus] = []
        roles: list[Role] = []
        missing: list[str] = []
        known_roles = [s["name"] for s in role_specs] or sorted({r for r, _ in replicas})
        specs = {s["name"]: s for s in role_specs}
        for role_name in known_roles:
            spec = specs.get(role_name, {})
            n = int(spec.get("num_replicas", 0)) or (
                1 + max((rid for r, rid in replicas if r == role_name), default=0)
            )
            rs = RoleStatus(role_name)
            for rid in range(n):
                found = replicas.get((role_name, rid))
                if found is None:
                    missing.append(f"{role_name}/{rid}")
                    found = ReplicaStatus(
                        id=rid,
                        state=AppState.UNKNOWN,
                        role=role_name,
                        hostname=_hostname(role_name, rid),
                    )
                rs.replicas.append(found)
            roles_statuses.append(rs)
            roles.append(
                Role(
                    name=role_name,
                    image=str(spec.get("image", "")),
                    num_replicas=n,
                    max_retries=int(spec.get("max_retries", 0)),
                    retry_policy=RetryPolicy.REPLICA,
                )
            )

        present = [r for r in replicas.values()]
        states = [r.state for r in present]
        if AppState.CANCELLED in states:
            state = AppState.CANCELLED
        elif AppState.FAILED in states:
            state = AppState.FAILED
        elif missing and all(is_terminal(s) or s == AppState.UNKNOWN for s in states):
            state = AppState.UNKNOWN
            msgs.append(f"replica container(s) missing: {', '.join(missing)}")
        elif not missing and all(s == AppState.SUCCEEDED for s in states):
            state = AppState.SUCCEEDED
        elif any(s in (AppState.RUNNING, AppState.SUCCEEDED) for s in states):
            state = AppState.RUNNING
        else:
            state = AppState.PENDING
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=max(restarts.values(), default=0),
            msg="; ".join(msgs) if msgs else NONE,
            roles_statuses=roles_statuses,
            roles=roles,
        )

    @staticmethod
    def _from_tombstone(app_id: str, labels: Mapping[str, str]) -> DescribeAppResponse:
        try:
            state = AppState[labels.get(LABEL_STATE, "CANCELLED")]
        except KeyError:
            state = AppState.CANCELLED
        try:
            replicas = json.loads(labels.get(LABEL_REPLICAS, "[]"))
            role_specs = json.loads(labels.get(LABEL_ROLES, "[]"))
        except ValueError:
            replicas, role_specs = [], []
        by_role: dict[str, RoleStatus] = {}
        for spec in role_specs:
            by_role[spec["name"]] = RoleStatus(spec["name"])
        for r in replicas:
            rs = by_role.setdefault(r["role"], RoleStatus(r["role"]))
            rs.replicas.append(
                ReplicaStatus(
                    id=int(r["id"]),
                    state=AppState[r["state"]],
                    role=r["role"],
                    hostname=_hostname(r["role"], int(r["id"])),
                    exit_code=r.get("exit_code"),
                )
            )
        for rs in by_role.values():
            rs.replicas.sort(key=lambda r: r.id)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=int(labels.get(LABEL_NUM_RESTARTS, "0") or 0),
            msg="; ".join(
                m
                for m in (
                    "cancelled" if state == AppState.CANCELLED else "",
                    labels.get(LABEL_MSG, ""),
                    "containers and network removed",
                )
                if m and m != NONE
            ),
            roles_statuses=list(by_role.values()),
            roles=[
                Role(
                    name=s["name"],
                    image=str(s.get("image", "")),
                    num_replicas=int(s.get("num_replicas", 1)),
                    max_retries=int(s.get("max_retries", 0)),
                    retry_policy=RetryPolicy.REPLICA,
                )
                for s in role_specs
            ],
        )

    def list(self) -> list[ListAppResponse]:
        """The apps of this session (running, ended, or cancelled) with their states."""
        session_filter = f"{LABEL_SESSION}={self.session_name}"
        tomb_future = self._executor().submit(self._tombstones, session_filter)
        by_app: dict[str, _Containers] = {}
        for c in self._containers(session_filter):
            app_id = (c.get("Labels") or {}).get(LABEL_APP_ID)
            if app_id:
                by_app.setdefault(app_id, []).append(c)
        tombs = {
            v["Labels"][LABEL_APP_ID]: v["Labels"]
            for v in tomb_future.result()
            if (v.get("Labels") or {}).get(LABEL_APP_ID)
        }
        out: list[ListAppResponse] = []
        for app_id in sorted(set(by_app) | set(tombs)):
            tomb = tombs.get(app_id)
            if tomb is not None:
                state = AppState.__members__.get(tomb.get(LABEL_STATE, ""), AppState.CANCELLED)
            else:
                state = self._list_state(by_app[app_id])
            out.append(ListAppResponse(app_id=app_id, state=state))
        return out

    @staticmethod
    def _list_state(containers: _Containers) -> AppState:
        states = [
            AppState.CANCELLED
            if _cancelling(c)
            else _replica_state(c.get("State", ""), c.get("Status", ""))[0]
            for c in containers
        ]
        labels0 = containers[0].get("Labels") or {}
        try:
            expected = sum(int(s["num_replicas"]) for s in json.loads(labels0[LABEL_ROLES]))
        except (KeyError, ValueError, TypeError):
            expected = len(containers)
        if AppState.CANCELLED in states:
            return AppState.CANCELLED
        if AppState.FAILED in states or AppState.UNKNOWN in states:
            return AppState.FAILED
        if len(states) >= expected and all(s == AppState.SUCCEEDED for s in states):
            return AppState.SUCCEEDED
        if len(states) < expected and all(is_terminal(s) for s in states):
            return AppState.FAILED
        if any(s in (AppState.RUNNING, AppState.SUCCEEDED) for s in states):
            return AppState.RUNNING
        return AppState.PENDING

    def find_by_idempotency_key(
        self, key: str, cfg: Mapping[str, CfgVal] | None = None
    ) -> str | None:
        """The newest app (of any session) submitted with ``key``, including cancelled ones."""
        label = f"{LABEL_IDEMPOTENCY_KEY}={_hash_key(key)}"
        candidates: dict[str, float] = {}
        for labels in [c.get("Labels") or {} for c in self._containers(label)] + [
            v.get("Labels") or {} for v in self._tombstones(label)
        ]:
            app_id = labels.get(LABEL_APP_ID)
            if app_id:
                try:
                    submitted = float(labels.get(LABEL_SUBMITTED, "0"))
                except ValueError:
                    submitted = 0.0
                candidates[app_id] = max(candidates.get(app_id, 0.0), submitted)
        if not candidates:
            return None
        return max(candidates, key=lambda a: candidates[a])

    # -- cancelling --------------------------------------------------------------------------

    def cancel(self, app_id: str) -> None:
        """Stops every replica (in parallel; SIGKILL after the app's ``stop_timeout``), removes
        the containers and the app's network, and records the final state in a tombstone volume
        (CANCELLED unless the app had already ended). Idempotent; unknown apps are ignored."""
        containers = self._containers(f"{LABEL_APP_ID}={app_id}")
        if containers:
            self._write_tombstone(app_id, containers)
            self._stop_and_remove(containers)
        self._remove_networks(app_id)

    def _cancel_existing(self, app_id: str) -> None:
        self.cancel(app_id)

    def _write_tombstone(self, app_id: str, containers: _Containers) -> None:
        from docker.errors import APIError

        name = TOMBSTONE_PREFIX + app_id
        if self._tombstones(f"{LABEL_APP_ID}={app_id}"):
            return  # a cancel already recorded the final state
        resp = self._from_containers(app_id, containers)
        assert resp is not None
        final = resp.state if is_terminal(resp.state) else AppState.CANCELLED
        replicas = []
        for rs in resp.roles_statuses:
            for r in rs.replicas:
                state = r.state if is_terminal(r.state) else AppState.CANCELLED
                replicas.append(
                    {"role": r.role, "id": r.id, "state": state.name, "exit_code": r.exit_code}
                )
        labels0 = containers[0].get("Labels") or {}
        labels = {
            k: v
            for k, v in labels0.items()
            if k
            in (
                LABEL_VERSION,
                LABEL_SESSION,
                LABEL_APP_ID,
                LABEL_APP_NAME,
                LABEL_ROLES,
                LABEL_SUBMITTED,
                LABEL_IDEMPOTENCY_KEY,
            )
        }
        labels.update(
            {
                LABEL_TOMBSTONE: "1",
                LABEL_STATE: final.name,
                LABEL_REPLICAS: json.dumps(replicas, separators=(",", ":")),
                LABEL_NUM_RESTARTS: str(max(resp.num_restarts, 0)),
                LABEL_MSG: resp.msg,
            }
        )
        try:
            self._api.create_volume(name=name, driver="local", labels=labels)
        except APIError as e:
            log.warning("could not record the cancellation of %s: %s", app_id, e)

    def _stop_and_remove(self, containers: _Containers) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from docker.errors import APIError, NotFound

        api = self._api

        def stop_and_remove(c: dict[str, Any]) -> None:
            labels = c.get("Labels") or {}
            try:
                timeout = int(labels.get(LABEL_STOP_TIMEOUT, DEFAULT_STOP_TIMEOUT))
            except ValueError:
                timeout = DEFAULT_STOP_TIMEOUT
            try:
                if not _cancelling(c):
                    name = ((c.get("Names") or [""])[0]).lstrip("/") or c["Id"][:12]
                    api.rename(c["Id"], name + CANCELLED_SUFFIX)
                if c.get("State") in ("running", "restarting", "paused"):
                    api.stop(c["Id"], timeout=timeout)
                api.remove_container(c["Id"], force=True)
            except NotFound:
                pass
            except APIError as e:
                if e.status_code == 409:  # removal already in progress
                    return
                raise

        if len(containers) == 1:
            stop_and_remove(containers[0])
            return
        # One thread per container: every replica gets its grace period at the same time.
        with ThreadPoolExecutor(
            max_workers=min(len(containers), 64), thread_name_prefix="shipyard-docker-stop"
        ) as pool:
            for fut in [pool.submit(stop_and_remove, c) for c in containers]:
                fut.result()

    def _remove_networks(self, app_id: str) -> None:
        from docker.errors import NotFound

        for net in self._api.networks(filters={"label": f"{LABEL_APP_ID}={app_id}"}):
            try:
                self._api.remove_network(net["Id"])
            except NotFound:
                pass

    def purge(self, app_id: str) -> None:
        """Cancels the app if needed and removes its tombstone: no trace of it is left."""
        self.cancel(app_id)
        from docker.errors import NotFound

        for vol in self._tombstones(f"{LABEL_APP_ID}={app_id}"):
            try:
                self._api.remove_volume(vol["Name"], force=True)
            except NotFound:
                pass

    # -- logs --------------------------------------------------------------------------------

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
        """Log lines of replica ``k`` of ``role_name``, from the engine's log of its container.

        ``since``/``until`` are applied by the engine to the lines' Docker timestamps;
        ``streams`` picks stdout, stderr or both (combined, the default); ``should_tail``
        follows the replica until it has ended for good (across restarts).

        Raises:
            ValueError: if the replica's container does not exist (never did, or the app was
                cancelled and its containers removed).
        """
        from docker.errors import NotFound

        stream = check_stream(streams, list(Stream))
        since_ts = _timestamp(since, "since")
        until_ts = _timestamp(until, "until")
        name = _container_name(app_id, role_name, k)
        want_out = stream in (Stream.STDOUT, Stream.COMBINED)
        want_err = stream in (Stream.STDERR, Stream.COMBINED)
        try:
            if not should_tail:
                params = {
                    "stdout": want_out,
                    "stderr": want_err,
                    "follow": False,
                    "since": since_ts,
                    "until": until_ts,
                }
                pieces = [p for p, _ in self._log_messages(name, params, None, None)]
                text = b"".join(pieces).decode("utf-8", errors="replace")
                lines: Iterable[str] = split_lines(text)
                return list(filter_regex(regex, lines)) if regex else lines
            # Fail here (not on first next()) if the container does not exist.
            info = self._api.inspect_container(name)
        except NotFound:
            raise self._no_logs_error(app_id, role_name, k) from None
        lines = self._follow(name, info, want_out, want_err, since_ts, until_ts)
        return filter_regex(regex, lines)

    def _no_logs_error(self, app_id: str, role_name: str, k: int) -> ValueError:
        if self._tombstones(f"{LABEL_APP_ID}={app_id}"):
            return ValueError(
                f"app {app_id}: logs of {role_name}/{k} are gone: the app was cancelled and its"
                " containers removed"
            )
        return ValueError(f"app {app_id}: no replica {role_name}/{k} (no container {app_id}-...)")

    def _follow(
        self,
        name: str,
        info: dict[str, Any],
        want_out: bool,
        want_err: bool,
        since_ts: float | None,
        until_ts: float | None,
    ) -> Iterator[str]:
        """Log lines of a container, following it through its restarts until it has ended for
        good (or ``until`` is reached).

        Messages are read with their Docker timestamps: when a follow stream ends, the next
        read resumes after the last message seen, so nothing is repeated, and a final plain
        read picks up what a follow stream can miss when the container exits (e.g. a last line
        without a newline). A partial line at the end of a run is yielded as it is.
        """
        from docker.errors import NotFound

        last = b""  # timestamp of the last message seen: fixed width, compares as bytes
        started = info["State"].get("StartedAt", "")
        tty = bool((info.get("Config") or {}).get("Tty"))
        follow = True
        while True:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            params: dict[str, Any] = {
                "stdout": want_out,
                "stderr": want_err,
                "follow": follow,
                "since": since_ts,
                "until": until_ts,
            }
            pending = ""
            try:
                for payload, ts in self._log_messages(name, params, tty, last):
                    last = ts
                    head, sep, pending = (pending + decoder.decode(payload)).rpartition("\n")
                    if sep:
                        yield from split_lines(head + sep)
            except NotFound:
                return
            pending += decoder.decode(b"", final=True)
            if pending:
                yield pending
            if not follow or (until_ts is not None and until_ts <= time.time()):
                return
            # The stream ends when the container stops. Docker may start it again (restart
            # policy): then follow the next run; else read once more and stop.
            while True:
                try:
                    state = self._api.inspect_container(name)["State"]
                except NotFound:
                    return
                if state.get("StartedAt", "") != started:
                    started = state.get("StartedAt", "")
                    break
                if state.get("Running") and not state.get("Restarting"):
                    break  # same run: the stream was cut short
                if not state.get("Restarting"):
                    follow = False
                    break
                time.sleep(0.05)
            resume = _parse_docker_time(last.decode("ascii", "replace")) if last else None
            if resume is not None:
                since_ts = max(resume - 1e-6, since_ts or 1e-9)

    def _log_messages(
        self, name: str, params: dict[str, Any], tty: bool | None, last: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(payloads, last timestamp)`` for each read of a container's log stream.

        With ``last`` (bytes) the messages are requested with timestamps, only those newer
        than ``last`` are kept and their timestamps are stripped; with ``None``, plain messages.
        ``tty``: whether the container has a terminal (its output is not framed); ``None``:
        tell from the first bytes.

        The engine sends each message as one frame (8-byte header: stream, size) in one HTTP
        chunk. Reading them through the SDK (or http.client) costs several small reads per
        message; here the response is read in large pieces (whatever has arrived) and the
        chunks and frames are parsed from them.
        """
        api = self._api
        stamped = last is not None
        query: dict[str, Any] = {
            "stdout": int(params["stdout"]),
            "stderr": int(params["stderr"]),
            "follow": int(params["follow"]),
            "timestamps": int(stamped),
            "tail": "all",
        }
        for key in ("since", "until"):
            if params.get(key) is not None:
                query[key] = params[key]
        try:
            res = api._get(
                api._url("/containers/{0}/logs", name), params=query, stream=True, timeout=None
            )
        except AttributeError:  # an SDK without these internals: its public (slower) stream
            yield from self._log_messages_public(name, params, last)
            return
        latest = last or b""
        skip = _TS_LEN if stamped else 0
        try:
            api._raise_for_status(res)
            buf = bytearray()
            for data in _body_reader(res.raw):
                buf += data
                if tty is None and len(buf) >= 4:
                    # a frame header starts with the stream (0, 1, 2) and three zero bytes
                    tty = not (buf[0] in (0, 1, 2) and buf[1:4] == b"\0\0\0")
                elif tty is None:
                    continue
                out: list[bytes | bytearray] = []
                if tty:  # no frames: lines
                    end = buf.rfind(b"\n") + 1
                    for line in bytes(buf[:end]).splitlines(keepends=True):
                        if not stamped:
                            out.append(line)
                        elif line[: _TS_LEN - 1] > latest:
                            latest = line[: _TS_LEN - 1]
                            out.append(line[_TS_LEN:])
                    del buf[:end]
                else:
                    pos, n = 0, len(buf)
                    while n - pos >= 8:
                        end = pos + 8 + _FRAME_SIZE(buf, pos + 4)[0]
                        if end > n:
                            break
                        if not stamped:
                            out.append(buf[pos + 8 : end])
                        elif (ts := bytes(buf[pos + 8 : pos + 7 + _TS_LEN])) > latest:
                            latest = ts
                            out.append(buf[pos + 8 + skip : end])
                        pos = end
                    del buf[:pos]
                if out:
                    yield b"".join(out), latest
            if buf and tty is not False:  # a terminal's last line without a newline
                yield bytes(buf[skip:]), latest
        finally:
            res.close()

    def _log_messages_public(
        self, name: str, params: dict[str, Any], last: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        latest = last or b""
        stamped = last is not None
        for frame in self._api.logs(name, stream=True, timestamps=stamped, **params):
            if not stamped:
                yield frame, latest
            elif frame[: _TS_LEN - 1] > latest:
                latest = frame[: _TS_LEN - 1]
                yield frame[_TS_LEN:], latest


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    """Creates a :class:`DockerScheduler` (``local_docker``) for ``session_name``.

    Keyword arguments: ``docker_client`` (a ``docker.DockerClient``); others are ignored.
    """
    return DockerScheduler(session_name, docker_client=kwargs.get("docker_client"))
