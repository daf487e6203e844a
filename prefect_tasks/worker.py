"""The Shipyard worker: each flow run of a deployment runs as a Shipyard job (work-pool type
``shipyard``).

    prefect work-pool create -t shipyard POOL
    prefect worker start -p POOL --name worker-1    # keep the name: a restart finds its runs

The flow run's command (``python -m prefect.engine`` with ``PREFECT__FLOW_RUN_ID`` and the API's
URL in its environment) becomes a one-role app on any scheduler: local processes, Docker, Slurm
(this host's or a named cluster, e.g. from a :class:`~prefect_tasks.blocks.ShipyardBackend`
block). The job template's variables (``scheduler``, ``cfg``, ``backend``, ``image``, ``cpu``,
``mem_mb``, ``gpu``, ``mounts``, ``env``, ``command``) are edited per deployment as with any work
pool (``job_variables``).

* The job is submitted with an idempotency key made of the flow run and the scheduled state the
  worker picked up, so a retried submission re-attaches to the job it already started.
* The flow run's ``infrastructure_pid`` is the job's app handle. Each job is followed by a
  :class:`core.watch.JobWatch` (its async face, on the worker's event loop); all the jobs of the
  process are polled together by its status poller (one backend call per scheduler per poll),
  and the flow runs being cancelled are read with one API call per poll.
* A job that fails or is cancelled outside Prefect marks its run Crashed or Cancelled; a run
  cancelled in Prefect has its job cancelled (:meth:`ShipyardWorker.kill_infrastructure`: a
  polite stop, then forced after ``grace_seconds``; see :mod:`prefect_tasks.worker_cancel`).
* Each state the job reaches is a Prefect event ``shipyard.job.<state>`` (see
  :mod:`prefect_tasks.events`), related to the flow run, its deployment and this worker.
* A worker that starts follows again the runs of its pool that carry its name and are not final.
* The job's output goes to the worker's log, one record per line, each line once: the job's
  watch reads it once the job runs, and the position reached (a :class:`~core.watch.LogCursor`)
  is checkpointed in a small file per flow run (:class:`OutputCheckpoints`), so a worker
  restarted under its name resumes after the last line it forwarded.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import re
import shlex
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import anyio.to_thread
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import InfrastructureNotFound
from prefect.states import Cancelled, Crashed
from prefect.workers.base import (
    BaseJobConfiguration,
    BaseVariables,
    BaseWorker,
    BaseWorkerResult,
)
from pydantic import Field, SecretStr

from core.clusters import get_cluster
from core.errors import BackendUnavailableError
from core.runner import Runner, Submission, get_runner
from core.schedulers import get_scheduler_factories
from core.specs import (
    AppDef,
    AppHandle,
    AppState,
    AppStatus,
    Resource,
    Role,
    parse_app_handle,
    parse_mounts,
)
from core.watch import JobWatch
from prefect_tasks.blocks import PROCESS_LOGO_URL, Backend, ShipyardBackend, resolve_backend
from prefect_tasks.events import JobEvents
from prefect_tasks.worker_cancel import cancel_within, graced_factories
from prefect_tasks.worker_output import OutputCheckpoints

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

__all__ = [
    "ShipyardJobConfiguration",
    "ShipyardVariables",
    "ShipyardWorker",
    "ShipyardWorkerResult",
    "flow_run_app",
    "idempotency_key",
]

log = logging.getLogger(__name__)

#: the role of the one-role app a flow run runs as
ROLE = "flow-run"
#: seconds between two polls of the jobs the worker follows
DEFAULT_POLL_INTERVAL = 2.0
#: the command Prefect's template gives, run here as the engine module (as the process worker does)
_BASE_COMMAND = "prefect flow-run execute"
_ENGINE_COMMAND = "python -m prefect.engine"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
#: flow runs per API page (the server's default limit)
_PAGE = 200


class ShipyardJobConfiguration(BaseJobConfiguration):
    """How one flow run runs as a Shipyard job (the work pool's template, with the deployment's
    and the flow run's job variables applied)."""

    scheduler: str = Field(default="local_cwd")
    cfg: dict[str, Any] = Field(default_factory=dict)
    #: a Shipyard Backend block (a block reference of the job variables, resolved by Prefect),
    #: or the name of a saved one (deployments made before the variable was typed as a block)
    backend: ShipyardBackend | str | None = Field(default=None)
    image: str | None = Field(default=None)
    cpu: int | None = Field(default=None)
    mem_mb: int | None = Field(default=None)
    gpu: int | None = Field(default=None)
    mounts: list[str] = Field(default_factory=list)
    api_url: str | None = Field(default=None)
    stream_output: bool = Field(default=True)
    poll_interval: float = Field(default=DEFAULT_POLL_INTERVAL, gt=0)

    def prepare_for_flow_run(
        self,
        flow_run: FlowRun,
        deployment: Any = None,
        flow: Any = None,
        work_pool: Any = None,
        worker_name: str | None = None,
        worker_id: uuid.UUID | None = None,
    ) -> None:
        """Prefect's preparation, then the engine command (Prefect's default command runs
        through the runner; here the job is the infrastructure)."""
        super().prepare_for_flow_run(
            flow_run, deployment, flow, work_pool, worker_name, worker_id=worker_id
        )
        if self.command == _BASE_COMMAND:
            self.command = _ENGINE_COMMAND


class ShipyardVariables(BaseVariables):
    """The job variables a deployment may set (shown in the UI's work-pool form)."""

    scheduler: str = Field(
        default="local_cwd",
        description="The Shipyard scheduler: local_cwd, local_dir, local_docker, slurm, or a"
        " plugin's name (ignored when `backend` is set).",
    )
    cfg: dict[str, Any] = Field(
        default_factory=dict,
        title="Run options",
        description="The scheduler's run options (`shipyard runopts NAME`), e.g. partition,"
        " cluster, log_dir.",
    )
    backend: ShipyardBackend | str | None = Field(
        default=None,
        description="A Shipyard Backend block (scheduler, default run options, Docker engine"
        " and registry, Slurm cluster), or the name of a saved one; `cfg` goes over its"
        " options.",
    )
    image: str | None = Field(
        default=None,
        description="A Docker image with Python and Prefect (local_docker), or the directory to"
        " run in (local_dir). local_cwd and slurm run in the worker's (or job's) directory.",
    )
    cpu: int | None = Field(default=None, description="CPUs the job asks for.")
    mem_mb: int | None = Field(
        default=None, title="Memory (MiB)", description="Memory it asks for."
    )
    gpu: int | None = Field(default=None, description="GPUs it asks for.")
    mounts: list[str] = Field(
        default_factory=list,
        description='Docker-style mounts, e.g. "type=bind,src=/code,dst=/code,readonly".',
    )
    api_url: str | None = Field(
        default=None,
        title="Prefect API URL for the job",
        description="The API as the job reaches it. Default: the worker's; a loopback URL is"
        " rewritten to the Docker bridge's gateway for local_docker.",
    )
    stream_output: bool = Field(
        default=True, description="Send the job's output to the worker's log."
    )
    poll_interval: float = Field(
        default=DEFAULT_POLL_INTERVAL, description="Seconds between two polls of the job."
    )

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Prefect's schema of the variables, where a Shipyard Backend block's definition
        requires ``scheduler``: Prefect accepts a block reference (``{"$ref":
        {"block_document_id": ...}}``) for a block variable only if it matches exactly one of
        the block's definition and the reference form, and a block whose fields all have
        defaults matches both (a deployment would be refused)."""
        schema = super().model_json_schema(*args, **kwargs)
        for definition in schema.get("definitions", {}).values():
            if definition.get("block_type_slug") == ShipyardBackend.get_block_type_slug():
                definition["required"] = sorted({*definition.get("required", []), "scheduler"})
        return schema


class ShipyardWorkerResult(BaseWorkerResult):
    """A flow run's job ended: ``identifier`` is its app handle, ``status_code`` its exit code."""


def idempotency_key(flow_run_id: uuid.UUID, scheduled_state_id: uuid.UUID | None) -> str:
    """The key a flow run's job is submitted with: the flow run and the scheduled state the worker
    picked up (a manual retry schedules it again, and gets a new job)."""
    return f"prefect-flow-run-{flow_run_id}-{scheduled_state_id}"


def _app_name(configuration: ShipyardJobConfiguration, flow_run: FlowRun) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", configuration.name or flow_run.name).strip("-.")
    return (name or "flow-run")[:48]


def _docker_gateway() -> str | None:
    """The default Docker bridge's gateway address (where containers reach this host)."""
    import docker

    client = docker.from_env(timeout=10)
    try:
        ipam = client.networks.get("bridge").attrs.get("IPAM") or {}
        for conf in ipam.get("Config") or []:
            if conf.get("Gateway"):
                return str(conf["Gateway"])
            if conf.get("Subnet"):  # Docker's default: the subnet's first address
                return str(next(ipaddress.ip_network(conf["Subnet"]).hosts()))
        return None
    finally:
        client.close()


def _job_api_url(configuration: ShipyardJobConfiguration, scheduler: str) -> str | None:
    """The API URL the job gets: the configured one, or the worker's (seen from a container)."""
    if configuration.api_url:
        return configuration.api_url
    url = configuration.env.get("PREFECT_API_URL")
    if not url or scheduler != "local_docker":
        return url
    parts = urlsplit(url)
    if parts.hostname not in _LOOPBACK:
        return url
    gateway = _docker_gateway()
    if gateway is None:
        return url
    netloc = gateway + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _elsewhere(scheduler: str, cfg: Mapping[str, object] | None) -> bool:
    """Whether the job runs where the worker's files are not: in a container, or on a Slurm
    cluster reached over SSH or slurmrestd (``cfg.cluster`` with such a transport)."""
    if scheduler == "local_docker":
        return True
    cluster = (cfg or {}).get("cluster")
    return scheduler == "slurm" and bool(cluster) and get_cluster(str(cluster)).transport != "local"


def flow_run_app(
    configuration: ShipyardJobConfiguration,
    flow_run: FlowRun,
    scheduler: str,
    cfg: Mapping[str, object] | None = None,
) -> AppDef:
    """The one-role app that runs ``flow_run`` with the scheduler's run options ``cfg``.

    ``python`` in the command is the worker's own interpreter where the job runs on the
    worker's host (as Prefect's process worker does); in a container or on a remote Slurm
    cluster it is the ``python`` found there, and the worker's ``PREFECT_HOME`` is not passed.

    Raises:
        ValueError: naming the job variable that is not usable.
    """
    argv = shlex.split(configuration.command or _ENGINE_COMMAND)
    if not argv:
        raise ValueError("command: empty")
    elsewhere = _elsewhere(scheduler, cfg)
    if argv[0] == "python" and not elsewhere:
        argv[0] = sys.executable
    env = {k: v for k, v in configuration.env.items() if v is not None}
    if elsewhere:
        env.pop("PREFECT_HOME", None)  # the worker's directory; the job's host has its own
    api_url = _job_api_url(configuration, scheduler)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    if scheduler == "local_docker" and not configuration.image:
        raise ValueError("image: local_docker needs an image with Python and Prefect")
    resource = Resource(
        cpu=configuration.cpu or 0, gpu=configuration.gpu or 0, memMB=configuration.mem_mb or 0
    )
    role = Role(
        name=ROLE,
        image=configuration.image or "",
        entrypoint=argv[0],
        args=argv[1:],
        env=env,
        resource=resource,
        mounts=parse_mounts(configuration.mounts) if configuration.mounts else [],
    )
    return AppDef(name=_app_name(configuration, flow_run), roles=[role])


def _runner_key(backend: ShipyardBackend | str | None) -> str | None:
    """Which of the worker's runners serves ``backend``: one per saved block's name, one per
    block given by reference (the same settings, secrets included, share one)."""
    if backend is None or isinstance(backend, str):
        return backend or None
    text = json.dumps(backend.model_dump(), sort_keys=True, default=_plain)
    return "block:" + hashlib.sha256(text.encode()).hexdigest()


def _plain(value: Any) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else repr(value)


def exit_code(status: AppStatus | None) -> int:
    """The job's exit code: 0 if it succeeded, else its first non-zero replica exit code (1 when
    the backend gave none, 143 for a cancelled job without one)."""
    if status is not None and status.state == AppState.SUCCEEDED:
        return 0
    codes = [c for cs in (status.exit_codes() if status else {}).values() for c in cs if c]
    if codes:
        return codes[0]
    return 143 if status is not None and status.state == AppState.CANCELLED else 1


@dataclass
class _Tracked:
    """A job the worker follows until it ends (``done``: its watch)."""

    handle: AppHandle
    flow_run_id: uuid.UUID
    runner: Runner
    done: asyncio.Task[AppStatus | None]
    cancel_requested: bool = False


class ShipyardWorker(BaseWorker[ShipyardJobConfiguration, ShipyardVariables, ShipyardWorkerResult]):
    """Runs each flow run of its work pool as a Shipyard job and follows the job to its end."""

    type = "shipyard"
    job_configuration = ShipyardJobConfiguration
    job_configuration_variables = ShipyardVariables
    _description = (
        "Run each flow run as a Shipyard job: local processes, a Docker engine or a Slurm cluster"
        " (this host's, over SSH or slurmrestd)."
    )
    #: Prefect's page on work pools and workers (Shipyard has no documentation site)
    _documentation_url = "https://docs.prefect.io/v3/concepts/work-pools"
    #: (Shipyard has no logo hosted anywhere: the icon of Prefect's own process worker)
    _logo_url = PROCESS_LOGO_URL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._runners: dict[str | None, Runner] = {}  # (by _runner_key of the backend)
        self._tracked: dict[AppHandle, _Tracked] = {}
        self._intervals: dict[AppHandle, float] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._output_log = logging.getLogger(f"prefect.workers.shipyard.{self.name}")
        #: where the output position of each followed run is kept
        self.checkpoints = OutputCheckpoints.for_worker(self.name)
        #: polls of the followed jobs so far
        self.polls = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def setup(self) -> None:
        """Prefect's set-up, then the job poller and the runs this worker followed before."""
        await super().setup()
        self._spawn(self._poll_loop())
        self._spawn(self._adopt_runs())

    async def teardown(self, *exc_info: Any) -> None:
        """Stops following (the jobs keep running: a restarted worker finds them again, and
        forwards their output from the checkpoints)."""
        for tracked in self._tracked.values():
            tracked.done.cancel()
        for t in list(self._background):
            t.cancel()
        await super().teardown(*exc_info)
        runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            runner.close()

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    # -- backends ----------------------------------------------------------------------------

    async def _backend(self, configuration: ShipyardJobConfiguration) -> tuple[Backend, Runner]:
        """The backend and runner of a configuration (a runner per backend block, kept)."""
        chosen = configuration.backend
        if chosen:
            block: object = (
                chosen
                if isinstance(chosen, ShipyardBackend)
                else await ShipyardBackend.aload(chosen)
            )
            assert isinstance(block, ShipyardBackend)
            backend = await anyio.to_thread.run_sync(block.resolve, configuration.cfg)
        else:
            backend = await anyio.to_thread.run_sync(
                resolve_backend, configuration.scheduler, configuration.cfg
            )
        if not backend.scheduler or backend.scheduler not in get_scheduler_factories():
            raise ValueError(
                f"scheduler: unknown scheduler {backend.scheduler!r}; expected one of"
                f" {', '.join(get_scheduler_factories())}"
            )
        key = _runner_key(chosen)
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners.setdefault(key, backend.runner())
        return backend, runner

    # -- running -----------------------------------------------------------------------------

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ShipyardJobConfiguration,
        task_status: anyio.abc.TaskStatus[Any] | None = None,
    ) -> ShipyardWorkerResult:
        """Submits the flow run as a Shipyard job (once, by its idempotency key), reports the
        app handle as the run's infrastructure pid, and follows the job to its end."""
        backend, runner = await self._backend(configuration)
        assert backend.scheduler is not None
        app = flow_run_app(configuration, flow_run, backend.scheduler, backend.cfg)
        key = idempotency_key(flow_run.id, await self._picked_state(flow_run.id))

        def submit() -> Submission:
            return runner.attach_or_submit(app, backend.scheduler, backend.cfg, key=key)

        sub = await anyio.to_thread.run_sync(submit)
        handle = sub.handle
        self.get_flow_run_logger(flow_run).info(
            "Shipyard job %s %s (idempotency key %s)",
            handle,
            f"re-attached to ({sub.state})" if sub.attached else "submitted",
            key,
        )
        if task_status is not None:
            task_status.started(handle)
        return await self._follow(flow_run, configuration, runner, handle)

    async def _follow(
        self,
        flow_run: FlowRun,
        configuration: ShipyardJobConfiguration,
        runner: Runner,
        handle: AppHandle,
    ) -> ShipyardWorkerResult:
        """Waits for the job to end; a cancelled job cancels its run. Returns its exit code."""
        tracked = self._tracked.get(handle)
        if tracked is None:
            watching = self._watch(flow_run, configuration, runner, handle)
            task = asyncio.get_running_loop().create_task(watching)
            tracked = _Tracked(handle, flow_run.id, runner, task)
            self._tracked[handle] = tracked
            self._intervals[handle] = configuration.poll_interval
        try:
            status = await asyncio.shield(tracked.done)
        finally:
            if tracked.done.done():
                self._tracked.pop(handle, None)
                self._intervals.pop(handle, None)
        code = exit_code(status)
        state = status.state.name if status else "gone"
        run_logger = self.get_flow_run_logger(flow_run)
        (run_logger.info if code == 0 else run_logger.error)(
            "Shipyard job %s ended %s (exit code %d)", handle, state, code
        )
        if status is None or status.state == AppState.CANCELLED:
            await self._cancel_flow_run(flow_run.id, tracked, f"Shipyard job {handle} {state}")
        return ShipyardWorkerResult(identifier=handle, status_code=code)

    async def _watch(
        self,
        flow_run: FlowRun,
        configuration: ShipyardJobConfiguration,
        runner: Runner,
        handle: AppHandle,
    ) -> AppStatus | None:
        """Follows the job to its end, its output to the worker's log (``run-name | role/k
        line``) from the run's checkpoint. A backend that stays unreachable past the retry
        budget is told in the run's log, and the job followed on: it may well be running."""
        prefix = flow_run.name
        output = self._output_log
        events = JobEvents(
            handle,
            _app_name(configuration, flow_run),
            self._event_related_resources(configuration, include_self=True),
        )
        while True:
            watch = JobWatch(
                runner,
                handle,
                poll_interval=configuration.poll_interval,
                logger=output,
                logs=configuration.stream_output,
                on_line=lambda line: output.info("%s | %s", prefix, line),
                cursor=self.checkpoints.store(flow_run.id, handle),
                on_status=events,
            )
            try:
                return (await watch.run_async()).status
            except BackendUnavailableError as e:
                self.get_flow_run_logger(flow_run).error("%s (still following the job)", e)

    async def _cancel_flow_run(
        self, flow_run_id: uuid.UUID, tracked: _Tracked, message: str
    ) -> None:
        """Marks the run Cancelled, unless it already ended by itself (its cancellation asked
        for, the run ends Cancelled whatever the engine reported while it was being stopped)."""
        run = await self.client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.is_final() and not tracked.cancel_requested:
            return
        await self.client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)

    # -- cancelling: one poll of the flow runs ------------------------------------------------

    async def _poll_loop(self) -> None:
        """Cancels the jobs of the followed runs being cancelled, every poll interval."""
        while True:
            interval = min(self._intervals.values(), default=DEFAULT_POLL_INTERVAL)
            await asyncio.sleep(interval)  # the poll period itself
            if not self._tracked:
                continue
            try:
                await self.poll_once()
            except Exception:
                self._output_log.warning("polling the flow runs failed", exc_info=True)

    async def poll_once(self) -> None:
        """One round: one API call for the followed jobs' flow runs (per 200 runs); cancels
        the jobs of the runs being cancelled (their watches then see them end)."""
        tracked = list(self._tracked.values())
        self.polls += 1
        # (their statuses: the process's status poller, on the ticks of the same interval)
        self._output_log.debug("poll %d: %d Shipyard jobs", self.polls, len(tracked))
        run_states = await self._flow_run_states([t.flow_run_id for t in tracked])
        for t in tracked:
            if run_states.get(t.flow_run_id) == StateType.CANCELLING and not t.cancel_requested:
                t.cancel_requested = True
                self._output_log.info(
                    "flow run %s is cancelling: cancelling %s", t.flow_run_id, t.handle
                )
                await anyio.to_thread.run_sync(t.runner.cancel, t.handle)

    async def _flow_run_states(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, StateType | None]:
        """The state types of the runs: one API call per page of runs (the API's limit)."""
        states: dict[uuid.UUID, StateType | None] = {}
        for start in range(0, len(ids), _PAGE):
            chunk = ids[start : start + _PAGE]
            runs = await self.client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=chunk)), limit=len(chunk)
            )
            states.update({r.id: (r.state.type if r.state else None) for r in runs})
        return states

    # -- cancelling --------------------------------------------------------------------------

    async def kill_infrastructure(
        self,
        infrastructure_pid: str,
        configuration: ShipyardJobConfiguration,
        grace_seconds: int = 30,
    ) -> None:
        """Cancels the job whose app handle is ``infrastructure_pid``: a polite stop (SIGTERM
        to its replicas), up to ``grace_seconds`` for it to end, then a forced one (SIGKILL on
        local processes; Docker and Slurm force it after their own grace, ``stop_timeout`` and
        ``KillWait``: see :mod:`prefect_tasks.worker_cancel`).

        Raises:
            InfrastructureNotFound: no such job.
        """
        try:
            parse_app_handle(infrastructure_pid)
        except Exception:
            raise InfrastructureNotFound(
                f"not a Shipyard app handle: {infrastructure_pid!r}"
            ) from None
        backend, runner = await self._backend(configuration)
        status = await anyio.to_thread.run_sync(runner.status, infrastructure_pid)
        if status is None:
            raise InfrastructureNotFound(f"no Shipyard job {infrastructure_pid}")
        tracked = self._tracked.get(infrastructure_pid)
        if tracked is not None:
            tracked.cancel_requested = True
        factories = backend.factories() or get_scheduler_factories()

        def graced(grace: float) -> Runner:
            return get_runner(scheduler_factories=graced_factories(factories, grace))

        await cancel_within(graced, infrastructure_pid, grace_seconds, self._output_log)

    # -- a restarted worker ------------------------------------------------------------------

    async def _adopt_runs(self) -> None:
        """Follows again the unfinished runs of this pool that carry this worker's name."""
        try:
            runs = await self._unfinished_runs()
        except Exception:
            self._output_log.warning("cannot list the pool's unfinished flow runs", exc_info=True)
            return
        mine = [r for r in runs if (r.labels or {}).get("prefect.worker.name") == self.name]
        self._prune_checkpoints({r.id for r in mine})
        for run in mine:
            self._spawn(self._adopt(run))

    async def _unfinished_runs(self) -> list[FlowRun]:
        """The pool's pending, running and cancelling runs (every page of them)."""
        runs: list[FlowRun] = []
        while True:
            page = await self.client.read_flow_runs(
                work_pool_filter=WorkPoolFilter(
                    name=WorkPoolFilterName(any_=[self.work_pool.name])
                ),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(
                            any_=[StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
                        )
                    )
                ),
                sort=FlowRunSort.ID_DESC,
                limit=_PAGE,
                offset=len(runs),
            )
            runs.extend(page)
            if len(page) < _PAGE:
                return runs

    def _prune_checkpoints(self, runs: set[uuid.UUID]) -> None:
        """Removes the output checkpoints of runs that ended while no worker followed them."""
        keep = runs | {t.flow_run_id for t in self._tracked.values()}
        try:
            removed = self.checkpoints.prune(keep)
        except OSError as e:
            self._output_log.warning("cannot prune the output checkpoints: %s", e)
            return
        if removed:
            self._output_log.info("removed the output checkpoints of ended runs: %s", removed)

    async def _adopt(self, flow_run: FlowRun) -> None:
        run_logger = self.get_flow_run_logger(flow_run)
        try:
            configuration = await self.job_configuration.resolve_for_flow_run(
                flow_run,
                client=self.client,
                work_pool=self.work_pool,
                worker_name=self.name,
                worker_id=self.backend_id,
            )
            backend, runner = await self._backend(configuration)
            handle = await self._find_job(flow_run, backend, runner)
        except Exception:
            run_logger.exception(
                "Worker %r cannot find the job of flow run %s", self.name, flow_run.id
            )
            return
        if handle is None:
            await self.client.set_flow_run_state(
                flow_run.id, Crashed(message="The worker stopped before submitting its job.")
            )
            return
        run_logger.info("Worker %r follows Shipyard job %s again", self.name, handle)
        result = await self._follow(flow_run, configuration, runner, handle)
        if result.status_code != 0:
            await self.client.set_flow_run_state(
                flow_run.id,
                Crashed(message=f"Shipyard job {handle} exited with code {result.status_code}"),
            )

    async def _find_job(
        self, flow_run: FlowRun, backend: Backend, runner: Runner
    ) -> AppHandle | None:
        """The run's job: its infrastructure pid, else the job of its idempotency key."""
        if flow_run.infrastructure_pid:
            return flow_run.infrastructure_pid
        picked = await self._picked_state(flow_run.id)
        if picked is None:
            return None
        key = idempotency_key(flow_run.id, picked)
        assert backend.scheduler is not None
        return await anyio.to_thread.run_sync(runner.find, backend.scheduler, key, backend.cfg)

    async def _picked_state(self, flow_run_id: uuid.UUID) -> uuid.UUID | None:
        """The scheduled state a worker picked the run up from: the last one before its last
        Pending state (the same before and after the job starts, new when the run is retried)."""
        picked = last_scheduled = None
        for state in await self.client.read_flow_run_states(flow_run_id):
            if state.type == StateType.SCHEDULED:
                last_scheduled = state.id
            elif state.type == StateType.PENDING:
                picked = last_scheduled
        return picked
