"""Starting the replicas of a local app: each one a ``/bin/sh wrapper.sh ... COMMAND`` process
in a process group of its own, started with ``posix_spawn``, all held at one start gate until
the app is recorded.

Nothing runs unrecorded: the wrappers wait at the gate (a pipe on their fd 3) while the
submitter writes the app record; it then writes one line per replica. If the submitter dies
first they read end-of-file instead, and a wrapper whose app has no record exits without
starting its command.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.schedulers.local.processes import Identity

__all__ = ["WRAPPER", "Gate", "ReplicaLaunch", "check_command_size", "spawn"]

#: the replicas' wrapper script (run by /bin/sh; see its comments)
WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrapper.sh")
SHELL = "/bin/sh"

# Replicas start with every signal at its default disposition, as a fresh process: ignored
# signals would be inherited (Python ignores SIGPIPE) and a shell cannot trap a signal ignored
# on entry.
_SIGDEF = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))

#: the longest single argument or variable Linux takes (MAX_ARG_STRLEN: 32 pages)
MAX_ARG_STRLEN = 32 * 4096


@dataclass
class ReplicaLaunch:
    """What to start for one replica: its command, its whole environment, its log files and
    working directory ('' for the submitter's)."""

    index: int
    args: list[str]
    env: dict[bytes, bytes]
    stdout: str
    stderr: str
    cwd: str


def environ_size(env: Mapping[bytes, bytes]) -> int:
    """What ``env`` takes of ``ARG_MAX``: each ``KEY=VALUE``, its NUL and its pointer."""
    return sum(len(k) + len(v) + 2 + 8 for k, v in env.items())


def check_command_size(
    args: Sequence[str], env: Mapping[str, str], where: str, base_size: int = 0
) -> None:
    """Raises ``ValueError`` naming ``where`` if the command line and environment (``env``
    added to an environment of ``base_size``, see :func:`environ_size`) are more than the
    system takes (``E2BIG`` from exec): ``ARG_MAX`` in all, ``MAX_ARG_STRLEN`` each."""
    limit = os.sysconf("SC_ARG_MAX")
    words = [os.fsencode(a) for a in args] + [os.fsencode(f"{k}={v}") for k, v in env.items()]
    longest = max((len(w) for w in words), default=0)
    if longest >= MAX_ARG_STRLEN:
        raise ValueError(
            f"{where}: an argument or environment variable of {longest} bytes is more than this"
            f" system takes ({MAX_ARG_STRLEN - 1} bytes each)"
        )
    # every string, its NUL and its pointer; the wrapper's own arguments are a few hundred
    total = sum(len(w) + 1 + 8 for w in words) + base_size + 4096
    if total > limit:
        raise ValueError(
            f"{where}: the command line and environment take {total} bytes; this system takes"
            f" {limit} (ARG_MAX)"
        )


class Gate:
    """The start gate of one submit: a pipe whose read end is the replicas' fd 3."""

    def __init__(self) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        if r == 3:  # fd 3 is where the replicas get it: never dup2'ed onto itself
            r2 = os.dup(r)
            os.close(r)
            r = r2
        self.read_fd, self.write_fd = r, w

    def open(self, replicas: int) -> None:
        """Lets ``replicas`` wrappers go on (one line each), then closes the gate."""
        try:
            data = b"\n" * replicas
            while data:
                data = data[os.write(self.write_fd, data) :]
        finally:
            self.close()

    def close(self) -> None:
        """Closes both ends (wrappers still waiting then read end-of-file)."""
        for fd in (self.write_fd, self.read_fd):
            if fd >= 0:
                os.close(fd)
        self.write_fd = self.read_fd = -1


def spawn(app_dir: str, launch: ReplicaLaunch, gate: Gate, devnull: int) -> tuple[Identity, float]:
    """Starts one replica's wrapper (held at ``gate``); its identity and spawn time."""
    import time

    argv = [SHELL, WRAPPER, app_dir, str(launch.index), launch.stdout, launch.stderr, launch.cwd]
    actions = [
        (os.POSIX_SPAWN_DUP2, devnull, 0),
        (os.POSIX_SPAWN_DUP2, devnull, 1),
        (os.POSIX_SPAWN_DUP2, devnull, 2),
        (os.POSIX_SPAWN_DUP2, gate.read_fd, 3),
    ]
    spawned = time.time()
    # its own process group (what leaves the group is found by MARKER_ENV); posix_spawn: cheaper
    # than fork+exec; close-on-exec keeps our fds out of it
    pid = os.posix_spawn(
        SHELL,
        [*argv, *launch.args],
        launch.env,
        file_actions=actions,
        setpgroup=0,
        setsigdef=_SIGDEF,
        setsigmask=(),
    )
    ident = Identity.of(pid)
    # (it cannot have exited: it waits at the gate)
    return (ident if ident is not None else Identity(pid, 0)), spawned
