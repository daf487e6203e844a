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

import math
from typing import Any

from core.limits import ATTEMPT_ENV, Limits
from core.specs import Attempt, Reason

__all__ = [
    "ATTEMPTS_PATH",
    "CHECKPOINT_PATH",
    "TIMEOUT_CODE",
    "parse_attempts",
    "read_attempts",
    "wrapper",
]

#: the exit code of a container whose command the time limit ended (as GNU ``timeout``'s)
TIMEOUT_CODE = 124
#: where the script records the attempts it started again (in the container's own filesystem)
ATTEMPTS_PATH = "/tmp/.shipyard-attempts"
#: where the app's checkpoint volume is mounted in every replica ($SHIPYARD_CHECKPOINT_DIR)
CHECKPOINT_PATH = "/shipyard-checkpoint"

# $1 signal ('' for none), $2 seconds to it, $3 seconds from it to the limit, $4 seconds from
# SIGTERM to SIGKILL, $5 retries, $6 requeues; then the command. A background command of a
# non-interactive shell ignores SIGINT and SIGQUIT, so those are forwarded only if the command
# sets its own handler.
_SCRIPT = f"""\
sig=$1 at=$2 rest=$3 kill_after=$4 retries=$5 requeues=$6
shift 6
attempt=0 retried=0 requeued=0 child= stopping= expired=
stop() {{ stopping=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null; }}
expire() {{ expired=1; kill -TERM "$child" 2>/dev/null; }}
trap stop TERM INT HUP
trap expire ALRM
again() {{
    echo "$attempt $1 $code" >>{ATTEMPTS_PATH} 2>/dev/null
    echo "shipyard: attempt $attempt ended ($1, exit code $code); starting attempt \
$((attempt + 1))" >&2
    attempt=$((attempt + 1))
}}
while [ -z "$stopping" ]; do
    expired=
    {ATTEMPT_ENV}=$attempt
    export {ATTEMPT_ENV}
    "$@" &
    child=$!
    (
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        nap() {{ sleep "$1" & s=$!; wait "$s"; }}
        nap "$at"
        [ -z "$sig" ] || kill -s "$sig" "$child" 2>/dev/null
        nap "$rest"
        kill -s ALRM $$
        nap "$kill_after"
        kill -s KILL "$child" 2>/dev/null
    ) &
    timer=$!
    while :; do
        wait "$child"
        code=$?
        kill -0 "$child" 2>/dev/null || break
    done
    kill "$timer" 2>/dev/null
    child=
    [ -z "$stopping" ] || break
    if [ -n "$expired" ]; then
        [ "$requeued" -lt "$requeues" ] || exit {TIMEOUT_CODE}
        requeued=$((requeued + 1))
        again {Reason.TIMEOUT}
    elif [ "$code" -ne 0 ] && [ "$retried" -lt "$retries" ]; then
        retried=$((retried + 1))
        again {Reason.EXIT_CODE}
    else
        exit "$code"
    fi
done
exit "${{code:-143}}"
"""


def wrapper(limits: Limits, kill_after: int, retries: int, requeues: int) -> list[str]:
    """The container entrypoint that runs its command under ``limits`` (which has a time
    limit); the command (the image's entrypoint, then the role's) follows it."""
    assert limits.time_limit is not None
    limit = max(1, math.ceil(limits.time_limit))
    at = limit if limits.signal_at is None else max(0, math.floor(limits.signal_at))
    return [
        "/bin/sh",
        "-c",
        _SCRIPT,
        "shipyard-limit",
        limits.signal or "",
        str(at),
        str(limit - at),
        str(kill_after),
        str(retries),
        str(requeues),
    ]


def parse_attempts(text: str, host: str = "") -> list[Attempt]:
    """The attempts of an :data:`ATTEMPTS_PATH` file (lines it cannot read are skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        reason = parts[1]
        state = "TIMEOUT" if reason == Reason.TIMEOUT else "FAILED"
        out.append(Attempt(int(parts[0]), state, reason, host))
    return out


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
