"""The ``local_docker`` scheduler: wires the package's modules behind the scheduler API."""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from core.reports import Problem, ReplicaResult
from core.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
    filter_regex,
)
from core.schedulers.docker import (
    checks,
    gang,
    images,
    logs,
    outcome,
    request,
    retire,
    state,
    submit,
)
from core.schedulers.docker.engine import DockerEngine, connect
from core.schedulers.docker.model import (
    BACKEND,
    LABEL_APP_ID,
    LABEL_DEADLINE,
    LABEL_IDEMPOTENCY_KEY,
    LABEL_SESSION,
    TOMBSTONE_PREFIX,
    DockerJob,
    claim_name,
    container_name,
    hash_key,
    is_cancelling,
)
from core.schedulers.docker.usage import POLL_SAMPLES, UsageBook
from core.specs import AppDef, AppDryRunInfo, AppState, Attempt, CfgVal, is_terminal, runopts
from core.workspace import DockerWorkspaceMixin

log = logging.getLogger(__name__)

_MAX_WORKERS = 16
#: networks freed that one scheduler remembers
_MAX_FREED = 10_000


class DockerScheduler(DockerWorkspaceMixin, Scheduler[DockerJob]):
    """Runs apps on a Docker engine, one container per replica (``local_docker``).

    Docker does not gang-schedule: if one replica fails, only that replica is restarted (up to
    its role's ``max_retries``). Once a replica has failed for good, the app's other replicas
    are stopped (see :mod:`.gang`): the app reads RUNNING until they have ended, then FAILED.
    ``describe`` gives the app's state and every replica's status but not the complete
    original AppDef. Workspaces are overlaid on the role's image (see
    :meth:`build_workspace_image`); with ``image_repo`` the patched image is pushed there.
    Images are pulled as the run option ``pull`` says, and pushes and pulls use the client's
    registry login.

    Args:
        session_name: the session apps are submitted under
        docker_client: a ``docker.DockerClient`` to use (it is closed with the scheduler)
        docker_engine: else the engine and registry login to connect to (default: the
            environment's, as Docker's own tools; see :mod:`core.schedulers.docker.engine`)
    """

    def __init__(
        self,
        session_name: str,
        docker_client: Any | None = None,
        docker_engine: DockerEngine | None = None,
        grace: float | None = None,
    ) -> None:
        super().__init__(BACKEND, session_name)
        #: seconds from SIGTERM to SIGKILL when cancelling (None: each app's ``stop_timeout``)
        self.grace = grace
        self.__client = docker_client
        self._engine = docker_engine
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._usage = UsageBook(self._executor)
        self._janitor = retire.Janitor(lambda: self._api, self._executor, self._usage)
        self._freed: set[str] = set()
        self._gang = gang.Gang(lambda: self._api, lambda: self.grace)

    # -- resources ---------------------------------------------------------------------------

    @property
    def _docker_client(self) -> Any:
        """The docker SDK client (created on first use)."""
        if self.__client is None:
            with self._lock:
                if self.__client is None:
                    self.__client = connect(self._engine, max_pool_size=_MAX_WORKERS * 2)
        return self.__client

    @property
    def _api(self) -> Any:
        return self._docker_client.api

    @property
    def engine(self) -> DockerEngine | None:
        """The engine and registry login it was given (None: the environment's engine, or the
        engine of the client it was given)."""
        return self._engine

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_MAX_WORKERS, thread_name_prefix="shipyard-docker")
            return self._pool

    def close(self) -> None:
        """Closes the thread pools and the docker client. Never raises."""
        self._usage.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        client, self.__client = self.__client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                log.debug("closing the docker client failed", exc_info=True)

    # -- submitting --------------------------------------------------------------------------

    def _run_opts(self) -> runopts:
        return request.run_opts()

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        request.validate(app, cfg)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[DockerJob]:
        images_to_push = self.dryrun_push_images(app, cfg)
        info = AppDryRunInfo(request.build_job(app, cfg, self.session_name), str)
        info._images_to_push = images_to_push
        return info

    def _keep_idempotency_key(self, dryrun_info: AppDryRunInfo[DockerJob], key: str) -> None:
        """Every container carries the key's hash as a label."""
        for c in dryrun_info.request.containers:
            c.kwargs["labels"][LABEL_IDEMPOTENCY_KEY] = hash_key(key)  # type: ignore[index]

    def schedule(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        """Creates the app's network and containers and starts them; returns the app id.

        Workspace images are pushed to ``image_repo`` and the roles' images pulled as the
        job's ``pull`` policy says, before anything is created: a failed pull is a ValueError
        naming the role, the image and the registry's answer. With an idempotency key the
        request is saved and the key claimed (see :mod:`.submit`); if another submission holds
        it, nothing is created and that submission's app id is returned (once its containers
        are all created and started, if its submitter stopped halfway). If anything fails,
        every container and the network created so far are removed before the error is raised.
        """
        job, app = dryrun_info.request, dryrun_info.app
        api = self._api
        self.push_images(dryrun_info._images_to_push)
        images.ensure(api, self._executor(), job, app)
        deadline = submit.submit_deadline(job)
        for c in job.containers:
            c.kwargs["labels"][LABEL_DEADLINE] = repr(deadline)  # type: ignore[index]
        key = str(dryrun_info.idempotency_key or "")
        try:
            winner = self._submit(job, deadline, key)
        except submit.SubmitError as e:
            if not submit.is_pool_exhausted(e):
                raise
            log.info("the engine is out of address pools: retiring ended apps, then retrying")
            self._janitor.sweep()
            winner = self._submit(job, deadline, key)
        if winner is not None:
            log.info("idempotency key %s is held by %s: not submitting again", key, winner)
            return winner
        log.info("submitted %s: %d container(s)", job.app_id, len(job.containers))
        self._janitor.poke()
        return job.app_id

    def _submit(self, job: DockerJob, deadline: float, key: str) -> str | None:
        return submit.submit_job(self._api, self._executor(), job, self.session_name, deadline, key)

    # -- describing --------------------------------------------------------------------------

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's state and the status of every replica, from one containers list call;
        ``None`` if the engine has no trace of the app. Roles are partial (name, image,
        num_replicas, max_retries)."""
        api = self._api
        flt = f"{LABEL_APP_ID}={app_id}"
        containers = state.list_containers(api, flt)
        resp = self._resolve(app_id, containers, lambda: state.list_records(api, flt), time.time())
        self._apply_usage([(resp, containers)])
        return resp

    def _resolve(
        self,
        app_id: str,
        containers: state.Containers,
        records: Callable[[], state.Records],
        now: float,
    ) -> DescribeAppResponse | None:
        """``state.resolve``, then what an ended app no longer needs is freed."""
        seen: dict[str, list[Attempt]] = {}

        def restarts(cs: state.Containers) -> dict[str, list[Attempt]]:
            seen.update(self._restarts(cs))
            return seen

        resp = state.resolve(app_id, containers, records, restarts, now)
        if resp is not None and resp.state == AppState.RUNNING:
            self._gang.stop_survivors(app_id, containers)
        self._free_if_ended(resp, containers, seen)
        return resp

    def _apply_usage(
        self,
        described: Iterable[tuple[DescribeAppResponse | None, state.Containers]],
        budget: int | None = None,
    ) -> None:
        """Each replica's usage (see :mod:`.usage`), and the OOM kills named."""
        found = [(resp, cs) for resp, cs in described if resp is not None and cs]
        if not found:
            return
        self._usage.apply(self._api, found, budget)
        for resp, _ in found:
            if resp.state == AppState.FAILED:
                outcome.apply_oom(resp)

    def read_results(self, app_id: str) -> builtins.list[ReplicaResult]:
        """The collected replicas' results, copied out of their containers (stopped ones
        too), or from the app's archive once retention removed the containers."""
        api = self._api
        containers = state.list_containers(api, f"{LABEL_APP_ID}={app_id}")
        if containers:
            chosen = [c for c in containers if outcome.collected(c.get("Labels") or {})]
            read = self._executor().map(lambda c: outcome.read_container_result(api, c), chosen)
            return sorted(read, key=lambda r: (r.role, r.replica_id))
        desc = self.describe(app_id)
        if desc is None:
            raise ValueError(f"app_id: no Docker app {app_id!r}")
        images = [r.image for r in desc.roles if r.image]
        wanted = [(rs.role, r.id) for rs in desc.roles_statuses for r in rs.replicas]
        found = retire.read_archived_results(api, app_id, images[0], wanted) if images else None
        if found is None:
            raise ValueError(
                f"app {app_id}: its results are gone (cancelled while running: containers removed)"
            )
        return [r for r in found if r.replica_id == 0 or r.present]  # (the archive kept those)

    def preflight(self, dryrun_info: AppDryRunInfo[DockerJob]) -> builtins.list[Problem]:
        """Images present on the engine or, as the ``pull`` option says, to be had from their
        registries (asked with the client's credentials; nothing is pulled), bind sources and
        devices there, entrypoints in their images (see :mod:`.checks`)."""
        app = dryrun_info.app
        if app is None:
            return []
        try:
            pull = request.check_pull_policy((dryrun_info.cfg or {}).get("pull"))
        except ValueError:
            pull = request.DEFAULT_PULL  # (the dry run reports it)
        shell = bool((dryrun_info.cfg or {}).get("time_limit"))
        try:
            return checks.preflight(self._api, app, pull, shell)
        except Exception as e:  # (the engine cannot be reached)
            return [Problem("scheduler", f"the Docker engine cannot be reached: {e}")]

    def describe_many(self, app_ids: Iterable[str]) -> dict[str, DescribeAppResponse | None]:
        """Describes several apps from one containers list call (plus one volume list call if
        some of them have no containers left or are being cancelled)."""
        app_ids = list(app_ids)
        if len(app_ids) == 1:
            return {app_ids[0]: self.describe(app_ids[0])}
        api, now = self._api, time.time()
        grouped = state.by_app(state.list_containers(api, LABEL_APP_ID))
        records: list[state.Records] = []

        def all_records() -> state.Records:
            if not records:
                records.append(state.list_records(api, LABEL_APP_ID))
            return records[0]

        out = {}
        for app_id in app_ids:
            containers = grouped.get(app_id, [])
            out[app_id] = self._resolve(app_id, containers, all_records, now)
        self._apply_usage(((out[a], grouped.get(a, [])) for a in app_ids), POLL_SAMPLES)
        return out

    def _restarts(self, containers: state.Containers) -> dict[str, list[Attempt]]:
        return state.restart_counts(self._api, self._executor(), containers)

    def _free_if_ended(
        self,
        resp: DescribeAppResponse | None,
        containers: state.Containers,
        restarts: dict[str, list[Attempt]],
    ) -> None:
        """Frees the network of an app that ended for good (one engine call, once per app:
        the next submit may need its address pool); asks for a sweep of a half-submitted one."""
        if resp is None or not containers or not is_terminal(resp.state):
            return
        if resp.msg.startswith("submit interrupted"):
            self._janitor.poke()
            return
        network = retire.ended_network(containers, restarts)
        if not network or network in self._freed:
            return
        if len(self._freed) >= _MAX_FREED:  # (forgetting costs one call that finds it gone)
            self._freed.clear()
        self._freed.add(network)
        try:
            submit.remove_network(self._api, network)
            log.info("freed the network of %s (it ended)", resp.app_id)
        except Exception:  # (e.g. the engine stopping: its containers ended, then it went)
            self._freed.discard(network)  # the next describe that sees the end tries again
            log.debug("could not free network %s yet", network, exc_info=True)
        self._janitor.poke()  # (it retires the ended apps past their retention)

    def list(self) -> list[ListAppResponse]:
        """The apps of this session (running, ended, or cancelled) with their states."""
        api, flt = self._api, f"{LABEL_SESSION}={self.session_name}"
        records = self._executor().submit(state.list_records, api, flt)
        grouped = state.by_app(state.list_containers(api, flt))
        found = records.result()
        now = time.time()
        app_ids = sorted(set(grouped) | set(found.tombstones) | set(found.claims))
        return [
            ListAppResponse(app_id=a, state=state.list_state(a, grouped.get(a, []), found, now))
            for a in app_ids
        ]

    def find_by_idempotency_key(
        self, key: str, cfg: Mapping[str, CfgVal] | None = None
    ) -> str | None:
        """The app (of any session) submitted with ``key``: the holder of the key's claim. If
        its submitter stopped halfway (before its deadline), the submission is completed first:
        the retry creates the containers it had not and starts them all, once (see
        :func:`submit.resume`)."""
        from docker.errors import NotFound

        api = self._api
        try:
            labels = api.inspect_volume(claim_name(key)).get("Labels") or {}
        except NotFound:
            return None
        app_id = labels.get(LABEL_APP_ID)
        try:
            if app_id and time.time() <= float(labels.get(LABEL_DEADLINE) or 0):
                submit.resume(api, self._executor(), app_id)
        except Exception:  # (it is then left to read FAILED after its deadline)
            log.warning("could not complete the submission of %s", app_id, exc_info=True)
        return app_id

    # -- cancelling --------------------------------------------------------------------------

    def cancel(self, app_id: str) -> None:
        """Stops every replica (in parallel; SIGKILL after the app's ``stop_timeout``, or the
        scheduler's ``grace`` when it has one), removes
        the containers and the app's network, and records CANCELLED in a tombstone volume.
        An app that has already ended keeps its containers, logs and final state (only its
        network goes). Idempotent; unknown apps are ignored."""
        api = self._api
        submit.take_request(api, app_id)  # (no retry with its key may start it now)
        containers = state.list_containers(api, f"{LABEL_APP_ID}={app_id}")
        if containers:
            resp, _ = state.summarize(app_id, containers, self._restarts(containers), time.time())
            cancelling = any(is_cancelling(c) for c in containers)
            if cancelling or not is_terminal(resp.state):
                retire.write_tombstone(api, app_id, containers, resp, AppState.CANCELLED)
                submit.stop_and_remove(api, containers, grace=self.grace)
        retire.remove_app_networks(api, app_id)

    def sweep(self) -> None:
        """Retires ended apps now, of every session (what submits do in the background): frees
        their networks, and archives the logs and removes the containers of those past their
        ``retention``; removes half-submitted apps past their deadline."""
        self._janitor.sweep()

    def _cancel_existing(self, app_id: str) -> None:
        self.cancel(app_id)

    def purge(self, app_id: str) -> None:
        """Removes every trace of the app: containers, network, tombstone and key claim."""
        api = self._api
        containers = state.list_containers(api, f"{LABEL_APP_ID}={app_id}")
        if containers:
            submit.stop_and_remove(api, containers)
        retire.remove_app_networks(api, app_id)
        submit.remove_records(api, app_id)

    # -- logs --------------------------------------------------------------------------------

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Log lines of replica ``k`` of ``role_name``, from the engine's log of its container
        (or from the app's archive once retention removed it).

        ``since``/``until`` are applied to the lines' Docker timestamps; ``streams`` picks
        stdout, stderr or both (combined, the default); ``should_tail`` follows the replica
        until it has ended for good (across restarts); every line arrives whole.

        Raises:
            ValueError: if the replica has no container and no archive (it never existed, or
                the app was cancelled while running and its containers removed).
        """
        from docker.errors import NotFound

        stream = check_stream(streams, list(Stream))
        lo, hi = logs.timestamp(since, "since"), logs.timestamp(until, "until")
        name = container_name(app_id, role_name, k)
        api = self._api
        try:
            if should_tail:
                api.inspect_container(name)  # fail here, not at the first next()
                return filter_regex(regex, logs.follow(api, name, stream, lo, hi))
            lines: Iterable[str] = logs.read_all(api, name, stream, lo, hi)
        except NotFound:
            lines = self._archived(app_id, role_name, k, stream, lo, hi)
        return list(filter_regex(regex, lines)) if regex else lines

    def _archived(
        self, app_id: str, role: str, k: int, stream: Stream, lo: float | None, hi: float | None
    ) -> builtins.list[str]:
        from docker.errors import NotFound

        api = self._api
        try:
            tomb = api.inspect_volume(TOMBSTONE_PREFIX + app_id).get("Labels") or {}
        except NotFound:
            raise ValueError(
                f"app {app_id}: no replica {role}/{k} (no container {app_id}-...)"
            ) from None
        found = state.from_tombstone(app_id, tomb)
        images = [r.image for r in found.roles if r.name == role and r.image]
        lines = (
            retire.read_archive(api, app_id, images[0], role, k, stream, lo, hi) if images else None
        )
        if lines is None:
            raise ValueError(
                f"app {app_id}: logs of {role}/{k} are gone: the app was cancelled and its"
                " containers removed"
            )
        return lines


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    """Creates a :class:`DockerScheduler` (``local_docker``) for ``session_name``.

    Keyword arguments: ``docker_client`` (a ``docker.DockerClient``) or ``docker_engine`` (a
    :class:`~core.schedulers.docker.engine.DockerEngine`: the engine and registry login to
    connect to); ``grace`` (seconds from SIGTERM to SIGKILL when cancelling, instead of each
    app's ``stop_timeout``); others are ignored.
    """
    return DockerScheduler(
        session_name,
        docker_client=kwargs.get("docker_client"),
        docker_engine=kwargs.get("docker_engine"),
        grace=kwargs.get("grace"),
    )


def has_docker() -> bool:
    """True if the docker SDK is installed and a Docker engine answers."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return False
    try:
        client = connect(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception:
        return False
    return True
