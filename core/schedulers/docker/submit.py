"""Putting an app on the engine and taking it off: the idempotency-key claim, creating and
starting the containers (all or nothing; a keyed submission interrupted halfway is completed by
a retry with its key), cancelling, and purging every trace of an app.

Everything goes through the public low-level client (``docker.APIClient``): containers are
created with ``create_container`` and a ``create_host_config``, which is one engine call per
container (``containers.create`` of the high-level client adds an inspect to each).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from core.errors import ShipyardError
from core.schedulers.docker.model import (
    BACKEND,
    CANCELLED_SUFFIX,
    DEFAULT_STOP_TIMEOUT,
    LABEL_APP_ID,
    LABEL_CLAIM,
    LABEL_DEADLINE,
    LABEL_REQUEST,
    LABEL_SESSION,
    LABEL_STOP_TIMEOUT,
    LABEL_SUBMITTED,
    LABEL_VERSION,
    SUBMIT_GRACE,
    DockerContainer,
    DockerJob,
    claim_name,
    is_cancelling,
    request_name,
)

log = logging.getLogger(__name__)

#: keyword arguments of ``containers.create`` that go into the host config
_HOST_CONFIG_KEYS = (
    "nano_cpus",
    "mem_limit",
    "device_requests",
    "mounts",
    "devices",
    "restart_policy",
)
#: ... and those that go to ``create_container`` itself
_CREATE_KEYS = ("name", "hostname", "environment", "labels", "stop_timeout", "entrypoint")
#: an extra second of grace per container of a submission, on top of SUBMIT_GRACE
_GRACE_PER_CONTAINER = 1.0
#: pauses while a container another submitter of the key is creating appears (about 10 s)
_CREATE_WAITS = (0.01, 0.02, 0.05, 0.1, 0.2, *([0.5] * 19))


class SubmitError(ShipyardError, RuntimeError):
    """The engine refused part of a submission; everything it had created was removed."""


def create_args(api: Any, container: DockerContainer) -> dict[str, Any]:
    """The ``APIClient.create_container`` arguments of a :class:`DockerContainer` (whose kwargs
    are those of the high-level ``containers.create``)."""
    kw = container.kwargs
    unknown = (
        set(kw) - set(_HOST_CONFIG_KEYS) - set(_CREATE_KEYS) - {"network", "networking_config"}
    )
    if unknown:
        raise ValueError(f"{BACKEND}: unsupported container options {sorted(unknown)}")
    host = {k: kw[k] for k in _HOST_CONFIG_KEYS if k in kw}
    args: dict[str, Any] = {k: kw[k] for k in _CREATE_KEYS if k in kw}
    network = kw.get("network")
    if network:
        host["network_mode"] = network
        endpoints = kw.get("networking_config") or {}
        assert isinstance(endpoints, dict)
        args["networking_config"] = api.create_networking_config(
            {
                str(net): api.create_endpoint_config(aliases=cfg.get("Aliases"))
                for net, cfg in endpoints.items()
            }
        )
    args["host_config"] = api.create_host_config(**host)
    command = list(container.command)
    if "entrypoint" in kw:  # (a script runs the command: the image's entrypoint is part of it)
        config = api.inspect_image(container.image).get("Config") or {}
        command = [*(config.get("Entrypoint") or []), *command]
    return {"image": container.image, "command": command, **args}


def submit_deadline(job: DockerJob) -> float:
    """When a submission of ``job`` that has not started every container counts as interrupted."""
    return time.time() + SUBMIT_GRACE + _GRACE_PER_CONTAINER * len(job.containers)


# -- idempotency-key claims ---------------------------------------------------------------------


def claim(api: Any, key: str, job: DockerJob, session: str, deadline: float) -> str | None:
    """Claims ``key`` for ``job``: None if this call claimed it, else the id of the app that holds
    it. The claim is a volume named after the key: the engine creates a volume of a given name
    once, atomically, and gives every later creator the first one's labels."""
    labels = {
        LABEL_VERSION: "1",
        LABEL_CLAIM: "1",
        LABEL_SESSION: session,
        LABEL_APP_ID: job.app_id,
        LABEL_SUBMITTED: repr(time.time()),
        LABEL_DEADLINE: repr(deadline),
    }
    got = api.create_volume(name=claim_name(key), driver="local", labels=labels)
    holder = (got.get("Labels") or {}).get(LABEL_APP_ID)
    return None if holder == job.app_id else str(holder)


def release(api: Any, key: str) -> None:
    """Drops the claim of ``key`` (its submission failed and left nothing behind)."""
    from docker.errors import NotFound

    try:
        api.remove_volume(claim_name(key), force=True)
    except NotFound:
        pass


# -- a keyed submission's saved request ---------------------------------------------------------
#
# A keyed submission saves its request (every container's settings) in a volume before it claims
# the key; whoever removes that volume starts the containers, once every one exists. The submitter
# does it when it has created them all; if it died before, a retry with the key (see ``resume``)
# creates the missing ones and removes it instead. Removing a volume succeeds once, so the
# containers are started by one of them only.


def save_request(api: Any, job: DockerJob, session: str, deadline: float) -> None:
    """Keeps ``job`` where a retry with its key finds it, until its containers are started."""
    labels = {
        LABEL_VERSION: "1",
        LABEL_SESSION: session,
        LABEL_APP_ID: job.app_id,
        LABEL_DEADLINE: repr(deadline),
        LABEL_REQUEST: job.encode(),
    }
    api.create_volume(name=request_name(job.app_id), driver="local", labels=labels)


def take_request(api: Any, app_id: str) -> bool:
    """Removes the saved request of ``app_id``: True if this call removed it (its caller alone
    may start the app's containers, or remove them), False if it was gone."""
    from docker.errors import NotFound

    try:
        api.remove_volume(request_name(app_id))  # (never force: it removes what is not there)
    except NotFound:
        return False
    return True


def load_request(api: Any, app_id: str) -> tuple[DockerJob, str, float] | None:
    """The saved request of ``app_id``, its session and its deadline; None if it has none."""
    from docker.errors import NotFound

    try:
        labels = api.inspect_volume(request_name(app_id)).get("Labels") or {}
        job = DockerJob.decode(labels[LABEL_REQUEST])
        return job, labels.get(LABEL_SESSION, ""), float(labels[LABEL_DEADLINE])
    except NotFound:
        return None
    except (KeyError, ValueError):
        log.warning("the saved request of %s is unreadable", app_id, exc_info=True)
        return None


def resume(api: Any, pool: ThreadPoolExecutor, app_id: str) -> bool:
    """Completes the keyed submission of ``app_id`` when its submitter stopped halfway (killed
    after creating some containers, before starting them): creates what it had not, then, if
    no one else took the request first, starts every container. True if this call started
    them. A submission past its deadline is left as it is: it reads FAILED already."""
    saved = load_request(api, app_id)
    if saved is None:
        return False
    job, session, deadline = saved
    if time.time() > deadline:
        return False
    create_all(api, pool, job, session, keyed=True)
    if not take_request(api, app_id):
        return False
    start_all(api, pool, job, deadline, keyed=True)
    log.info("completed the interrupted submission of %s", app_id)
    return True


def remove_expired_requests(api: Any, now: float) -> None:
    """Removes the saved requests of keyed submissions past their deadline (no one may start
    them any more: their submitter died before claiming the key, or before creating anything)."""
    for vol in api.volumes(filters={"label": LABEL_REQUEST}).get("Volumes") or []:
        labels = vol.get("Labels") or {}
        try:
            expired = now > float(labels.get(LABEL_DEADLINE) or "inf")
        except ValueError:
            expired = True
        if expired and labels.get(LABEL_APP_ID):
            take_request(api, labels[LABEL_APP_ID])


# -- creating and starting ----------------------------------------------------------------------


def submit_job(
    api: Any, pool: ThreadPoolExecutor, job: DockerJob, session: str, deadline: float, key: str
) -> str | None:
    """Submits ``job``: with ``key``, saves its request and claims the key first. Returns None
    if this call submitted it, else the id of the app that holds the key (a submission of it
    that stopped halfway is completed: see :func:`resume`)."""
    if key:
        save_request(api, job, session, deadline)
        winner = claim(api, key, job, session, deadline)
        if winner is not None:
            take_request(api, job.app_id)
            try:
                resume(api, pool, winner)
            except Exception:
                log.warning("could not complete the submission of %s", winner, exc_info=True)
            return winner
    start_job(api, pool, job, session, deadline, key)
    return None


def start_job(
    api: Any,
    pool: ThreadPoolExecutor,
    job: DockerJob,
    session: str,
    deadline: float,
    key: str = "",
) -> None:
    """Creates the app's network and every container, then starts them: all or nothing.

    A container is started only once every container of the app exists, so a submitter that
    dies halfway leaves containers that never ran (see ``state``: such an app is reported
    FAILED after its deadline, unless a retry with its key completes it first). On an error
    everything created so far is removed and ``key`` released, unless a retry with the key
    took the submission over (then the retry starts it).
    """
    mine = not key  # (whether this call may start the containers, or remove them)
    try:
        create_all(api, pool, job, session, keyed=bool(key))
        mine = mine or take_request(api, job.app_id)
        if not mine:
            log.info("%s was taken over (by a retry with its key, or a cancel)", job.app_id)
            return
        start_all(api, pool, job, deadline, keyed=bool(key))
    except BaseException as e:
        if not mine and not _abandon(api, job.app_id):
            raise  # (a retry with the key, or a cancel, took the submission over: the rest is its)
        _remove_partial(api, job)
        if key:
            release(api, key)
        raise _submit_error(job, e) from e


def _abandon(api: Any, app_id: str) -> bool:
    """Takes the request of a failed keyed submission, so that no retry starts it."""
    try:
        return take_request(api, app_id)
    except Exception:
        log.warning("could not withdraw the request of %s", app_id, exc_info=True)
        return False


def create_all(
    api: Any, pool: ThreadPoolExecutor, job: DockerJob, session: str, keyed: bool
) -> None:
    """Creates the app's network, checkpoint volume and containers; with ``keyed``, those that
    exist already (made by another submitter of the key) are kept."""
    from docker.errors import APIError

    labels = {LABEL_VERSION: "1", LABEL_SESSION: session, LABEL_APP_ID: job.app_id}
    if job.network:
        try:
            api.create_network(job.network, driver="bridge", labels=labels, check_duplicate=True)
        except APIError as e:
            if not (keyed and e.status_code == 409):
                raise
    if job.checkpoint_volume:
        api.create_volume(name=job.checkpoint_volume, driver="local", labels=labels)

    def create(c: DockerContainer) -> None:
        for delay in _CREATE_WAITS:
            try:
                api.create_container(**create_args(api, c))
                return
            except APIError as e:
                if not (keyed and e.status_code == 409):
                    raise
            if _exists(api, str(c.kwargs["name"])):
                return
            time.sleep(delay)  # (409 while another submitter's create of it is under way)
        raise SubmitError(f"container {c.kwargs['name']}: its name is taken but it never appeared")

    parallel(pool, create, job.containers)


def _exists(api: Any, name: str) -> bool:
    from docker.errors import NotFound

    try:
        api.inspect_container(name)
    except NotFound:
        return False
    return True


def start_all(
    api: Any, pool: ThreadPoolExecutor, job: DockerJob, deadline: float, keyed: bool = False
) -> None:
    """Starts every container of ``job`` (all created, none started), unless it is too late.
    With ``keyed``, the network other submitters of the key may have created too is made one
    first."""
    if time.time() > deadline:
        raise SubmitError(
            f"creating {len(job.containers)} containers took past the submit deadline"
        )
    if keyed and job.network:
        _one_network(api, job.network)
    parallel(pool, api.start, [str(c.kwargs["name"]) for c in job.containers])


def parallel(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """``fn`` over ``items`` on the pool (in this thread for one item); the results in order.
    Every call is waited for before the first error is raised."""
    items = list(items)
    if len(items) == 1:
        return [fn(items[0])]
    futures = [pool.submit(fn, item) for item in items]
    errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err
    return [f.result() for f in futures]


def _networks_named(api: Any, name: str) -> list[str]:
    """The ids of the networks called ``name`` (the engine's filter matches parts of names)."""
    return sorted(n["Id"] for n in api.networks(names=[name]) if n.get("Name") == name)


def _one_network(api: Any, name: str) -> None:
    """Leaves one network called ``name``. The engine's check for a network of the same name is
    not atomic, so submitters of one key that race may each create one; a container then cannot
    start ("network ... is ambiguous"). None of them has a started container yet (only the
    caller starts them), so the others can go; a later create sees the one kept."""
    for extra in _networks_named(api, name)[1:]:
        log.info("removing a second network %s (%s) made by a racing submitter", name, extra)
        remove_network(api, extra)


def _remove_partial(api: Any, job: DockerJob) -> None:
    """Removes what a failed submission created: its containers, by name (a create may have
    succeeded in the engine after its call failed here), and its network."""
    from docker.errors import NotFound

    for c in job.containers:
        try:
            api.remove_container(str(c.kwargs["name"]), force=True)
        except NotFound:
            pass
        except Exception:
            log.warning("could not remove container %s", c.kwargs["name"], exc_info=True)
    if job.network:
        for net in _networks_named(api, job.network):  # (racing submitters may have made two)
            remove_network(api, net)
    if job.checkpoint_volume:
        try:
            api.remove_volume(job.checkpoint_volume, force=True)
        except NotFound:
            pass
        except Exception:
            log.warning("could not remove volume %s", job.checkpoint_volume, exc_info=True)


def _submit_error(job: DockerJob, e: BaseException) -> BaseException:
    from docker.errors import APIError

    if not isinstance(e, APIError | SubmitError):
        return e
    why = str(e.explanation or e) if isinstance(e, APIError) else str(e)
    if "docker0" in why:
        why += (
            " (the engine's default bridge docker0 is gone - a dockerd started with"
            " --bridge=none on this host removes it; restart dockerd, e.g. scripts/start_docker.sh)"
        )
    return SubmitError(f"{BACKEND}: submitting {job.app_id} failed (nothing left behind): {why}")


def is_pool_exhausted(e: BaseException) -> bool:
    """Whether a submission failed because the engine has no address pool left for a network."""
    return "non-overlapping" in str(e) and "address pool" in str(e)


def remove_network(api: Any, name_or_id: str) -> None:
    """Removes a network; one that is already gone is fine."""
    from docker.errors import NotFound

    try:
        api.remove_network(name_or_id)
    except NotFound:
        pass


# -- taking apps off the engine -----------------------------------------------------------------


def stop_and_remove(
    api: Any,
    containers: list[dict[str, Any]],
    cancel: bool = True,
    grace: float | None = None,
    remove: bool = True,
) -> None:
    """Stops each container (SIGTERM, SIGKILL after its ``stop_timeout``, or after ``grace``
    seconds if given) and, with ``remove``, removes it; with ``cancel`` renames it first, so
    that a concurrent describe reads its exit as a cancellation. One thread per container:
    every replica gets its grace period at the same time."""

    def one(c: Mapping[str, Any]) -> None:
        _stop_and_remove_one(api, c, cancel, grace, remove)

    if len(containers) == 1:
        one(containers[0])
        return
    with ThreadPoolExecutor(
        max_workers=min(len(containers), 64), thread_name_prefix="shipyard-docker-stop"
    ) as pool:
        parallel(pool, one, containers)


def _stop_and_remove_one(
    api: Any, c: Mapping[str, Any], cancel: bool, grace: float | None, remove: bool
) -> None:
    from docker.errors import APIError, NotFound

    labels = c.get("Labels") or {}
    try:
        timeout = int(labels.get(LABEL_STOP_TIMEOUT, DEFAULT_STOP_TIMEOUT))
    except ValueError:
        timeout = DEFAULT_STOP_TIMEOUT
    if grace is not None:
        timeout = math.ceil(grace)  # (the engine takes whole seconds)
    try:
        if cancel and not is_cancelling(dict(c)):
            _mark_cancelled(api, c)
        if c.get("State") in ("running", "restarting", "paused"):
            api.stop(c["Id"], timeout=timeout)
        if remove:
            api.remove_container(c["Id"], force=True)
    except NotFound:
        pass
    except APIError as e:
        if e.status_code != 409:  # 409: removal already in progress
            raise


def _mark_cancelled(api: Any, c: Mapping[str, Any]) -> None:
    """Renames the container ``{name}--cancelled`` (another canceller may have done it)."""
    from docker.errors import APIError

    name = ((c.get("Names") or [""])[0]).lstrip("/") or c["Id"][:12]
    try:
        api.rename(c["Id"], name + CANCELLED_SUFFIX)
    except APIError as e:
        if e.status_code not in (400, 409):  # renamed already (same name, or in use)
            raise


def remove_records(api: Any, app_id: str) -> None:
    """Removes the app's record volumes (its tombstone and its key's claim)."""
    from docker.errors import NotFound

    for vol in api.volumes(filters={"label": f"{LABEL_APP_ID}={app_id}"}).get("Volumes") or []:
        try:
            api.remove_volume(vol["Name"], force=True)
        except NotFound:
            pass
