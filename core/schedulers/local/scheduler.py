"""The local scheduler: runs each replica of each role as a process on this host (see the
package docs for which module does what)."""

from __future__ import annotations

import builtins
import copy
import json
import logging
import os
import re
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from core.limits import ATTEMPT_ENV, CHECKPOINT_DIR_ENV, limit_command, limits_from_cfg
from core.reports import RESULT_FILE_ENV, Problem, ReplicaResult
from core.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
)
from core.schedulers.local.appdir import (
    AppDir,
    KeyClaims,
    UnsafeStateError,
    apps_root,
    check_private,
    ensure_apps_root,
)
from core.schedulers.local.background import BACKGROUND, start_collector
from core.schedulers.local.checks import gpu_demand, host_gpu_count, preflight
from core.schedulers.local.collector import collect
from core.schedulers.local.images import ImageProvider, PopenRequest, ReplicaParam
from core.schedulers.local.liveness import Liveness
from core.schedulers.local.logs import LogIterator
from core.schedulers.local.options import LocalOpts, local_opts, requeues, run_opts
from core.schedulers.local.outcome import EndedApps, apply_usage, put_usage, read_results, response
from core.schedulers.local.processes import DEFAULT_GRACE, MARKER_ENV, Identity, terminate
from core.schedulers.local.records import AppRecord, FinalState, ReplicaRecord, RoleRecord
from core.schedulers.local.signals import HANDLERS
from core.schedulers.local.spawn import (
    Gate,
    ReplicaLaunch,
    check_command_size,
    environ_size,
    spawn,
)
from core.schedulers.local.supervise import (
    identities,
    observe,
    running_state,
    settle,
)
from core.specs import (
    AppDef,
    AppDryRunInfo,
    CfgVal,
    Role,
    is_terminal,
    macros,
    runopts,
)

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_GRACE", "RANK0_ENV", "LocalScheduler", "state_dir"]

#: the environment variable holding the host of replica 0 (value of the ``rank0_env`` macro)
RANK0_ENV = "SHIPYARD_RANK0_HOST"
HOSTNAME = "localhost"
_APP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SWEEP_EVERY = 3600.0  # seconds between looks for apps past their retention


#: records kept in memory at the least (a few KiB each): a watcher that polls more apps than
#: it keeps would read and parse every record again on every look
_RECORDS_KEPT = 10_000


def state_dir() -> str:
    """The directory holding the local apps' state directories."""
    return apps_root()


def _retention() -> float:
    try:
        return float(os.environ.get("SHIPYARD_LOCAL_RETENTION_DAYS", "7")) * 86400
    except ValueError:
        return 7 * 86400.0


class LocalScheduler(Scheduler[PopenRequest]):
    """Schedules apps as processes on this host.

    Args:
        session_name: the session apps are submitted under
        image_provider_class: makes the :class:`ImageProvider` from the cfg
        cache_size: how many finished apps launched by this instance are kept (in the state
            directory); beyond that the oldest finished ones are removed. Apps of other
            processes are left to them; any app finished longer than
            ``$SHIPYARD_LOCAL_RETENTION_DAYS`` (default 7) days ago is removed by any instance.
        extra_paths: directories prepended to the replicas' ``PATH``
        backend: the registered scheduler name (``local_cwd`` or ``local_dir``)
        grace: seconds between SIGTERM and SIGKILL when terminating replicas

    Created in the main thread, it installs SIGTERM/SIGINT handlers that terminate the apps
    this process launched (see :mod:`.signals`).
    """

    def __init__(
        self,
        session_name: str,
        image_provider_class: Callable[[LocalOpts], ImageProvider],
        cache_size: int = 100,
        extra_paths: list[str] | None = None,
        backend: str = "local_cwd",
        grace: float = DEFAULT_GRACE,
    ) -> None:
        super().__init__(backend, session_name)
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size <= 0:
            raise ValueError(f"cache_size: expected a positive integer, got {cache_size!r}")
        if extra_paths is not None and (
            not isinstance(extra_paths, list) or not all(isinstance(p, str) for p in extra_paths)
        ):
            raise ValueError(f"extra_paths: expected a list of directories, got {extra_paths!r}")
        self._image_provider_class = image_provider_class
        self._cache_size = cache_size
        self._extra_paths = list(extra_paths or [])
        self._grace = float(grace)
        # re-entrant: the signal handler runs in the main thread, maybe while it holds the lock
        self._lock = threading.RLock()
        self._records: OrderedDict[str, AppRecord] = OrderedDict()  # (records never change)
        self._ended = EndedApps(cache_size * 2)
        self._liveness = Liveness()  # (pidfds of the apps described more than once)
        self._launched: OrderedDict[str, AppDir] = OrderedDict()  # by this instance
        self._inflight: dict[str, list[Identity]] = {}  # submits in progress
        self._cancelling: dict[str, threading.RLock] = {}
        self._last_sweep = 0.0
        self._pid = os.getpid()
        self._closed = False
        self._null = -1
        self._found: dict[tuple[str, str, str], str] = {}  # see _which
        HANDLERS.register(self)

    # -- options ------------------------------------------------------------------------------

    def _run_opts(self) -> runopts:
        return run_opts()

    def notify_changes(
        self, app_id: str, callback: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Calls ``callback()`` as each replica of an app this process launched ends (its
        exit code and usage on record); None for an app launched elsewhere."""
        if not _APP_ID_RE.fullmatch(app_id):
            return None
        return BACKGROUND.on_exit(AppDir(apps_root(), app_id).path, callback)

    # -- dry run ------------------------------------------------------------------------------

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        local_opts(cfg)  # (raises for a bad log_dir)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[PopenRequest]:
        opts = local_opts(cfg)
        app_id = f"{app.name}-{os.urandom(5).hex()}"
        adir = AppDir(apps_root(), app_id)
        log_root = opts.get("log_dir")
        log_dir = (
            os.path.join(os.path.abspath(os.path.expanduser(log_root)), app_id)
            if log_root is not None
            else adir.logs_dir
        )
        provider = self._image_provider_class(opts)
        role_params: dict[str, list[ReplicaParam]] = {}
        base_size = environ_size(os.environb)
        limits, again = limits_from_cfg(cfg), requeues(cfg)
        g = 0
        for i, role in enumerate(app.roles):
            img_root = provider.fetch_role(role)
            params = role_params[role.name] = []
            for k in range(role.num_replicas):
                param = self._replica_param(provider, img_root, role, app, app_id, log_dir, k, opts)
                param.args[0] = self._resolve_entrypoint(
                    param.args[0], param.cwd or os.getcwd(), param.env.get("PATH", ""), i
                )
                param.env[MARKER_ENV] = f"{app_id}:{g}"
                param.env[RESULT_FILE_ENV] = adir.result_file(role.name, k)
                param.env.update({ATTEMPT_ENV: "0", CHECKPOINT_DIR_ENV: adir.checkpoint_dir})
                if again is not None:  # (the limit script keeps the limit, 0 retries)
                    record = adir.file(f"{AppDir.ATTEMPTS}.{g}")
                    param.args[:0] = limit_command(limits, int(DEFAULT_GRACE), 0, again, record)
                check_command_size(param.args, param.env, f"roles[{i}]", base_size)
                params.append(param)
                g += 1
        if opts.get("auto_set_cuda_visible_devices"):
            self._set_cuda_visible_devices(role_params, app)
        request = PopenRequest(
            app_id=app_id,
            log_dir=log_dir,
            role_params=role_params,
            role_log_dirs={name: [log_dir] * len(ps) for name, ps in role_params.items()},
            app_name=app.name,
            roles=list(app.roles),
            metadata=dict(app.metadata),
            backend=self.backend,
            session_name=self.session_name,
            result_replicas=opts.get("result_replicas", "first"),
            limits=limits,
            requeues=again,
        )
        return AppDryRunInfo(request, str)

    def _replica_param(
        self,
        provider: ImageProvider,
        img_root: str,
        role: Role,
        app: AppDef,
        app_id: str,
        log_dir: str,
        k: int,
        opts: LocalOpts,
    ) -> ReplicaParam:
        replica = _replica_role(role, macros.Values(img_root, app_id, str(k), RANK0_ENV))
        base = os.path.join(log_dir, f"{role.name}.{k}")
        param = provider.get_replica_param(
            img_root, replica, f"{base}.stdout.log", f"{base}.stderr.log", f"{base}.combined.log"
        )
        cwd = param.cwd or os.getcwd()
        prefix = [*([cwd] if opts.get("prepend_cwd") else []), *self._extra_paths]
        if prefix:
            path = param.env.get("PATH", os.environ.get("PATH", os.defpath))
            param.env["PATH"] = os.pathsep.join([*prefix, *([path] if path else [])])
        param.env.update(
            {
                "SHIPYARD_APP_ID": app_id,
                "SHIPYARD_APP_NAME": app.name,
                "SHIPYARD_ROLE_NAME": role.name,
                "SHIPYARD_REPLICA_ID": str(k),
                "SHIPYARD_NUM_REPLICAS": str(role.num_replicas),
                RANK0_ENV: HOSTNAME,
            }
        )
        return param

    # -- schedule -----------------------------------------------------------------------------

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        """Starts every replica and returns the app id (the processes run when it returns).

        With an idempotency key, the key is claimed first (an exclusive file): if another
        submission holds it, nothing starts and that submission's app id is returned.
        """
        request = dryrun_info.request
        app_id = request.app_id
        if not _APP_ID_RE.fullmatch(app_id):
            raise ValueError(f"app_id: expected letters, digits, '_', '.', '-', got {app_id!r}")
        root = ensure_apps_root()
        key = dryrun_info.idempotency_key
        if key:
            winner = KeyClaims(root).claim(key, app_id, str(Identity.me()))
            if winner is not None:
                log.info("idempotency key %s is held by %s: not submitting again", key, winner)
                return winner
        app = AppDir(root, app_id)
        try:
            self._start(app, request, key)
        except BaseException:
            if key:
                KeyClaims(root).release(key, app_id)
            raise
        return app_id

    def _start(self, app: AppDir, request: PopenRequest, key: str | None) -> None:
        try:
            app.create()
        except FileExistsError:
            raise ValueError(f"app_id: {app.app_id} was already submitted") from None
        except OSError as e:
            raise ValueError(f"state directory: cannot create {app.path}: {e.strerror or e}") from e
        launches = _launches(request)
        started: list[Identity] = []
        with self._lock:
            self._inflight[app.app_id] = started
        try:
            _check_dirs(request, app)
            record = self._spawn_all(app, request, launches, started, key)
        except BaseException:
            # a failure half-way (or a signal): nothing started may be left behind
            terminate(app.app_id, dict(enumerate(started)), grace=self._grace)
            app.remove()
            raise
        finally:
            with self._lock:
                self._inflight.pop(app.app_id, None)
        with self._lock:
            self._records[app.app_id] = record
            self._launched[app.app_id] = app
        BACKGROUND.submitted(app, [r.pid for r in record.replicas], self._grace, self._housekeeping)

    def _spawn_all(
        self,
        app: AppDir,
        request: PopenRequest,
        launches: list[tuple[str, int, ReplicaLaunch]],
        started: list[Identity],
        key: str | None,
    ) -> AppRecord:
        """Spawns every replica at the start gate, records the app, then opens the gate."""
        gate = Gate()
        devnull = self._devnull()
        replicas: list[ReplicaRecord] = []
        try:
            for role, k, launch in launches:
                ident, spawned = spawn(app.path, launch, gate, devnull)
                started.append(ident)
                comb = launch.stdout[: -len(".stdout.log")] + ".combined.log"
                replicas.append(ReplicaRecord(launch.index, role, k, ident.pid, ident.start_ticks,
                                              spawned, launch.stdout, launch.stderr, comb))  # fmt: skip
            record = AppRecord(
                app_id=app.app_id,
                name=request.app_name or app.app_id.rsplit("-", 1)[0],
                backend=request.backend,
                session=request.session_name,
                submit_time=time.time(),
                log_dir=request.log_dir,
                roles=[_role_record(r) for r in request.roles]
                or [RoleRecord(name, len(ps)) for name, ps in request.role_params.items()],
                replicas=replicas,
                key=key,
                host=HOSTNAME,
                results=request.result_replicas,
                time_limit=request.limits.time_limit,
                checkpoint_signal=request.limits.signal,
                checkpoint_grace=request.limits.grace,
                requeues=request.requeues,
            )
            try:
                if not app.write_record(record):
                    raise ValueError(f"app_id: {app.app_id} was already submitted")
            except OSError as e:
                raise ValueError(
                    f"state directory: cannot write {app.path}: {e.strerror or e}"
                ) from e
        except BaseException:
            for ident in started:  # still at the gate: none ran its command
                ident.signal_group(signal.SIGKILL)
            gate.close()
            raise
        gate.open(len(started))
        return record

    def _devnull(self) -> int:
        """/dev/null, opened once: the replicas' stdin (and the wrappers' own output)."""
        with self._lock:
            if self._null < 0:
                self._null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            return self._null

    # -- state --------------------------------------------------------------------------------

    def _load(self, app_id: str) -> tuple[AppDir, AppRecord] | None:
        """The app's directory and record (None if there is no such app).

        Raises:
            UnsafeStateError: the state directory or the app's is not this user's alone.
        """
        if not isinstance(app_id, str) or not _APP_ID_RE.fullmatch(app_id):
            return None
        root = apps_root()
        app = AppDir(root, app_id)
        try:
            check_private(root, "state directory")
            app.check_private()
        except FileNotFoundError:
            return None
        with self._lock:
            record = self._records.get(app_id)
        if record is None:
            record = app.read_record()
            if record is None:
                return None
            with self._lock:
                self._records[app_id] = record
                while len(self._records) > max(self._cache_size * 2, _RECORDS_KEPT):
                    self._records.popitem(last=False)
        return app, record

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's state and every replica's status; None if there is no such app."""
        found = self._load(app_id)
        return None if found is None else self._describe(*found)

    def _describe(self, app: AppDir, record: AppRecord) -> DescribeAppResponse | None:
        app_id = app.app_id
        known = self._ended.get(app_id)
        if known is not None:
            resp = response(app_id, record, known[0], app)
            apply_usage(resp, known[1], record)
            return resp
        obs = observe(app, record, self._liveness.checker(app_id, record))
        if obs is None:
            return None
        state = obs.done or self._settle(app, record, obs) or running_state(app, obs)
        names = obs.names
        if state.state != "RUNNING":  # (usage is recorded as this process reaps the wrappers)
            names = (BACKGROUND.wait_reaped(app.path, 1.0) and app.names()) or names
        resp = response(app_id, record, state, app)
        usages = put_usage(resp, app, names, record)
        if obs.done is not None:
            self._ended.put(app_id, obs.done, usages, len(record.replicas))
            self._liveness.forget(app_id)
        return resp

    def read_results(self, app_id: str) -> builtins.list[ReplicaResult]:
        """The replicas' results, from their files in the app's directory."""
        found = self._load(app_id)
        if found is None:
            raise ValueError(f"app_id: no local app {app_id!r} in {apps_root()}")
        return read_results(*found)

    def preflight(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> builtins.list[Problem]:
        """Entrypoints resolvable, working and log directories there and writable, and GPUs
        enough for ``auto_set_cuda_visible_devices``."""
        return preflight(
            dryrun_info, self._image_provider_class, self._extra_paths, self._get_gpu_device_count
        )

    def _settle(self, app: AppDir, record: AppRecord, obs: Any) -> FinalState | None:
        """What must happen as replicas end (gang termination, SIGKILL after the grace, the
        final state): :func:`supervise.settle`; for an app launched elsewhere whose collector
        may be gone (its submitter was killed), its logs are collected here too."""
        final = settle(app, record, obs, self._grace)
        if final is not None:
            with self._lock:
                launched_here = app.app_id in self._launched
            if not launched_here and AppDir.LOGS_DONE not in obs.names:
                collect(app.path, self._grace, follow=False)
        return final

    def app_ended(self, app_id: str) -> bool:
        """True if the app is terminal or gone (what a following log reader asks)."""
        desc = self.describe(app_id)
        return desc is None or is_terminal(desc.state)

    def exists(self, app_id: str) -> bool:
        """True if an app with this id is in the state directory."""
        if not isinstance(app_id, str) or not _APP_ID_RE.fullmatch(app_id):
            return False
        return AppDir(apps_root(), app_id).has_record()

    def list(self) -> list[ListAppResponse]:
        """The local apps of this backend in the state directory, newest first."""
        root = apps_root()
        try:
            names = [n for n in os.listdir(root) if _APP_ID_RE.fullmatch(n)]
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            loaded = self._load(name)
            if loaded is not None and loaded[1].backend == self.backend:
                found.append((loaded[1].submit_time, name, loaded))
        out = []
        for _, app_id, loaded in sorted(found, key=lambda f: f[:2], reverse=True):
            desc = self._describe(*loaded)  # (its record as read: the cache may hold fewer)
            if desc is not None:
                out.append(ListAppResponse(app_id=app_id, state=desc.state))
        return out

    def find_by_idempotency_key(
        self, key: str, cfg: Mapping[str, CfgVal] | None = None
    ) -> str | None:
        """The app submitted with ``key`` (by any process), or None."""
        return KeyClaims(apps_root()).holder(key)

    # -- logs ---------------------------------------------------------------------------------

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
        """Log lines of replica ``k`` of ``role_name`` (default stream: combined).

        ``since``/``until`` select lines by the time the collector saw them (to within a few
        tens of milliseconds). With ``should_tail`` the iterator follows the output until the
        app is terminal and every line was read. A partial last line is held back until its
        newline arrives or the replica ended (then it is returned without ``\\n``).

        Raises:
            ValueError: unknown app, role or replica, or an unsupported stream.
        """
        stream = check_stream(streams, list(Stream))
        found = self._load(app_id)
        if found is None:
            raise ValueError(f"app_id: no local app {app_id!r} in {apps_root()}")
        app, record = found
        rep = record.replica(role_name, k)
        if rep is None:
            roles = [r.name for r in record.roles]
            raise ValueError(
                f"role/replica: app {app_id} has no replica {k} of role {role_name!r} (roles: {roles})"
            )
        path = {
            Stream.STDOUT: rep.stdout,
            Stream.STDERR: rep.stderr,
            Stream.COMBINED: rep.combined,
        }[stream]
        return LogIterator(app_id, regex or "", path, self, should_tail=should_tail, since=since,
                           until=until, stream=stream, replica=rep.index, app_dir=app.path)  # fmt: skip

    def _resolve_entrypoint(self, entrypoint: str, cwd: str, path: str, i: int) -> str:
        """An absolute path for a command found on PATH (so the wrapper never runs a shell
        builtin of the same name); checks that the entrypoint exists."""
        if os.sep in entrypoint:
            full = entrypoint if os.path.isabs(entrypoint) else os.path.join(cwd, entrypoint)
            if not os.path.isfile(full):
                raise ValueError(f"roles[{i}].entrypoint: {entrypoint!r} does not exist")
            if not os.access(full, os.X_OK):
                raise ValueError(f"roles[{i}].entrypoint: {entrypoint!r} is not executable")
            return entrypoint
        found = self._which(entrypoint, path or os.environ.get("PATH", os.defpath), cwd)
        if found is None:
            raise ValueError(f"roles[{i}].entrypoint: {entrypoint!r} was not found on PATH")
        return found

    def _which(self, command: str, path: str, cwd: str) -> str | None:
        """``shutil.which(command, path=path)`` as an absolute path (None if not found), each
        search remembered per (command, PATH, cwd) and checked again with one ``access(2)``.

        Kept for the bench row ``local: submit 1 replica(s) (sleep)`` (target <= 1.5x raw
        Popen): a search on every submit (~25 us) helped push it over the target (1.52-1.57x
        with both this and :func:`_replica_role` in their plain form, 1.31x with them).
        """
        key = (command, path, cwd)
        known = self._found.get(key)
        if known is not None and os.access(known, os.X_OK):
            return known
        import shutil  # (lazily, as everywhere on the scheduler's import path: start-up)

        found = shutil.which(command, path=path)
        if found is None:
            return None
        if len(self._found) >= 256:
            self._found.clear()
        self._found[key] = found = os.path.abspath(found)
        return found

    def _get_gpu_device_count(self) -> int:
        """Number of GPUs on this host (``nvidia-smi -L``), 0 if none can be found."""
        return host_gpu_count()

    def _set_cuda_visible_devices(
        self, role_params: dict[str, builtins.list[ReplicaParam]], app: AppDef
    ) -> None:
        """Each replica of a role asking for N GPUs (``resource.gpu`` > 0) gets N devices of its
        own (TorchX's rule: one when N is 1), if the host has enough for all of them."""
        needed, asks = gpu_demand(app.roles)
        if not needed:
            return
        count = self._get_gpu_device_count()
        if count < needed:
            log.warning(
                "auto_set_cuda_visible_devices: the replicas ask for %d GPUs (%s) but this host"
                " has %d; CUDA_VISIBLE_DEVICES is not set, so every replica sees all of them",
                needed,
                asks,
                count,
            )
            return
        device = 0
        for role in (r for r in app.roles if r.resource.gpu > 0):
            for param in role_params[role.name]:
                devices = range(device, device + role.resource.gpu)
                param.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
                device += role.resource.gpu

    def start_collector(self, app_dir: str) -> None:
        """Starts a log collector for an app whose collector is gone."""
        proc = start_collector(app_dir, self._grace)
        if proc is not None:
            BACKGROUND.collectors[app_dir] = proc

    # -- cancel -------------------------------------------------------------------------------

    def _cancel_existing(self, app_id: str) -> None:
        found = self._load(app_id)
        if found is None:
            return
        app, record = found
        with self._lock:
            lock = self._cancelling.setdefault(app_id, threading.RLock())
        with lock:
            desc = self.describe(app_id)
            if desc is None or is_terminal(desc.state):
                return
            app.mark(AppDir.CANCELLED, json.dumps(time.time()))  # (before the signals)
            app.wake_collector()  # (it keeps the grace if this process dies meanwhile)
            obs = observe(app, record)
            if obs is not None and obs.running:
                running = {g: identities(record)[g] for g in obs.running}
                # a live collector looks for what left the groups when the wrappers end
                killed = terminate(app_id, running, self._grace, scan=not app.collector_alive())
                for g, sig in killed.items():
                    app.record_exit(g, -sig)
            self.describe(app_id)
        with self._lock:
            self._cancelling.pop(app_id, None)

    def terminate_launched(self) -> None:
        """Terminates every app this instance launched that still runs, and waits for their log
        collectors (the SIGTERM/SIGINT handler calls this)."""
        if os.getpid() != self._pid:
            return  # a forked child: the apps belong to the parent
        with self._lock:
            launched = list(self._launched.items())
            inflight = {a: list(s) for a, s in self._inflight.items()}
        for app_id, started in inflight.items():
            terminate(app_id, dict(enumerate(started)), grace=self._grace)
        for app_id, app in launched:
            try:
                self.cancel(app_id)
                self._finish_collector(app)
            except Exception:
                log.warning("could not terminate %s", app_id, exc_info=True)

    def _finish_collector(self, app: AppDir, timeout: float = 2.0) -> None:
        BACKGROUND.flush(timeout)
        proc = BACKGROUND.collectors.get(app.path)
        if proc is None:
            collect(app.path, follow=False)
            return
        try:
            proc.wait(timeout)
        except Exception:
            log.warning("the log collector of %s did not finish in %ss", app.path, timeout)

    # -- housekeeping -------------------------------------------------------------------------

    def _housekeeping(self) -> bool:
        """Removes the oldest finished apps this instance launched beyond ``cache_size`` (and,
        hourly, any app finished longer than the retention period ago); True if some must wait."""
        if self._closed:
            return False
        try:
            now = time.time()
            if now - self._last_sweep >= _SWEEP_EVERY:
                self._last_sweep = now
                _sweep(now - _retention())
            return self._evict()
        except Exception:
            log.debug("local scheduler housekeeping failed", exc_info=True)
            return False

    def _evict(self) -> bool:
        with self._lock:
            own = list(self._launched.items())
        if len(own) <= self._cache_size:
            return False
        finished = [
            (t, a) for a in (app for _, app in own) if (t := a.mtime(AppDir.DONE)) is not None
        ]
        waiting = False
        for _, app in sorted(finished)[: max(0, len(finished) - self._cache_size)]:
            if not app.remove_ended():
                waiting = True  # its collector is still writing
                continue
            with self._lock:
                self._launched.pop(app.app_id, None)
                self._records.pop(app.app_id, None)
            self._ended.forget(app.app_id)
        return waiting

    def close(self) -> None:
        """Releases what this instance holds (caches, signal handlers). Apps keep running."""
        if self._closed:
            return
        self._closed = True
        HANDLERS.unregister(self)
        self._liveness.close()
        with self._lock:
            self._records.clear()
            self._ended.clear()
            self._launched.clear()
            if self._null >= 0:
                os.close(self._null)
                self._null = -1


# -----------------------------------------------------------------------------------------------
# helpers
# -----------------------------------------------------------------------------------------------


def _encode(env: Mapping[str, str]) -> dict[bytes, bytes]:
    return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


def _launches(request: PopenRequest) -> list[tuple[str, int, ReplicaLaunch]]:
    """Every replica's launch (role, replica id, what to start), in index order."""
    base = dict(os.environb)
    here = os.getcwd()
    out: list[tuple[str, int, ReplicaLaunch]] = []
    for role, params in request.role_params.items():
        for k, p in enumerate(params):
            base_log = os.path.join(request.role_log_dirs[role][k], f"{role}.{k}")
            cwd = p.cwd if p.cwd and p.cwd != here else ""
            launch = ReplicaLaunch(
                index=len(out),
                args=list(p.args),
                env={**base, **_encode(p.env)},
                stdout=p.stdout or f"{base_log}.stdout.log",
                stderr=p.stderr or f"{base_log}.stderr.log",
                cwd=cwd,
            )
            out.append((role, k, launch))
    return out


def _check_dirs(request: PopenRequest, app: AppDir) -> None:
    """Every working directory exists and every log directory is writable, before anything
    starts (errors name the field)."""
    checked = {app.logs_dir}
    for i, (role, params) in enumerate(request.role_params.items()):
        for p in params:
            if p.cwd and not os.path.isdir(p.cwd):
                raise ValueError(f"roles[{i}]: working directory {p.cwd!r} does not exist")
        for d in request.role_log_dirs[role]:
            if d not in checked:
                _check_log_dir(d)
                checked.add(d)


def _check_log_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".shipyard-probe-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"x")
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"cfg.log_dir: cannot write log files in {path}: {e.strerror or e}") from e


def _replica_role(role: Role, values: macros.Values) -> Role:
    """``values.apply(role)``, without its deep copy of the role when no arg or env value holds
    a macro (most roles): a shallow copy with its own args and env.

    Kept for the bench row ``local: submit 1 replica(s) (sleep)`` (target <= 1.5x raw Popen):
    a deep copy per replica (~22 us) helped push it over the target (1.52-1.57x with both this
    and :meth:`LocalScheduler._which` in their plain form, 1.31x with them).
    """
    if any("$" in a for a in role.args) or any("$" in v for v in role.env.values()):
        return values.apply(role)
    replica = copy.copy(role)
    replica.args = list(role.args)
    replica.env = dict(role.env)
    return replica


def _role_record(role: Role) -> RoleRecord:
    res = role.resource
    return RoleRecord(role.name, role.num_replicas, role.image, role.entrypoint, list(role.args),
                      dict(role.env), (res.cpu, res.gpu, res.memMB))  # fmt: skip


def _sweep(cutoff: float) -> None:
    """Removes the apps of any process that finished before ``cutoff``."""
    root = apps_root()
    try:
        names = [n for n in os.listdir(root) if _APP_ID_RE.fullmatch(n)]
    except FileNotFoundError:
        return
    for name in names:
        app = AppDir(root, name)
        ended = app.mtime(AppDir.DONE) or app.mtime(AppDir.LOGS_DONE)
        if ended is not None and ended < cutoff:
            try:
                app.check_private()
            except (UnsafeStateError, OSError):
                continue
            app.remove_ended()
