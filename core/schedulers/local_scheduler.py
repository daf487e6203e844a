"""The local scheduler: runs each replica of each role as a process on this host.

Exposed as ``local_cwd`` (replicas run in the current working directory; the image is ignored)
and ``local_dir`` (the role's image is an absolute directory the replicas run in). Properties of
a role that cannot be enforced on one host are ignored: resource requirements and limits, retry
policies and counts, deployment preferences.

**Any process can address a local app.** Each app keeps a small state directory under
``$SHIPYARD_STATE_DIR`` (else ``$XDG_STATE_HOME/shipyard``, else ``~/.local/state/shipyard``),
in ``local/<app_id>/``: what was submitted, each replica's process (pid and start time) and exit
code (each replica runs under a small ``/bin/sh`` wrapper that records it), and a few markers.
So ``describe``, ``list``, ``log_iter`` and ``cancel`` work from any process on the host, also
after the submitting process exited; apps keep running when it does. Each replica runs in a
process group of its own and gets ``SHIPYARD_APP_ID``, ``SHIPYARD_ROLE_NAME``,
``SHIPYARD_REPLICA_ID``, ``SHIPYARD_NUM_REPLICAS``, ``SHIPYARD_RANK0_HOST`` (the ``rank0_env``
macro) and ``SHIPYARD_REPLICA_KEY`` (inherited by everything it starts; used to find leftovers).

**Logs.** A replica writes its stdout and stderr straight into ``<role>.<k>.stdout.log`` and
``<role>.<k>.stderr.log`` in the app's log directory (``<log_dir>/<app_id>/`` with cfg
``log_dir``, else the ``logs`` directory in the app's state directory). A collector writes
``<role>.<k>.combined.log`` (whole lines of both streams in the order it saw them arrive) and a
time index that ``log_iter``'s ``since``/``until`` use.

**Nothing is orphaned, nothing runs twice.** ``cancel`` ends every replica's process tree
(SIGTERM, SIGKILL after a grace period, then whatever left the process groups). When a replica
fails, the others are terminated (gang semantics: reported CANCELLED) and the app ends FAILED.
No replica's command starts before its app is recorded; an idempotency key is claimed with an
exclusive file before anything starts. A :class:`LocalScheduler` created in the main thread
terminates the apps its process launched on SIGTERM/SIGINT and raises :class:`SignalException`.

Exit codes: a replica killed by signal N reports ``-N``; the wrapper cannot tell "killed by
signal N" from "exited with 128+N", so exit codes 129..192 are reported as signals.

The code lives in the package :mod:`core.schedulers.local` (its docstring says which module
does what); this module keeps the specification's names importable from here.
"""

from __future__ import annotations

from typing import Any

from core.schedulers.local.images import (
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
    PopenRequest,
    ReplicaParam,
)
from core.schedulers.local.logs import LogIterator
from core.schedulers.local.options import LocalOpts
from core.schedulers.local.scheduler import DEFAULT_GRACE, LocalScheduler, state_dir
from core.schedulers.local.signals import SignalException

__all__ = [
    "CWDImageProvider",
    "DEFAULT_GRACE",
    "ImageProvider",
    "LocalDirectoryImageProvider",
    "LocalOpts",
    "LocalScheduler",
    "LogIterator",
    "PopenRequest",
    "ReplicaParam",
    "SignalException",
    "create_cwd_scheduler",
    "create_scheduler",
    "state_dir",
]


def create_cwd_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_cwd`` scheduler: replicas run in the current working directory."""
    return LocalScheduler(
        session_name=session_name,
        image_provider_class=CWDImageProvider,
        backend="local_cwd",
        **kwargs,
    )


def create_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_dir`` scheduler: each role's image is the directory its replicas run in."""
    return LocalScheduler(
        session_name=session_name,
        image_provider_class=LocalDirectoryImageProvider,
        backend="local_dir",
        **kwargs,
    )
