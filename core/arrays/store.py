"""An array's directory on this host (``<state root>/arrays/<backend>/<session>/<array id>/``):

* ``request.json`` what was asked (the app, cfg, elements, cap), written once by the submitter;
* ``state.json`` every element's state, written only by the array's driver (atomically);
* ``native-<n>.json`` the n-th submission of a native array (the backend's own array), written
  once by whoever made it: the array's and each element's app id;
* ``cancel`` and ``retry-*.json``: what other processes ask of the driver;
* ``driver.lock`` held (``flock``) by the live driver, so anyone can tell whether one runs;
* ``driver.log`` the driver's own log.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from core.paths import state_root

__all__ = ["ArrayDir", "arrays_root", "prune"]

#: days an ended array's directory is kept (``$SHIPYARD_ARRAY_RETENTION_DAYS``)
RETENTION_DAYS_ENV = "SHIPYARD_ARRAY_RETENTION_DAYS"


def arrays_root(backend: str, session: str) -> str:
    """Where this host keeps the arrays of ``backend`` and ``session``."""
    from urllib.parse import quote  # (lazily, as tempfile below: `shipyard run` start-up)

    return os.path.join(state_root(), "arrays", backend, quote(session, safe="") or "%")


def _write_json(path: str, data: Any) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, separators=(",", ":")))  # (the C encoder: json.dump's is not)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _numbered(array: str, elements: list[list[Any]]) -> bool:
    """Whether ``elements`` are ``[i, "<array>_<i>"]`` for i = 0, 1, 2..."""
    return all(e[0] == i and e[1] == f"{array}_{i}" for i, e in enumerate(elements))


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


class ArrayDir:
    """The files of one array (see the module's docstring)."""

    def __init__(self, backend: str, session: str, array_id: str) -> None:
        self.backend, self.session, self.array_id = backend, session, array_id
        self.path = os.path.join(arrays_root(backend, session), array_id)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def create(self) -> bool:
        """Makes the directory; False if it existed (another submit with the same key)."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        try:
            os.mkdir(self.path, 0o700)
            return True
        except FileExistsError:
            return False

    def remove(self) -> None:
        """Removes the array's directory (an array that never started)."""
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)

    def exists(self) -> bool:
        """Whether the array was submitted on this host."""
        return os.path.exists(self._file("request.json"))

    def write_request(self, request: dict[str, Any]) -> None:
        """Records what was asked (idempotent: the same request may be written again)."""
        _write_json(self._file("request.json"), request)

    def request(self) -> dict[str, Any] | None:
        """What was asked, or None if the array is unknown here."""
        data = _read_json(self._file("request.json"))
        return data if isinstance(data, dict) else None

    def write_state(self, state: dict[str, Any]) -> None:
        """Replaces the elements' states (the driver's alone)."""
        _write_json(self._file("state.json"), state)

    def state(self) -> dict[str, Any] | None:
        """The elements' states as the driver last wrote them (None before its first write)."""
        data = _read_json(self._file("state.json"))
        return data if isinstance(data, dict) else None

    def write_native(self, n: int, record: dict[str, Any]) -> None:
        """Records the ``n``-th submission of a native array (``array``: its app id;
        ``elements``: each element's, by index). Elements 0..N-1 whose ids are
        ``<array>_<index>`` (a Slurm array's first submission) are kept as their count."""
        array, elements = record["array"], record["elements"]
        if _numbered(array, elements):
            record = {**record, "elements": len(elements)}
        _write_json(self._file(f"native-{n}.json"), record)

    def native(self, n: int) -> dict[str, Any] | None:
        """The ``n``-th native submission (from 1), or None."""
        data = _read_json(self._file(f"native-{n}.json"))
        if not isinstance(data, dict):
            return None
        if isinstance(data.get("elements"), int):
            data["elements"] = [[i, f"{data['array']}_{i}"] for i in range(data["elements"])]
        return data

    def natives(self) -> list[dict[str, Any]]:
        """The native submissions recorded so far, first first (see :meth:`write_native`)."""
        out: list[dict[str, Any]] = []
        while (record := self.native(len(out) + 1)) is not None:
            out.append(record)
        return out

    def request_cancel(self) -> None:
        """Asks the driver to start nothing more and cancel what runs."""
        with open(self._file("cancel"), "a"):
            pass

    def cancel_requested(self) -> bool:
        """Whether the array was cancelled."""
        return os.path.exists(self._file("cancel"))

    def request_retry(self, indices: list[int]) -> None:
        """Asks the driver to run elements ``indices`` again (those that failed)."""
        import uuid  # (not needed to read an array)

        _write_json(self._file(f"retry-{uuid.uuid4().hex}.json"), indices)

    def _retry_files(self) -> list[str]:
        names = sorted(os.listdir(self.path))
        return [self._file(n) for n in names if n.startswith("retry-") and n.endswith(".json")]

    def retries_pending(self) -> set[int]:
        """The indices of the retry requests the driver has not taken yet."""
        return {i for path in self._retry_files() for i in _read_json(path) or []}

    def retry_requests(self) -> list[tuple[str, list[int]]]:
        """Each retry request not yet dropped: its file and its indices (the driver's)."""
        return [(path, _read_json(path) or []) for path in self._retry_files()]

    def drop(self, paths: list[str]) -> None:
        """Removes requests the driver has recorded in its state."""
        for path in paths:
            os.unlink(path)

    def driver_alive(self) -> bool:
        """Whether a driver holds the lock now."""
        with self.driver_lock() as lock:
            return lock is None

    @contextmanager
    def driver_lock(self) -> Iterator[int | None]:
        """Holds the driver's lock for the block, yielding its file descriptor (a child given
        it keeps the lock after the block); None if another process holds it."""
        fd = os.open(self._file("driver.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None
                return
            yield fd
        finally:
            os.close(fd)

    @property
    def log_path(self) -> str:
        """The driver's log file."""
        return self._file("driver.log")


def prune(backend: str, session: str, now: float) -> list[str]:
    """Removes the directories of this session's arrays that ended (their driver gone, every
    element ended) longer than the retention ago (default 7 days); returns their ids."""
    import shutil

    days = float(os.environ.get(RETENTION_DAYS_ENV, "7"))
    root = arrays_root(backend, session)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        adir = ArrayDir(backend, session, name)
        try:
            ended_at = os.stat(os.path.join(adir.path, "state.json")).st_mtime
        except FileNotFoundError:
            continue
        if now - ended_at < days * 86400 or adir.driver_alive() or adir.retries_pending():
            continue
        state = adir.state() or {}
        ended = ("SUCCEEDED", "FAILED", "CANCELLED")
        if all(e.get("state") in ended for e in state.get("elements", [])):
            shutil.rmtree(adir.path, ignore_errors=True)
            removed.append(name)
    return removed
