"""Gang semantics on Docker: once a replica has failed for good, the app's other replicas are
stopped, so the app ends (and reads FAILED) with every exit code known, as on the local
scheduler and on Slurm, and no survivor runs on after its app was reported over.

The engine has no such mechanism; the ``describe`` that sees the failure asks for the stop, in
a daemon thread (a stop takes up to the app's ``stop_timeout``; a describe must stay fast, and a
one-shot ``shipyard status`` must not wait for it). Each scheduler asks once per container while
its stop is under way; a stop not yet asked for when the process exits is asked for by the next
describe. Another process describing the same app at the same time asks too: the replica then
gets its stop signal twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from core.schedulers.docker import state, submit

log = logging.getLogger(__name__)


class Gang:
    """Stops the survivors of the apps whose replicas failed (see the module's docstring)."""

    def __init__(self, api: Callable[[], Any], grace: Callable[[], float | None]) -> None:
        self._api = api
        self._grace = grace
        self._lock = threading.Lock()
        self._stopping: set[str] = set()

    def stop_survivors(self, app_id: str, containers: state.Containers) -> None:
        """Stops, in a background thread, the containers of ``app_id`` that still run or wait
        for a restart if one of its replicas failed for good (nothing otherwise)."""
        survivors = state.gang_survivors(containers)
        with self._lock:
            todo = [c for c in survivors if c["Id"] not in self._stopping]
            ids = {c["Id"] for c in todo}
            self._stopping |= ids
        if not todo:
            return
        log.info("%s: a replica failed; stopping the other %d", app_id, len(todo))
        thread = threading.Thread(
            target=self._stop, args=(app_id, todo, ids), name="shipyard-docker-gang", daemon=True
        )
        thread.start()

    def _stop(self, app_id: str, containers: state.Containers, ids: set[str]) -> None:
        try:
            submit.stop_and_remove(
                self._api(), containers, cancel=False, grace=self._grace(), remove=False
            )
        except Exception:  # (the next describe that sees them running asks again)
            log.warning("could not stop the other replicas of %s", app_id, exc_info=True)
        finally:
            with self._lock:
                self._stopping -= ids
