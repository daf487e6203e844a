"""Where Shipyard keeps its state on this host: :func:`state_root`.

``$SHIPYARD_STATE_DIR``, else ``$XDG_STATE_HOME/shipyard``, else ``~/.local/state/shipyard``.
Local apps keep their directories under it (``local/``), and followers keep their log cursors
there (e.g. the Prefect worker's, under ``prefect-worker/``).

Standard library only: the local backend's log collector process imports it too.
"""

from __future__ import annotations

import functools
import os

__all__ = ["STATE_DIR_ENV", "state_root"]

#: the variable that says where the state root is
STATE_DIR_ENV = "SHIPYARD_STATE_DIR"


def state_root() -> str:
    """``$SHIPYARD_STATE_DIR`` else ``$XDG_STATE_HOME/shipyard`` else ``~/.local/state/shipyard``
    (a relative one is taken from the working directory)."""
    env = os.environ
    state, xdg = env.get(STATE_DIR_ENV), env.get("XDG_STATE_HOME")
    given = state or xdg or ""
    cwd = os.getcwd() if given[:1] not in ("/", "") else ""
    return _root(state, xdg, env.get("HOME"), cwd)


# Cached by the variables it depends on (and the working directory, for a relative one): every
# local describe and result read asks (bench row "trivial app: submit -> result").
@functools.lru_cache(maxsize=16)
def _root(state: str | None, xdg: str | None, home: str | None, cwd: str) -> str:
    root = state
    if not root:
        base = xdg or os.path.join(os.path.expanduser("~"), ".local", "state")
        root = os.path.join(base, "shipyard")
    return os.path.normpath(os.path.join(cwd, root))
