"""What the ``local_docker`` scheduler writes into the engine: the request types, the label
names, how containers, networks and record volumes are named, and how a container's listed state
reads as a replica state. Every other module of the package reads the engine through these
names; none invents its own.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime

from core.specs import AppState

BACKEND = "local_docker"

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
LABEL_RETENTION = "shipyard.retention"
LABEL_RECORD_RETENTION = "shipyard.record_retention"
LABEL_SUBMITTED = "shipyard.submitted"
LABEL_IDEMPOTENCY_KEY = "shipyard.idempotency_key"
#: when a submission whose containers have not all started counts as interrupted
LABEL_DEADLINE = "shipyard.submit_deadline"
# record volumes: a key's claim, or an app's tombstone (final state, archived logs)
LABEL_CLAIM = "shipyard.claim"
LABEL_TOMBSTONE = "shipyard.tombstone"
LABEL_STATE = "shipyard.state"
LABEL_REPLICAS = "shipyard.replicas"
LABEL_NUM_RESTARTS = "shipyard.num_restarts"
LABEL_ATTEMPTS = "shipyard.attempts"
LABEL_MSG = "shipyard.msg"
LABEL_ENDED = "shipyard.ended"
#: a keyed submission's request (:meth:`DockerJob.encode`), kept until its containers start
LABEL_REQUEST = "shipyard.request"
#: where a container's result file is (``$SHIPYARD_RESULT_FILE``), and whose are collected
LABEL_RESULT_FILE = "shipyard.result_file"
LABEL_RESULT_REPLICAS = "shipyard.result_replicas"
#: seconds of a replica's time limit (it runs under the script of :mod:`.timelimit`)
LABEL_TIME_LIMIT = "shipyard.time_limit"
#: times the script starts a replica again at its time limit (requeue_on_timeout)
LABEL_REQUEUES = "shipyard.requeues"
#: a container's result file unless its role's env names another
RESULT_PATH = "/shipyard-result.json"

#: labels an app's containers share that its tombstone keeps
APP_LABELS = (
    LABEL_VERSION,
    LABEL_SESSION,
    LABEL_APP_ID,
    LABEL_APP_NAME,
    LABEL_ROLES,
    LABEL_SUBMITTED,
    LABEL_IDEMPOTENCY_KEY,
    LABEL_RECORD_RETENTION,
)

TOMBSTONE_PREFIX = "shipyard-tombstone-"
CLAIM_PREFIX = "shipyard-key-"
#: the volume holding a keyed submission's request while it is under way (see ``submit``)
REQUEST_PREFIX = "shipyard-submit-"
#: cancel renames each container ``{name}{CANCELLED_SUFFIX}`` before stopping it, so that a
#: concurrent describe knows the replica's exit is a cancellation (not a failure or success)
CANCELLED_SUFFIX = "--cancelled"
#: environment variable holding the hostname of replica 0 of the first role
RANK0_ENV = "SHIPYARD_RANK0_HOST"
DEFAULT_STOP_TIMEOUT = 10
#: seconds an ended app's containers are kept before their logs are archived and they are removed
DEFAULT_RETENTION = 3600
DEFAULT_RECORD_RETENTION = 7 * 86400  # (as local apps' directories)
#: seconds after which a submission whose replicas are not all started is taken as interrupted
SUBMIT_GRACE = 60.0

_EXIT_CODE_RE = re.compile(r"\((-?\d+)\)")
_DOCKER_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


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
    """The request :meth:`DockerScheduler.schedule` submits: the app id, its containers, and
    when their images are pulled (``missing``, ``always`` or ``never``)."""

    app_id: str
    containers: list[DockerContainer]
    pull: str = "missing"
    #: the volume kept across the app's attempts ($SHIPYARD_CHECKPOINT_DIR), if it has one
    checkpoint_volume: str | None = None

    def __str__(self) -> str:
        return json.dumps(
            {
                "app_id": self.app_id,
                "pull": self.pull,
                **({"checkpoint_volume": self.checkpoint_volume} if self.checkpoint_volume else {}),
                "containers": [
                    {"image": c.image, "command": c.command, "kwargs": c.kwargs}
                    for c in self.containers
                ],
            },
            indent=2,
            default=str,
        )

    def encode(self) -> str:
        """The job as a compact label value (compressed JSON): see :meth:`decode`."""
        data = {
            "app_id": self.app_id,
            "pull": self.pull,
            "checkpoint_volume": self.checkpoint_volume,
            "containers": [[c.image, c.command, c.kwargs] for c in self.containers],
        }
        raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
        return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> DockerJob:
        """The job :meth:`encode` gave ``text`` for (its kwargs are plain JSON values)."""
        data = json.loads(zlib.decompress(base64.b64decode(text)))
        containers = [DockerContainer(i, list(c), dict(kw)) for i, c, kw in data["containers"]]
        return cls(data["app_id"], containers, data["pull"], data.get("checkpoint_volume"))

    @property
    def network(self) -> str | None:
        """The app's own network (apps of more than one container), else None."""
        return next(
            (str(c.kwargs["network"]) for c in self.containers if "network" in c.kwargs), None
        )


def hostname(role_name: str, replica_id: int) -> str:
    """The hostname of a replica, on the app's network."""
    return f"{role_name}-{replica_id}"


def container_name(app_id: str, role_name: str, replica_id: int) -> str:
    """The name of a replica's container."""
    return f"{app_id}-{role_name}-{replica_id}"


def hash_key(key: str) -> str:
    """The form in which an idempotency key is stored (labels and names are visible to all)."""
    import hashlib  # (here: only keyed submits; start-up)

    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def claim_name(key: str) -> str:
    """The name of the volume that claims an idempotency key: the engine keeps one per name."""
    return CLAIM_PREFIX + hash_key(key)


def request_name(app_id: str) -> str:
    """The name of the volume holding the request of an app's keyed submission."""
    return REQUEST_PREFIX + app_id


def is_cancelling(container: dict[str, object]) -> bool:
    """Whether cancel has renamed this container (it is about to be stopped and removed)."""
    names = container.get("Names") or ()
    assert isinstance(names, list | tuple)
    return any(str(n).endswith(CANCELLED_SUFFIX) for n in names)


def replica_state(state: str, status: str) -> tuple[AppState, int | None]:
    """Replica state and exit code from the ``State``/``Status`` of a containers list entry."""
    if state == "running":
        return AppState.RUNNING, None
    if state in ("created", "restarting", "paused"):
        # restarting: it failed and Docker starts it again after a back-off
        return AppState.PENDING, None
    if state == "exited":
        m = _EXIT_CODE_RE.search(status)
        if m is None:
            return AppState.UNKNOWN, None
        code = int(m.group(1))
        return (AppState.SUCCEEDED if code == 0 else AppState.FAILED), code
    if state == "dead":
        return AppState.FAILED, None
    if state == "removing":
        return AppState.CANCELLED, None
    return AppState.UNKNOWN, None


def parse_docker_time(value: str) -> float | None:
    """Seconds since the epoch of a Docker RFC 3339 (nanosecond) timestamp, None for 'never'."""
    if not value or value.startswith("0001-01-01"):
        return None
    m = _DOCKER_TIME_RE.match(value)
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + tz).timestamp()
    frac = m.group(2) or "0"
    return base + int(frac) / 10 ** len(frac)
