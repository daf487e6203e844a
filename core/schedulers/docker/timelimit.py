"""Time limits of Docker apps (``time_limit``, ``checkpoint_signal``, ``requeue_on_timeout``):
the engine has none, so a replica with a limit runs under a small ``/bin/sh`` script that is
the container's first process (the image must have ``/bin/sh``; pre-flight says so).

The script starts the replica's command, sends it the checkpoint signal ``checkpoint_grace``
seconds before the limit, and SIGTERM at the limit (SIGKILL ``stop_timeout`` seconds later, as
``docker stop``). A ``docker stop`` (a cancel) reaches the command as SIGTERM. The limit counts
from the start of each attempt. A command ended by the limit starts again as the next attempt
while ``max_requeues`` allows it (``requeue_on_timeout``); otherwise the container exits with
:data:`TIMEOUT_CODE`, read back as reason ``timeout``. A failed command is retried by the script
as well (``max_retries``; the engine's restart policy is not used, so that a time limit is never
taken for a failure to restart). Each attempt that is started again leaves a line in
:data:`ATTEMPTS_PATH` in the container's filesystem ("NUMBER REASON EXIT_CODE") and one in its
stderr.
"""

from __future__ import annotations

from typing import Any

from core.limits import Limits, limit_command, parse_attempts
from core.specs import Attempt

__all__ = [
    "ATTEMPTS_PATH",
    "CHECKPOINT_PATH",
    "read_attempts",
    "wrapper",
]

#: where the script records the attempts it started again (in the container's own filesystem)
ATTEMPTS_PATH = "/tmp/.shipyard-attempts"
#: where the app's checkpoint volume is mounted in every replica ($SHIPYARD_CHECKPOINT_DIR)
CHECKPOINT_PATH = "/shipyard-checkpoint"


def wrapper(limits: Limits, kill_after: int, retries: int, requeues: int) -> list[str]:
    """The container entrypoint that runs its command (the image's entrypoint, then the
    role's: they follow it) under ``limits``, which have a time limit."""
    return limit_command(limits, kill_after, retries, requeues, ATTEMPTS_PATH)


def read_attempts(api: Any, cid: str, host: str = "") -> list[Attempt]:
    """The attempts container ``cid`` started again (none if it has no record of any)."""
    from docker.errors import APIError, NotFound

    from core.schedulers.docker.outcome import untar_one

    try:
        chunks, _ = api.get_archive(cid, ATTEMPTS_PATH)
        data = untar_one(chunks, ATTEMPTS_PATH)
    except (NotFound, APIError, ValueError):
        return []
    return parse_attempts(data.decode(errors="replace"), host) if isinstance(data, bytes) else []
