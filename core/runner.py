"""The handle-level API used by the CLI, the Airflow provider and the Prefect tasks.

Every method after :meth:`Runner.run` takes an app handle ``{scheduler}://{session}/{app_id}``, so a
handle passed between processes (XCom, a Prefect result, a terminal) is all that is needed to
describe, follow or cancel an app.

>>> from core.runner import get_runner
>>> from core.specs import AppDef, Role
>>> with get_runner() as runner:  # doctest: +SKIP
...     handle = runner.run(AppDef("hi", [Role("echo", entrypoint="echo", args=["hi"])]), "local_cwd")
...     runner.wait(handle).state
<AppState.SUCCEEDED: 4>
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.array_runner import ArrayRunner
from core.errors import ShipyardError
from core.functions import FunctionRunner
from core.reasons import fill_reasons
from core.reports import AppResult, Problem, problem_from_error
from core.schedulers import SchedulerFactory, available_schedulers, get_default_scheduler_name
from core.schedulers.api import ListAppResponse, Scheduler, Stream
from core.specs import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppHandle,
    AppState,
    AppStatus,
    Cfg,
    is_array_id,
    make_app_handle,
    parse_app_handle,
    runopts,
)

if TYPE_CHECKING:
    from datetime import datetime

    from core.watch.follow import LogLine

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SESSION",
    "AppFailedError",
    "Runner",
    "Submission",
    "attempt_key",
    "get_runner",
]

#: the session name used when none is given (override with ``SHIPYARD_SESSION``)
DEFAULT_SESSION = "shipyard"


class AppFailedError(ShipyardError, RuntimeError):
    """An app ended in a state other than SUCCEEDED.

    Carries ``handle``, ``status`` (the final :class:`AppStatus`), ``exit_codes`` by role and the
    ``last_lines`` of each failed replica's log, and says all of it in its message.
    """

    def __init__(
        self,
        handle: AppHandle,
        status: AppStatus | None,
        last_lines: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.handle = handle
        self.status = status
        self.state = status.state if status else AppState.UNKNOWN
        self.exit_codes = status.exit_codes() if status else {}
        #: why it ended (a :class:`core.specs.Reason` value), if known
        self.reason = status.reason if status else None
        self.last_lines = dict(last_lines or {})
        super().__init__(self._message())

    def __reduce__(self) -> tuple[Any, ...]:
        # picklable with its fields (Prefect persists and ships a failed task's exception)
        return (type(self), (self.handle, self.status, self.last_lines))

    def _message(self) -> str:
        codes = ", ".join(
            f"{role}/{i}={code}"
            for role, role_codes in self.exit_codes.items()
            for i, code in enumerate(role_codes)
            if code not in (None, 0)
        )
        head = f"app {self.handle} ended {self.state.name}"
        if codes:
            head += f" (exit codes: {codes})"
        if self.reason not in (None, "exit_code", self.state.name.lower()):
            head += f", reason {self.reason}"
        if self.status and self.status.msg and self.status.msg != NONE:
            head += f": {self.status.msg}"
        parts = [head]
        for replica, lines in self.last_lines.items():
            if lines:
                parts.append(f"--- last {len(lines)} log lines of {replica} ---")
                parts.extend(line.rstrip("\n") for line in lines)
        return "\n".join(parts)


def attempt_key(key: str, attempt: int) -> str:
    """The idempotency key of one attempt of a retried submission: ``key`` for the first,
    ``key:N`` for attempt ``N`` (see :meth:`Runner.attach_or_submit`)."""
    return key if attempt <= 1 else f"{key}:{attempt}"


@dataclass(frozen=True)
class Submission:
    """What :meth:`Runner.attach_or_submit` did: the job's ``handle``, the idempotency ``key``
    it carries, whether it was ``attached`` to (submitted earlier) rather than submitted now,
    and its ``state`` name when found (``SUBMITTED`` for a new one)."""

    handle: AppHandle
    key: str
    attached: bool
    state: str


class Runner(ArrayRunner, FunctionRunner):
    """Submits apps to schedulers and addresses them by app handle afterwards.

    Args:
        name: the session name apps are submitted under
        scheduler_factories: available schedulers (default: :func:`available_schedulers`)
        scheduler_params: keyword arguments passed to every scheduler factory
    """

    def __init__(
        self,
        name: str,
        scheduler_factories: Mapping[str, SchedulerFactory] | None = None,
        scheduler_params: Mapping[str, Any] | None = None,
    ) -> None:
        self._name = name
        self._plain = scheduler_factories is None and not scheduler_params
        self._factories: Mapping[str, SchedulerFactory] = (
            dict(scheduler_factories) if scheduler_factories else available_schedulers()
        )
        self._scheduler_params = dict(scheduler_params or {})
        self._schedulers: dict[tuple[str, str], Scheduler[Any]] = {}
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes every scheduler this runner created. Never raises."""
        with self._lock:
            schedulers, self._schedulers = list(self._schedulers.values()), {}
        for sched in schedulers:
            try:
                sched.close()
            except Exception:  # close must never raise
                log.debug("closing %s failed", sched, exc_info=True)

    @property
    def session_name(self) -> str:
        """The session apps are submitted under."""
        return self._name

    @property
    def uses_defaults(self) -> bool:
        """Whether the runner makes its schedulers the default way (any such runner, of any
        session, reaches the same apps: e.g. not one given a remote Docker engine's client)."""
        return self._plain

    def sibling(self) -> Runner:
        """A new runner of the same session that reaches the same apps (e.g. for another
        thread to own: a runner is closed by whoever made it)."""
        if self._plain:
            return Runner(self._name)
        return Runner(self._name, self._factories, self._scheduler_params)

    def scheduler_backends(self) -> Collection[str]:
        """Names of the schedulers this runner can use (listed when iterated; ``in`` finds a
        built-in one without reading the installed packages' entry points)."""
        return self._factories.keys()

    def _scheduler(self, backend: str, session: str | None = None) -> Scheduler[Any]:
        session = self._name if session is None else session
        key = (backend, session)
        sched = self._schedulers.get(key)  # (no lock for one that exists: every call asks)
        if sched is not None:
            return sched
        with self._lock:
            sched = self._schedulers.get(key)
            if sched is None:
                factory = self._factories.get(backend)
                if factory is None:
                    raise ValueError(
                        f"scheduler: unknown scheduler {backend!r}; expected one of"
                        f" {', '.join(self._factories)}"
                    )
                sched = factory(session, **self._scheduler_params)
                self._schedulers[key] = sched
            return sched

    def _handle_scheduler(self, app_handle: AppHandle) -> tuple[Scheduler[Any], str]:
        parsed = parse_app_handle(app_handle)
        return self._scheduler(parsed.scheduler_backend, parsed.session_name), parsed.app_id

    # -- submitting --------------------------------------------------------------------------

    def dryrun(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Cfg | None = None,
        workspace: str | None = None,
        idempotency_key: str | None = None,
    ) -> AppDryRunInfo[Any]:
        """The request that :meth:`run` would submit (``str()`` of it is printable); with
        ``idempotency_key``, one that claims the key when scheduled."""
        sched = self._scheduler(scheduler)
        if workspace:
            cfg = sched.resolve_cfg(cfg)
            app = sched.apply_workspace(app, workspace, cfg)
        return sched.submit_dryrun(app, cfg, idempotency_key=idempotency_key)

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> AppHandle:
        """Submits a request made by :meth:`dryrun` and returns the app handle."""
        if dryrun_info.scheduler is None:
            raise ValueError("dryrun_info: not made by a scheduler's submit_dryrun")
        sched = self._scheduler(dryrun_info.scheduler)
        app_id = sched.schedule(dryrun_info)
        handle = make_app_handle(sched.backend, sched.session_name, app_id)
        log.info("launched %s", handle)
        return handle

    def run(
        self,
        app: AppDef,
        scheduler: str | None = None,
        cfg: Cfg | None = None,
        workspace: str | None = None,
        idempotency_key: str | None = None,
        *,
        after: builtins.list[AppHandle] | None = None,
        after_condition: str = "ok",
    ) -> AppHandle:
        """Submits ``app`` to ``scheduler`` (default: the default scheduler) and returns its handle.

        With ``idempotency_key``, an app already submitted with the same key (by any process) is
        returned instead of submitting a second one. The lookup below is only a shortcut; the
        scheduler's ``schedule`` claims the key atomically, so two submitters racing with one
        key also get one app. A task that is retried uses :meth:`attach_or_submit`.

        With ``after`` (app or array handles), the app is PENDING until they ended as
        ``after_condition`` says: ``ok`` (all succeeded), ``any`` (all ended), ``notok`` (all
        ended without success). When that can no longer be, it ends CANCELLED with a message
        naming the dependency. It is then submitted by a driver process like an array's
        element (see :meth:`run_array`); its handle stands for it whether it started or not.
        """
        scheduler = scheduler or get_default_scheduler_name()
        if after:
            if workspace:
                raise ValueError("workspace: not supported with after yet")
            return self._run_after(app, scheduler, cfg, after, after_condition, idempotency_key)
        if idempotency_key:
            existing = self.find(scheduler, idempotency_key, cfg)
            if existing:
                log.info("re-attaching to %s (idempotency key %s)", existing, idempotency_key)
                return existing
        return self.schedule(self.dryrun(app, scheduler, cfg, workspace, idempotency_key))

    def attach_or_submit(
        self,
        app: AppDef,
        scheduler: str | None = None,
        cfg: Cfg | None = None,
        *,
        key: str,
        attempt: int = 1,
        workspace: str | None = None,
    ) -> Submission:
        """Submits ``app`` once per attempt of something that may be retried (an Airflow task
        instance, a Prefect task run, a flow run picked up by a worker), re-attaching instead
        where an earlier submission's job is still of use.

        Each attempt ``n`` tags its job with :func:`attempt_key` ``(key, n)``. The attempts'
        jobs are looked up newest first (``attempt``, ``attempt - 1``, ... 1); the first one
        found decides: this attempt's own job (submitted before a crash) is re-attached to
        whatever its state, an earlier attempt's job that is still queued, running or
        succeeded is re-attached to, and one that failed or was cancelled is what this attempt
        is for: the app is submitted under this attempt's key.

        Raises:
            ValueError: ``key`` empty or ``attempt`` below 1, naming it.
        """
        if not isinstance(key, str) or not key:
            raise ValueError(f"key: expected a non-empty idempotency key, got {key!r}")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"attempt: expected a positive integer, got {attempt!r}")
        scheduler = scheduler or get_default_scheduler_name()
        latest = self.find_latest(scheduler, key, attempt, cfg)
        if latest is not None:
            found, n = latest
            status = self.status(found)
            state = status.state.name if status is not None else "UNKNOWN"
            ended_badly = status is None or status.state in (AppState.FAILED, AppState.CANCELLED)
            if n == attempt or not ended_badly:
                log.info("re-attaching to %s (%s, key %s)", found, state, attempt_key(key, n))
                return Submission(found, attempt_key(key, n), True, state)
            log.info("the job of attempt %d, %s, ended %s: submitting a new one", n, found, state)
        mine = attempt_key(key, attempt)
        handle = self.schedule(self.dryrun(app, scheduler, cfg, workspace, mine))
        return Submission(handle, mine, False, AppState.SUBMITTED.name)

    def find_latest(
        self, scheduler: str, key: str, attempt: int, cfg: Cfg | None = None
    ) -> tuple[AppHandle, int] | None:
        """The newest of the jobs that attempts ``attempt``, ``attempt - 1``, ... 1 submitted
        with :func:`attempt_key` ``(key, n)`` (see :meth:`attach_or_submit`), and its attempt
        number; None if none did."""
        for n in range(attempt, 0, -1):
            found = self.find(scheduler, attempt_key(key, n), cfg)
            if found is not None:
                return found, n
        return None

    def find(
        self,
        scheduler: str,
        idempotency_key: str,
        cfg: Cfg | None = None,
    ) -> AppHandle | None:
        """The handle of the app submitted to ``scheduler`` with ``idempotency_key``, or None
        (``cfg``: the run configuration it was submitted with, e.g. its Slurm ``cluster``)."""
        sched = self._scheduler(scheduler)
        app_id = sched.find_by_idempotency_key(idempotency_key, sched.resolve_cfg(cfg))
        return make_app_handle(sched.backend, sched.session_name, app_id) if app_id else None

    # -- arrays: see core.array_runner ----------------------------------------------------------

    def scheduler(self, backend: str) -> Scheduler[Any]:
        """This session's scheduler of ``backend`` (made on first use, closed with the runner)."""
        return self._scheduler(backend)

    # -- observing ---------------------------------------------------------------------------

    def status(self, app_handle: AppHandle) -> AppStatus | None:
        """The app's current status, or None if the scheduler does not know it. For an array,
        the aggregate state with each element's status in ``elements`` (see :meth:`run_array`)."""
        if is_array_id(parse_app_handle(app_handle).app_id):
            return self._array_status(app_handle)
        sched, app_id = self._handle_scheduler(app_handle)
        return _to_status(sched.describe(app_id))

    def status_many(self, app_handles: Iterable[AppHandle]) -> dict[AppHandle, AppStatus | None]:
        """Statuses of several apps; one backend call per scheduler where the backend allows."""
        groups: dict[tuple[str, str], list[tuple[AppHandle, str]]] = {}
        out: dict[AppHandle, AppStatus | None] = {}
        for handle in app_handles:
            p = parse_app_handle(handle)
            if is_array_id(p.app_id):  # (a file read, or the element's own app)
                out[handle] = self._array_status(handle)
                continue
            groups.setdefault((p.scheduler_backend, p.session_name), []).append((handle, p.app_id))
        for (backend, session), items in groups.items():
            described = self._scheduler(backend, session).describe_many([a for _, a in items])
            for handle, app_id in items:
                out[handle] = _to_status(described.get(app_id))
        return out

    def notify_changes(
        self, app_handle: AppHandle, callback: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Calls ``callback()`` (from another thread) whenever the app's state may have
        changed, until the returned function is called; None when its scheduler cannot tell
        (see ``Scheduler.notify_changes``; arrays: None). The watch polls at once on it."""
        if is_array_id(parse_app_handle(app_handle).app_id):
            return None
        sched, app_id = self._handle_scheduler(app_handle)
        return sched.notify_changes(app_id, callback)

    def describe(self, app_handle: AppHandle) -> AppDef | None:
        """The app as the scheduler knows it (roles may be partial), or None if unknown (an
        array: the app its elements run)."""
        if is_array_id(parse_app_handle(app_handle).app_id):
            return self._describe_array(app_handle)
        sched, app_id = self._handle_scheduler(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            return None
        return AppDef(name=app_id, roles=list(desc.roles))

    def wait(
        self,
        app_handle: AppHandle,
        wait_interval: float = 1.0,
        timeout: float | None = None,
    ) -> AppStatus | None:
        """Blocks until the app is terminal and returns its final status (None if unknown).

        Polls quickly at first (1 ms, doubling), backing off to ``wait_interval`` seconds,
        and at once when the scheduler tells that the app may have changed (a local app
        launched by this process: as each replica ends; see :meth:`notify_changes`); through
        :class:`core.watch.JobWatch`, so a transient failure to read the status is retried
        within the retry budget (:mod:`core.transient`).

        Raises:
            TimeoutError: if ``timeout`` seconds pass first (the app keeps running).
            BackendUnavailableError: the backend kept failing for longer than the retry budget.
        """
        from core.watch.job import JobWatch

        watch = JobWatch(
            self,
            app_handle,
            poll_interval=wait_interval,
            first_delay=min(0.001, wait_interval),
            shared=False,
            timeout=timeout,
        )
        return watch.run().status

    def list(self, scheduler: str | None = None, cfg: Cfg | None = None) -> list[ListAppResponse]:
        """Apps on ``scheduler`` (default: the default scheduler), with handles filled in
        (``cfg``: where the backend needs it, e.g. the Slurm ``cluster`` to list)."""
        sched = self._scheduler(scheduler or get_default_scheduler_name())
        apps = sched.list(sched.resolve_cfg(cfg)) if cfg else sched.list()  # type: ignore[call-arg]
        for app in apps:
            app.app_handle = make_app_handle(sched.backend, sched.session_name, app.app_id)
        return apps

    def log_lines(
        self,
        app_handle: AppHandle,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Log lines of replica ``k`` of ``role_name`` (see ``Scheduler.log_iter``).

        Raises:
            ValueError: if the app, role or replica does not exist (or the element has not
                started).
        """
        app_handle = self._element_app(app_handle)
        sched, app_id = self._handle_scheduler(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            raise ValueError(f"app handle: no app {app_handle} on {sched.backend}")
        roles = {rs.role: rs for rs in desc.roles_statuses}
        if roles and role_name not in roles:
            raise ValueError(
                f"role: app {app_handle} has no role {role_name!r}; roles: {list(roles)}"
            )
        if roles and all(r.id != k for r in roles[role_name].replicas):
            raise ValueError(f"replica: role {role_name!r} of {app_handle} has no replica {k}")
        return sched.log_iter(app_id, role_name, k, regex, since, until, should_tail, streams)

    def replicas(self, app_handle: AppHandle) -> builtins.list[tuple[str, int]]:
        """``(role, replica_id)`` of every replica of the app (empty if unknown)."""
        status = self.status(app_handle)
        if status is None:
            return []
        return [(rs.role, r.id) for rs in status.roles for r in rs.replicas]

    def stream_logs(
        self,
        app_handle: AppHandle,
        should_tail: bool = True,
        regex: str | None = None,
        streams: Stream | None = None,
        since: datetime | None = None,
    ) -> Iterator[LogLine]:
        """Log lines of every replica, interleaved as they arrive; each replica's lines in order
        (a :class:`~core.watch.follow.LogLine` each: ``role``, ``replica``, ``line``); with
        ``since``, from then on.

        With ``should_tail`` it follows the app until it is terminal. A replica whose log cannot
        be read is logged as a warning and skipped; the others go on.
        """
        from core.watch.follow import stream_logs

        return stream_logs(
            self,
            app_handle,
            self.replicas(app_handle),
            should_tail=should_tail,
            regex=regex,
            streams=streams,
            since=since,
        )

    def last_lines(
        self, app_handle: AppHandle, status: AppStatus | None = None, n: int = 20
    ) -> dict[str, builtins.list[str]]:
        """The last ``n`` log lines of every replica that did not succeed, by ``role/replica``."""
        status = status or self.status(app_handle)
        out: dict[str, builtins.list[str]] = {}
        if status is None:
            return out
        for rs in status.roles:
            for r in rs.replicas:
                if r.state == AppState.SUCCEEDED:
                    continue
                try:
                    tail = deque(self.log_lines(app_handle, rs.role, r.id), maxlen=n)
                except Exception as e:
                    log.debug("no logs for %s %s/%d: %s", app_handle, rs.role, r.id, e)
                    continue
                out[f"{rs.role}/{r.id}"] = list(tail)
        return out

    def check_succeeded(self, app_handle: AppHandle, status: AppStatus | None) -> AppStatus:
        """Returns ``status`` if the app SUCCEEDED, else raises :class:`AppFailedError`."""
        if status is not None and status.state == AppState.SUCCEEDED:
            return status
        raise AppFailedError(app_handle, status, self.last_lines(app_handle, status))

    # -- acting ------------------------------------------------------------------------------

    def cancel(self, app_handle: AppHandle) -> None:
        """Cancels the app (idempotent; does not wait for it to be CANCELLED). An array: every
        element not yet ended (those waiting for a slot never start)."""
        p = parse_app_handle(app_handle)
        if is_array_id(p.app_id):
            from core import arrays

            if arrays.split_element_id(p.app_id)[1] is None:
                for element in arrays.cancel_array(self._array(app_handle)[0]):
                    self.cancel(element)
                log.info("cancelled array %s", app_handle)
                return
        app_handle = self._element_app(app_handle)
        sched, app_id = self._handle_scheduler(app_handle)
        sched.cancel(app_id)
        log.info("cancelled %s", app_handle)

    stop = cancel

    def run_opts(self) -> dict[str, runopts]:
        """The run options of every scheduler, by name (schedulers that fail to load are left out)."""
        out: dict[str, runopts] = {}
        for backend in self._factories:
            try:
                out[backend] = self.scheduler_run_opts(backend)
            except Exception as e:
                log.debug("scheduler %s unavailable: %s", backend, e)
        return out

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        """The run options of one scheduler."""
        return self._scheduler(scheduler).run_opts()

    # -- results and pre-flight checks (issue 19) ----------------------------------------------

    def result(self, app_handle: AppHandle) -> AppResult:
        """What the app's replicas wrote to ``$SHIPYARD_RESULT_FILE`` (see :mod:`core.reports`):
        replica 0 of each role, or every replica with the run option ``result_replicas=all``.

        Read whenever asked (a replica still running may not have written yet). A replica's
        oversized (> 1 MiB) or invalid JSON is an error naming it in the returned
        :class:`AppResult` (``.errors``; ``.get(role, k)`` raises it), never an exception here.

        Raises:
            ValueError: the app is unknown (the message names the handle).
            NotImplementedError: its scheduler does not collect results.
        """
        if is_array_id(parse_app_handle(app_handle).app_id):
            from core import arrays

            adir, index = self._array(app_handle)
            element = arrays.element_status(adir, index) if index is not None else None
            if element is not None and element.handle is None:  # (it never started)
                return AppResult(app_handle, element.state, [])
        app_handle = self._element_app(app_handle)
        sched, app_id = self._handle_scheduler(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            raise ValueError(f"app handle: no app {app_handle} on {sched.backend}")
        replicas = sched.read_results(app_id)
        return AppResult(app_handle, desc.state, replicas)

    def preflight(
        self,
        app: AppDef,
        scheduler: str | None = None,
        cfg: Cfg | None = None,
        workspace: str | None = None,
    ) -> builtins.list[Problem]:
        """Every problem a submit of ``app`` to ``scheduler`` would hit, found without starting
        anything: the app's and cfg's validation, then the backend's own checks
        (``Scheduler.preflight``: Slurm ``sbatch --test-only`` per component with its
        estimated start, Docker images/devices/mounts, local entrypoints and directories).
        Each :class:`Problem` names its field; ``severity`` ``info`` entries are not
        problems (e.g. Slurm's estimated start time). An empty list: nothing found."""
        sched = self._scheduler(scheduler or get_default_scheduler_name())
        try:
            resolved = sched.resolve_cfg(cfg)
        except ValueError as e:
            return [problem_from_error(e, "cfg")]
        problems: builtins.list[Problem] = []
        info: AppDryRunInfo[Any] | None = None
        try:
            if workspace:
                app = sched.preflight_workspace(app, workspace, resolved)
            info = sched.submit_dryrun(app, resolved)
        except ValueError as e:
            problems.append(problem_from_error(e))
        if info is None:  # the backend checks what it can from the app alone
            info = AppDryRunInfo(None, str)
            info.app, info.cfg, info.scheduler = app, resolved, sched.backend
        found: builtins.list[Problem] = sched.preflight(info)
        seen = {p.field for p in found} | {p.message for p in found}
        # (a dry run error the backend's checks found again is reported once)
        return [p for p in problems if p.field not in seen and p.message not in seen] + found


def _to_status(desc: Any) -> AppStatus | None:
    if desc is None:
        return None
    return fill_reasons(
        AppStatus(
            state=desc.state,
            num_restarts=max(desc.num_restarts, 0),
            msg="" if desc.msg == NONE else desc.msg,
            structured_error_msg=desc.structured_error_msg,
            ui_url=desc.ui_url,
            roles=list(desc.roles_statuses),
            reason=desc.reason,
            attempts=list(desc.attempts),
        )
    )


def get_runner(
    name: str | None = None,
    scheduler_factories: Mapping[str, SchedulerFactory] | None = None,
    **scheduler_params: Any,
) -> Runner:
    """A :class:`Runner` for session ``name`` (default ``$SHIPYARD_SESSION`` or ``shipyard``)."""
    name = name or os.environ.get("SHIPYARD_SESSION") or DEFAULT_SESSION
    return Runner(name, scheduler_factories, scheduler_params)
