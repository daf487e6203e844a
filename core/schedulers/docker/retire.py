"""Ended apps leave the engine here, and nothing of them is lost: their final state goes into
a *tombstone* (an empty, labelled volume ``shipyard-tombstone-{app_id}``), their logs into that
volume's files, and then their containers and network are removed.

- **Cancel** writes the tombstone (CANCELLED) before it stops and removes the containers.
- **Networks** (the engine has few address pools): the ``describe`` that first sees an app
  ended for good (no container running or to be restarted) removes its network itself, and the
  sweep removes those of the ended apps nobody described.
- **The sweep** (:class:`Janitor`) retires ended apps of every session: once an app has been
  over for its ``retention``, its final state goes into its tombstone, its logs into the
  tombstone's files, and its containers are removed; an app whose submission was interrupted
  (its submitter died before starting every container, and no retry with its key completed it
  before its deadline) is removed with a FAILED tombstone. Submits run it in the background (at
  most every few seconds per process) and at once when the engine is out of address pools;
  ``describe`` asks for it when it sees an app end.
- **Records expire:** the sweep removes the tombstone and key claim of an app retired longer
  than its ``record_retention`` ago (7 days by default); the app is unknown from then on.
"""

from __future__ import annotations

import heapq
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from core.reports import ReplicaResult
from core.schedulers.api import DescribeAppResponse, Stream
from core.schedulers.docker import logs, outcome, state
from core.schedulers.docker.model import (
    APP_LABELS,
    DEFAULT_RECORD_RETENTION,
    LABEL_APP_ID,
    LABEL_ATTEMPTS,
    LABEL_ENDED,
    LABEL_MAX_RETRIES,
    LABEL_MSG,
    LABEL_NETWORK,
    LABEL_NUM_RESTARTS,
    LABEL_RECORD_RETENTION,
    LABEL_REPLICA_ID,
    LABEL_REPLICAS,
    LABEL_RESULT_FILE,
    LABEL_RETENTION,
    LABEL_ROLE_NAME,
    LABEL_STATE,
    LABEL_SUBMITTED,
    LABEL_TIME_LIMIT,
    LABEL_TOMBSTONE,
    RESULT_PATH,
    TOMBSTONE_PREFIX,
    is_cancelling,
    parse_docker_time,
    replica_state,
)
from core.schedulers.docker.submit import (
    remove_expired_requests,
    remove_network,
    remove_records,
    stop_and_remove,
)
from core.schedulers.docker.usage import UsageBook
from core.specs import AppState, Attempt, is_terminal

if TYPE_CHECKING:
    import tarfile

log = logging.getLogger(__name__)

LABEL_ARCHIVER = "shipyard.archiver"
_ARCHIVE_DIR = "/shipyard-archive"
#: seconds between two background sweeps of one process
SWEEP_INTERVAL = 5.0


def write_tombstone(
    api: Any, app_id: str, containers: state.Containers, resp: DescribeAppResponse, final: AppState
) -> None:
    """Records the app's final state (replicas still going get ``final``) in its tombstone; a
    tombstone that exists already is kept (the first final state wins)."""
    labels = {k: v for k, v in (containers[0].get("Labels") or {}).items() if k in APP_LABELS}
    labels.update(
        {
            LABEL_TOMBSTONE: "1",
            LABEL_STATE: final.name,
            LABEL_REPLICAS: json.dumps(state.final_replicas(resp, final), separators=(",", ":")),
            LABEL_NUM_RESTARTS: str(max(resp.num_restarts, 0)),
            LABEL_ATTEMPTS: json.dumps([a.to_json() for a in resp.attempts], separators=(",", ":")),
            LABEL_MSG: resp.msg,
            LABEL_ENDED: repr(time.time()),
        }
    )
    api.create_volume(name=TOMBSTONE_PREFIX + app_id, driver="local", labels=labels)


def ended_network(containers: state.Containers, restarts: dict[str, list[Attempt]]) -> str | None:
    """The network of an app that ended for good: none of its containers runs or will start
    again (its engine's restart policy has no tries left). None if it has none, or not yet."""
    network = (containers[0].get("Labels") or {}).get(LABEL_NETWORK)
    if not network or any(c.get("State") not in ("exited", "dead") for c in containers):
        return None
    return None if _may_restart(containers, restarts) else str(network)


def remove_app_networks(api: Any, app_id: str) -> None:
    """Removes the app's network (if it has one left)."""
    for net in api.networks(filters={"label": f"{LABEL_APP_ID}={app_id}"}):
        remove_network(api, net["Id"])


# -- log archives -------------------------------------------------------------------------------


def archive_logs(api: Any, app_id: str, containers: state.Containers) -> None:
    """Copies every replica's stdout and stderr (whole lines with their timestamps) into the
    app's tombstone volume, through a container that is created for the copy and never runs."""
    import tarfile  # (here: retiring only; it loads shutil, bz2 and lzma)

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for c in containers:
            for stream in (Stream.STDOUT, Stream.STDERR):
                data = b"".join(logs.stamped_lines(api, c["Id"], stream))
                info = tarfile.TarInfo(_file_name(c.get("Labels") or {}, stream))
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
            _archive_result(api, c, tar)
    with _archiver(api, app_id, containers[0]["ImageID"], read_only=False) as cid:
        api.put_archive(cid, _ARCHIVE_DIR, buf.getvalue())


def read_archive(
    api: Any,
    app_id: str,
    image: str,
    role: str,
    k: int,
    stream: Stream,
    since: float | None,
    until: float | None,
) -> list[str] | None:
    """The archived lines of a replica (None if the app has no archive of it), merged by time
    for the combined stream."""
    from docker.errors import NotFound

    wanted = [Stream.STDOUT, Stream.STDERR] if stream == Stream.COMBINED else [stream]
    labels = {LABEL_ROLE_NAME: role, LABEL_REPLICA_ID: str(k)}
    try:
        with _archiver(api, app_id, image, read_only=True) as cid:
            files = [_read_file(api, cid, _file_name(labels, s)) for s in wanted]
    except NotFound:
        return None
    lo = logs.stamp(since) if since is not None else b""
    hi = logs.stamp(until) if until is not None else b"\xff"
    merged = heapq.merge(*files, key=lambda line: line[: logs.TS_LEN - 1])
    return [
        line[logs.TS_LEN :].decode("utf-8", errors="replace")
        for line in merged
        if lo <= line[: logs.TS_LEN - 1] <= hi
    ]


def _archive_result(api: Any, c: Mapping[str, Any], tar: tarfile.TarFile) -> None:
    """Keeps a collected replica's result file (if it wrote one) with its logs."""
    import tarfile

    from docker.errors import NotFound

    labels = c.get("Labels") or {}
    if not outcome.collected(labels):
        return
    try:
        chunks, _ = api.get_archive(c["Id"], labels.get(LABEL_RESULT_FILE) or RESULT_PATH)
    except NotFound:
        return
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as src:
        member = next((m for m in src.getmembers() if m.isfile()), None)
        f = src.extractfile(member) if member is not None else None
        if member is None or f is None:
            return
        info = tarfile.TarInfo(
            _result_name(labels.get(LABEL_ROLE_NAME, ""), labels.get(LABEL_REPLICA_ID, ""))
        )
        info.size, info.mtime = member.size, int(time.time())
        tar.addfile(info, f)


def _result_name(role: str, k: object) -> str:
    return f"{role}-{k}.result.json"


def read_archived_results(
    api: Any, app_id: str, image: str, replicas: list[tuple[str, int]]
) -> list[ReplicaResult] | None:
    """The results of a retired app's ``replicas`` from its archive (None: it has none)."""
    from docker.errors import NotFound

    out = []
    try:
        with _archiver(api, app_id, image, read_only=True) as cid:
            for role, k in replicas:
                try:
                    data: bytes | None = b"".join(_read_file(api, cid, _result_name(role, k)))
                except NotFound:
                    data = None
                out.append(outcome.read_archived_result(role, k, data))
    except NotFound:
        return None
    return out


def _file_name(labels: Any, stream: Stream) -> str:
    return f"{labels.get(LABEL_ROLE_NAME, '')}-{labels.get(LABEL_REPLICA_ID, '')}.{stream.value}"


def _read_file(api: Any, cid: str, name: str) -> list[bytes]:
    import tarfile

    chunks, _ = api.get_archive(cid, f"{_ARCHIVE_DIR}/{name}")
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read().splitlines(keepends=True)


class _archiver:
    """A container that mounts the app's tombstone volume and never runs (the engine's way to
    put files into a volume and read them back); removed on exit."""

    def __init__(self, api: Any, app_id: str, image: str, read_only: bool) -> None:
        self.api, self.app_id, self.image, self.read_only = api, app_id, image, read_only
        self.cid = ""

    def __enter__(self) -> str:
        from docker.errors import NotFound

        volume = TOMBSTONE_PREFIX + self.app_id
        self.api.inspect_volume(volume)  # NotFound: no tombstone, so no archive
        mount = {
            "Type": "volume",
            "Source": volume,
            "Target": _ARCHIVE_DIR,
            "ReadOnly": self.read_only,
        }
        try:
            self.cid = self.api.create_container(
                self.image,
                ["true"],
                labels={LABEL_ARCHIVER: self.app_id},
                host_config=self.api.create_host_config(mounts=[mount], network_mode="none"),
            )["Id"]
        except NotFound as e:  # the image is gone: so is the way to read the volume
            raise RuntimeError(f"app {self.app_id}: cannot open its log archive: {e}") from e
        return self.cid

    def __exit__(self, *exc: object) -> None:
        self.api.remove_container(self.cid, force=True)


# -- the sweep ----------------------------------------------------------------------------------


class Janitor:
    """Retires ended apps of every session (see the module's docstring). One per scheduler."""

    def __init__(
        self, api: Callable[[], Any], pool: Callable[[], ThreadPoolExecutor], usage: UsageBook
    ) -> None:
        self._api = api
        self._pool = pool
        self._usage = usage
        self._lock = threading.Lock()
        self._last = 0.0
        self._running = False
        self._sweeping = threading.Lock()

    def poke(self) -> None:
        """Sweeps in the background unless a sweep ran in the last :data:`SWEEP_INTERVAL`."""
        with self._lock:
            if self._running or time.monotonic() - self._last < SWEEP_INTERVAL:
                return
            self._running = True
        self._pool().submit(self._sweep_logged)

    def _sweep_logged(self) -> None:
        try:
            self.sweep()
        except Exception:
            log.warning(
                "retiring ended Docker apps failed (the next sweep tries again)", exc_info=True
            )
        finally:
            with self._lock:
                self._running, self._last = False, time.monotonic()

    def sweep(self) -> None:
        """One pass over every Shipyard container of the engine (one pass at a time)."""
        with self._sweeping:
            api = self._api()
            now = time.time()
            networks = {n["Name"] for n in api.networks(filters={"label": LABEL_APP_ID})}
            tombstones = state.list_records(api, LABEL_TOMBSTONE).tombstones
            apps = state.by_app(state.list_containers(api, LABEL_APP_ID))
            for app_id, containers in apps.items():
                if app_id in tombstones or any(is_cancelling(c) for c in containers):
                    continue  # a cancel or another sweep is at work
                try:
                    self._retire(api, app_id, containers, app_id in networks, now)
                except Exception:
                    log.warning("could not retire Docker app %s", app_id, exc_info=True)
            for app_id, labels in tombstones.items():
                if app_id not in apps:
                    _expire(api, app_id, labels, now)
            remove_expired_requests(api, now)

    def _retire(
        self, api: Any, app_id: str, containers: state.Containers, has_net: bool, now: float
    ) -> None:
        restarts = state.restart_counts(api, self._pool(), containers)
        resp, _ = state.summarize(app_id, containers, restarts, now)
        if not is_terminal(resp.state) or _may_restart(containers, restarts):
            return
        if resp.msg.startswith("submit interrupted"):
            write_tombstone(api, app_id, containers, resp, AppState.FAILED)
            stop_and_remove(api, containers, cancel=False)
            remove_app_networks(api, app_id)
            log.info("removed %s: %s", app_id, resp.msg)
            return
        if has_net:
            remove_app_networks(api, app_id)
        labels = containers[0].get("Labels") or {}
        retention = state.label_int(labels.get(LABEL_RETENTION))
        # an app cannot have ended for longer than it exists: only older ones are inspected
        if now - float(labels.get(LABEL_SUBMITTED) or now) < retention:
            return
        if now - _ended_at(api, containers) >= retention:
            self._usage.apply(api, [(resp, containers)])  # (kept in the tombstone)
            write_tombstone(api, app_id, containers, resp, resp.state)
            archive_logs(api, app_id, containers)
            stop_and_remove(api, containers, cancel=False)
            log.info("retired %s: logs archived, containers removed", app_id)


def _expire(api: Any, app_id: str, labels: Mapping[str, str], now: float) -> None:
    """Removes the records of a retired app (no container left) once its ``record_retention``
    is over: it is unknown from then on, as a local app whose directory the sweep removed."""
    keep = labels.get(LABEL_RECORD_RETENTION)
    try:
        ended = float(labels.get(LABEL_ENDED) or "inf")
        over = ended + (float(keep) if keep else DEFAULT_RECORD_RETENTION)
    except ValueError:
        return
    if now < over:
        return
    try:
        remove_records(api, app_id)
        log.info("removed the records of %s (retired %s)", app_id, time.ctime(ended))
    except Exception:  # (an archive being read mounts it: the next sweep tries again)
        log.debug("could not remove the records of %s", app_id, exc_info=True)


def _ended_at(api: Any, containers: state.Containers) -> float:
    """When the last of the containers stopped."""
    finished = [
        parse_docker_time(api.inspect_container(c["Id"])["State"].get("FinishedAt", ""))
        for c in containers
    ]
    return max((f for f in finished if f is not None), default=time.time())


def _may_restart(containers: state.Containers, restarts: dict[str, list[Attempt]]) -> bool:
    """Whether the engine may still restart a failed replica (its restart policy has tries left;
    a time limit's script retries within a running container)."""
    for c in containers:
        labels = c.get("Labels") or {}
        retries = state.label_int(labels.get(LABEL_MAX_RETRIES))
        code = replica_state(c.get("State", ""), c.get("Status", ""))[1]
        if labels.get(LABEL_TIME_LIMIT) or not retries or code in (None, 0):
            continue
        if len(restarts.get(c["Id"], [])) < retries:
            return True
    return False
