"""The ``local_docker`` scheduler's public names, where the specification puts them (the code
lives in the package :mod:`core.schedulers.docker`)."""

from core.schedulers.docker import (
    DockerContainer,
    DockerEngine,
    DockerJob,
    DockerOpts,
    DockerScheduler,
    create_scheduler,
    has_docker,
)
from core.schedulers.docker.engine import connect
from core.schedulers.docker.model import (
    CANCELLED_SUFFIX,
    LABEL_APP_ID,
    LABEL_IDEMPOTENCY_KEY,
    LABEL_SESSION,
    RANK0_ENV,
    TOMBSTONE_PREFIX,
)

__all__ = [
    "CANCELLED_SUFFIX",
    "LABEL_APP_ID",
    "LABEL_IDEMPOTENCY_KEY",
    "LABEL_SESSION",
    "RANK0_ENV",
    "TOMBSTONE_PREFIX",
    "DockerContainer",
    "DockerEngine",
    "DockerJob",
    "DockerOpts",
    "DockerScheduler",
    "connect",
    "create_scheduler",
    "has_docker",
]
