"""ShipyardOperator: submit a Shipyard app from a DAG, follow its logs, fail with its errors.

Retries re-attach instead of submitting twice. Two mechanisms work together:

* Airflow's :class:`~airflow.sdk.ResumableJobMixin` stores the app handle in the task instance's
  ``task_state_store`` right after submission; a later try of the same task instance reads it
  back: a job still running is followed again, a job that succeeded gives its result without
  running anything, a job that failed or was cancelled is submitted afresh (that is what a retry
  is for).
* Every job is tagged with the deterministic idempotency key
  ``airflow:{dag_id}:{run_id}:{task_id}:{map_index}`` (``...:{n}`` for a fresh submission in
  try ``n`` after a failed job): :meth:`core.runner.Runner.attach_or_submit`, the key scheme the
  Prefect tasks and worker use too. Before submitting, the keys of the earlier tries are looked
  up in the backend, so a worker that died between submitting and storing the handle (or a
  deployment without a task state store) still re-attaches rather than starting a second job.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator, ResumableJobMixin, conf
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    AirflowTaskTerminated,
    TaskDeferralError,
)

from airflow_provider._common import (
    ACTIVE_STATES,
    APP_FILE_EXTS,
    idempotency_key,
    make_runner,
    to_app_def,
)
from airflow_provider.arrays import (
    ArrayArgs,
    CountsLog,
    finish_array,
    submit_array,
)
from airflow_provider.config import retry_budget
from airflow_provider.config import ui_url_template as configured_ui_url
from airflow_provider.hooks.shipyard import ShipyardHook
from airflow_provider.links import ShipyardJobLink, check_ui_url_template, job_url
from airflow_provider.outcome import XComs, failed_exit_code, result_value, skip_exit_codes
from airflow_provider.triggers import ShipyardJobTrigger
from core.arrays import check_allow_failures
from core.errors import JobSilentError, ShipyardError
from core.reports import AppResult, usage_by_replica, usage_summary
from core.runner import AppFailedError, Runner, attempt_key
from core.schedulers import get_default_scheduler_name
from core.specs import AppDef, AppHandle, AppStatus, Reason, parse_app_handle
from core.watch import (
    AttemptsLog,
    JobWatch,
    LogCursor,
    MemoryCursorStore,
    WatchEnd,
    check_max_silence,
    effective_max_silence,
)

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

    from core.schedulers.docker_scheduler import DockerEngine

__all__ = [
    "HANDLE_XCOM_KEY",
    "ShipyardJobFailedError",
    "ShipyardJobFailedNoRetryError",
    "ShipyardOperator",
]

#: the XCom holding the job's app handle (also the key of the task state store that keeps it)
HANDLE_XCOM_KEY = "shipyard_app_handle"
#: states of a task instance whose next try is coming or running (``None``: reset, not yet
#: scheduled again)
_NEXT_TRY_STATES = frozenset({None, "scheduled", "queued", "running", "deferred"})


def _superseded_error(handle: AppHandle) -> AirflowTaskTerminated:
    """Ends a try that a new try of its task instance replaces, leaving the job and the
    task's XComs to that try."""
    return AirflowTaskTerminated(
        f"this try was replaced by a new try of the task instance, which follows {handle}"
    )


class ShipyardJobFailedError(ShipyardError, AirflowException):
    """The job did not succeed: the message has its state, exit codes and last log lines."""

    def __init__(self, error: AppFailedError) -> None:
        super().__init__(str(error))
        self.app_handle = error.handle
        self.state = error.state
        self.exit_codes = error.exit_codes


class ShipyardJobFailedNoRetryError(ShipyardError, AirflowFailException):
    """The job did not succeed for a reason of the operator's ``fail_fast_on``: the task fails
    without Airflow's retries (the message is :class:`ShipyardJobFailedError`'s)."""

    def __init__(self, error: AppFailedError) -> None:
        super().__init__(f"{error} [reason {error.reason} is in fail_fast_on: no retry]")
        self.app_handle = error.handle
        self.state = error.state
        self.reason = error.reason


def _reasons(value: Any) -> tuple[str, ...]:
    """``fail_fast_on`` as reason names, else an error naming it."""
    items = (value,) if isinstance(value, str) else tuple(value or ())
    known = {str(r) for r in Reason}
    bad = [r for r in items if r not in known]
    if bad:
        raise ValueError(f"fail_fast_on: expected reasons among {sorted(known)}, got {bad!r}")
    return tuple(str(r) for r in items)


class ShipyardJobSilentError(ShipyardError, AirflowException):
    """The job was cancelled: replicas printed no line for ``max_silence`` seconds (the message
    names them, with their last lines)."""


class ShipyardJobSilentNoRetryError(ShipyardJobSilentError, AirflowFailException):
    """A silent job, ``silent`` being in the operator's ``fail_fast_on``: no Airflow retry."""


class ShipyardOperator(ResumableJobMixin, BaseOperator):
    """Submits a Shipyard app and (by default) waits for it, streaming its logs into the task log.

    Args:
        app: an :class:`~core.specs.AppDef`, a dict in the app-file format, or the path of a YAML
            app file (relative to the DAG folder or ``template_searchpath``, or absolute); the
            file is Jinja-templated like any Airflow template file, and so are the strings of a
            dict or of an ``AppDef``'s roles (entrypoint, args, env, image)
        scheduler: the scheduler to run on (default: the default scheduler, ``local_cwd``)
        cfg: the scheduler's run options (templated)
        workspace: a workspace to build into the image (templated)
        env: environment variables added to every role (templated)
        wait_for_completion: wait for the app to end; ``False`` only submits
        poll_interval: seconds between status checks while waiting
        deferrable: wait in :class:`~airflow_provider.triggers.ShipyardJobTrigger` in the
            triggerer instead of on the worker (default: ``[operators] default_deferrable``)
        session_name: the Shipyard session the app is submitted under
        shipyard_conn_id: an Airflow connection (type ``shipyard``, or ``ssh`` for a Slurm
            login node) giving the scheduler, default run options and the Slurm cluster to
            reach (templated); ``scheduler`` and ``cfg`` given here win over it
        durable: re-attach to the job on retries (see the module docs)
        ui_url: a URL template of the job's page in a dashboard (templated; default: the
            connection's extra ``ui_url``, then ``$SHIPYARD_UI_URL``), shown as the task's
            "Shipyard job" link; see :mod:`airflow_provider.links`
        preflight: first check, without starting anything, every problem a submit would hit
            (:meth:`core.runner.Runner.preflight`); any fails the task at once, without
            retries, listing them all
        max_silence: seconds a running replica may go without printing a line; past that the
            job is cancelled and the task fails (:class:`ShipyardJobSilentError`, naming the
            silent replicas and their last lines): the hung-collective case. None: the app's
            own (its ``metadata.max_silence``), else no limit
        array_size: run the app as an array of that many elements (``Runner.run_array``)
        array_params: ... or one element per mapping of this list (templated: e.g. an
            upstream task's XCom; a string is read as JSON)
        max_parallel: an array's elements running at once (default: all)
        allow_failures: how many of an array's elements may fail with the task succeeding.
            A retry of the task runs the array's failed elements again (same handle)
        after: app or array handles this task's job waits for (templated, e.g. upstream
            tasks' return values); ``after_condition``: ``ok`` (default), ``any``, ``notok``
        fail_fast_on: reasons (``oom``, ``timeout``, ... see :class:`core.specs.Reason`) for
            which a failed job fails the task without Airflow's retries (``AirflowFailException``):
            a job that cannot fit will not fit on the next try either
        return_result: return the job's result (see ``result`` below) instead of its handle,
            so it is the task's ``return_value`` XCom (``XComArg``, ``.output``); the handle
            stays in the XCom ``shipyard_app_handle``. Needs ``wait_for_completion``
        skip_on_exit_code: an exit code, or several, for which a failed job skips the task
            (``AirflowSkipException``) instead of failing it: the exit code of the app's failing
            replica, as DockerOperator and KubernetesPodOperator take their container's. Not
            for arrays (their elements' outcomes are ``allow_failures``')

    Returns the app handle (pushed as the ``return_value`` XCom; with ``return_result``, the
    result) and pushes the XComs ``shipyard_app_handle`` (the handle), ``app_id`` and ``state``
    (the app state's name). Once the job ended, also ``reason`` (why it ended: ``exit_code``,
    ``oom``, ``timeout``, ``cancelled``, ... see :class:`core.specs.Reason`), ``result`` (what
    replicas wrote to ``$SHIPYARD_RESULT_FILE``: ``{role: {replica id: value}}``; an invalid one
    is a warning in the log; with ``return_result`` it is the ``return_value`` instead) and
    ``usage`` (``{"role/k": {wall_time, cpu_time, peak_memory, ...}}``, also summed up in the
    log). An array pushes ``array_states`` (each element's state) and ``result`` as a list, one
    entry per element, and logs its counts as they change and the last lines of each failed
    element. With ``do_xcom_push=False`` none of these XComs is pushed (only the extra link's
    URL, which is how Airflow stores a link). The task fails with the job's state, exit codes
    and last log lines when the job does not succeed. Killing the task (marked failed,
    ``execution_timeout``, ...) cancels the job, unless Airflow killed the try because a new try
    replaces it (a restarted scheduler reset the task): that try re-attaches to the job.
    """

    template_fields: Sequence[str] = (
        "app",
        "scheduler",
        "cfg",
        "workspace",
        "env",
        "session_name",
        "shipyard_conn_id",
        "ui_url",
        "array_params",
        "after",
    )
    template_ext: Sequence[str] = APP_FILE_EXTS
    template_fields_renderers = {"app": "yaml", "cfg": "json", "env": "json"}
    ui_color = "#cfe3f7"
    operator_extra_links = (ShipyardJobLink(),)
    external_id_key = HANDLE_XCOM_KEY

    def __init__(
        self,
        *,
        app: AppDef | Mapping[str, Any] | str,
        scheduler: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        workspace: str | None = None,
        env: Mapping[str, str] | None = None,
        wait_for_completion: bool = True,
        poll_interval: float = 5.0,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        session_name: str | None = None,
        shipyard_conn_id: str | None = None,
        ui_url: str | None = None,
        preflight: bool = False,
        max_silence: float | None = None,
        array_size: int | None = None,
        array_params: Any = None,
        max_parallel: int | None = None,
        allow_failures: int = 0,
        after: Any = None,
        after_condition: str = "ok",
        fail_fast_on: Sequence[str] = (),
        return_result: bool = False,
        skip_on_exit_code: int | Container[int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fail_fast_on = _reasons(fail_fast_on)
        self.skip_on_exit_code = skip_exit_codes(skip_on_exit_code)
        if return_result and not wait_for_completion:
            raise ValueError(
                "return_result: the result exists once the job ended; it needs"
                " wait_for_completion=True"
            )
        self.return_result = bool(return_result)
        self.max_silence = check_max_silence(max_silence)
        self.array_size, self.array_params, self.max_parallel = (
            array_size,
            array_params,
            max_parallel,
        )
        self.allow_failures = check_allow_failures(allow_failures)
        self.after, self.after_condition = after, after_condition
        if not isinstance(app, AppDef | Mapping | str | os.PathLike):
            raise ValueError(
                "app: expected an AppDef, a dict or the path of a YAML app file,"
                f" got {type(app).__name__}"
            )
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float):
            raise ValueError(f"poll_interval: expected a positive number, got {poll_interval!r}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: expected a positive number, got {poll_interval!r}")
        self.app = os.fspath(app) if isinstance(app, os.PathLike) else app
        self.scheduler = scheduler
        self.cfg = dict(cfg) if cfg else {}
        self.workspace = workspace
        self.env = dict(env) if env else {}
        self.wait_for_completion = wait_for_completion
        self.poll_interval = float(poll_interval)
        self.deferrable = deferrable
        self.session_name = session_name
        self.shipyard_conn_id = shipyard_conn_id
        self.ui_url = ui_url
        self.preflight = preflight
        self._conn_settings: tuple[str | None, dict[str, Any]] | None = None
        self._handle: AppHandle | None = None
        self._submit_key: str | None = None
        self._finished: tuple[AppHandle, Any] | None = None  # (handle, the task's return value)
        self._this_try: Context | None = None  # (to tell in on_kill whether a new try took over)
        self._engine: DockerEngine | None = None

    # -- templating --------------------------------------------------------------------------

    def get_template_env(self, dag: Any = None) -> jinja2.Environment:
        """The DAG's Jinja environment; also finds an app file given by absolute path."""
        import jinja2

        env = super().get_template_env(dag)
        loader = env.loader
        if (
            isinstance(self.app, str)
            and os.path.isabs(self.app)
            and self.app.endswith(APP_FILE_EXTS)
            and isinstance(loader, jinja2.FileSystemLoader)
            and "/" not in loader.searchpath
        ):
            loader.searchpath = [*loader.searchpath, "/"]
        return env

    def render_template(
        self,
        content: Any,
        context: Context,
        jinja_env: jinja2.Environment | None = None,
        seen_oids: set[int] | None = None,
    ) -> Any:
        # Only a top-level string ending in .yaml/.yml is an app file. Strings inside an app, a cfg
        # or an env are rendered as text even when they end in .yaml (e.g. an arg "conf.yaml").
        if isinstance(content, AppDef | Mapping | list):
            return self._render_plain(content, context, jinja_env or self.get_template_env())
        return super().render_template(content, context, jinja_env, seen_oids)

    def _render_plain(self, value: Any, context: Context, env: jinja2.Environment) -> Any:
        if isinstance(value, str):
            return self._render(env.from_string(value), context) if "{" in value else value
        if isinstance(value, AppDef):
            roles = []
            for role in value.roles:
                role = copy.deepcopy(role)
                role.entrypoint = self._render_plain(role.entrypoint, context, env)
                role.image = self._render_plain(role.image, context, env)
                role.args = self._render_plain(list(role.args), context, env)
                role.env = self._render_plain(dict(role.env), context, env)
                roles.append(role)
            return AppDef(name=value.name, roles=roles, metadata=dict(value.metadata))
        if isinstance(value, Mapping):
            return {k: self._render_plain(v, context, env) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._render_plain(v, context, env) for v in value)
        return value

    # -- execution ---------------------------------------------------------------------------

    def _connection(self) -> tuple[str | None, dict[str, Any]]:
        """The connection's scheduler and default cfg (its cluster registered in this
        process); nothing without ``shipyard_conn_id``."""
        if not self.shipyard_conn_id:
            return None, {}
        if self._conn_settings is None:
            hook = ShipyardHook(self.shipyard_conn_id)
            scheduler, cfg, _ = hook.settings()
            self._engine = hook.docker_engine()
            self._conn_settings = (scheduler, cfg)
        return self._conn_settings

    @property
    def _scheduler_name(self) -> str:
        return self.scheduler or self._connection()[0] or get_default_scheduler_name()

    def _cfg(self) -> dict[str, Any]:
        """The run options: the connection's, then the task's."""
        return {**self._connection()[1], **self.cfg}

    def _runner(self) -> Runner:
        """A runner for the task's session that reaches the connection's backend."""
        self._connection()
        return make_runner(self.session_name, self._engine)

    def _app_def(self) -> AppDef:
        return to_app_def(self.app, self.env)

    def _max_silence(self) -> float | None:
        """The task's ``max_silence``, else its app's own (``metadata.max_silence``)."""
        return effective_max_silence(self.max_silence, self._app_def())

    def execute(self, context: Context) -> Any:
        app = self._app_def()  # bad input fails here, before anything starts
        self._ui_url_template()
        self._max_silence()
        retry_budget()  # (a bad [shipyard] retry_budget, too)
        self.log.info(
            "app %s (%d roles) on %s",
            app.name,
            len(app.roles),
            self._scheduler_name,
        )
        if self.preflight:
            self._check(app)
        if not self.wait_for_completion:
            handle = self.submit_job(context)
            with self._runner() as runner:
                status = runner.status(handle)
            self._push(context, handle, status)
            return handle
        return self.execute_resumable(context)

    def _check(self, app: AppDef) -> None:
        """Fails the task, without retries, if a pre-flight check finds a problem."""
        with self._runner() as runner:
            found = runner.preflight(app, self._scheduler_name, self._cfg(), self.workspace)
        for p in found:
            if not p.is_error:
                self.log.info("pre-flight: %s", p)
        errors = [str(p) for p in found if p.is_error]
        if errors:
            raise AirflowFailException(
                f"pre-flight found {len(errors)} problem(s) on {self._scheduler_name}:\n"
                + "\n".join(f"- {e}" for e in errors)
            )
        self.log.info("pre-flight on %s: no problems", self._scheduler_name)

    def _base_key(self, context: Context) -> str:
        ti = context["ti"]
        return idempotency_key(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)

    @staticmethod
    def _try_number(context: Context) -> int:
        return max(int(context["ti"].try_number or 1), 1)

    def submit_job(self, context: Context) -> AppHandle:
        """Submits the app, or re-attaches to the job an earlier try of this task started
        (:meth:`core.runner.Runner.attach_or_submit`, the try number being the attempt)."""
        app = self._app_def()
        base, try_number = self._base_key(context), self._try_number(context)
        self._submit_key = attempt_key(base, try_number)  # (on_kill finds a job in flight by it)
        array = ArrayArgs(self.array_size, self.array_params, self.max_parallel)
        if array.wanted or self.after:
            return self._submit_driven(context, app, array, base, try_number)
        with self._runner() as runner:
            sub = runner.attach_or_submit(
                app,
                self._scheduler_name,
                self._cfg(),
                key=base,
                attempt=try_number,
                workspace=self.workspace,
            )
        self._handle = sub.handle
        if sub.attached:
            self.log.info("re-attaching to %s (%s, key %s)", sub.handle, sub.state, sub.key)
        else:
            self.log.info("submitted %s (key %s)", sub.handle, sub.key)
        self._push_handle(context, sub.handle)
        return sub.handle

    def _xcoms(self, context: Context) -> XComs:
        """The task's XComs, pushed only with ``do_xcom_push`` (as Airflow's return value)."""
        return XComs(context["ti"].xcom_push, self.do_xcom_push)

    def _push_handle(self, context: Context, handle: AppHandle) -> None:
        """The job's handle and app id, pushed as soon as it exists (a failed task has them)."""
        push = self._xcoms(context)
        push(HANDLE_XCOM_KEY, handle)
        push("app_id", parse_app_handle(handle).app_id)

    def _submit_driven(
        self, context: Context, app: AppDef, array: ArrayArgs, base: str, try_number: int
    ) -> AppHandle:
        """Submits an array, or an app that waits for others (``after``)."""
        after = [self.after] if isinstance(self.after, str) else self.after
        with self._runner() as runner:
            if array.wanted:
                handle = submit_array(
                    runner, app, self._scheduler_name, self._cfg(), array, base, try_number,
                    after, self.log,
                )  # fmt: skip
            else:
                handle = runner.run(
                    app, self._scheduler_name, self._cfg(), self.workspace,
                    idempotency_key=self._submit_key, after=after,
                    after_condition=self.after_condition,
                )  # fmt: skip
        self._handle = handle
        self.log.info("submitted %s (key %s)", handle, base)
        self._push_handle(context, handle)
        return handle

    def get_job_status(self, external_id: Any, context: Context) -> str:
        with self._runner() as runner:
            status = runner.status(str(external_id))
        return status.state.name if status else "UNKNOWN"

    def is_job_active(self, status: str) -> bool:
        return status in ACTIVE_STATES

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Context) -> Any:
        """Waits for the app (here, streaming its logs, or deferred to the trigger)."""
        handle = str(external_id)
        self._handle = handle
        # (the handle is in the task state store now: ResumableJobMixin stored or read it)
        self._this_try = context if self.durable else None
        with self._runner() as runner:
            if self.deferrable:
                status = runner.status(handle)
                if status is None or not status.is_terminal():
                    self._defer(handle, status)
            value = self._finish(runner, context, self._watch(runner, handle, context))
        self._finished = (handle, value)
        return value

    def _defer(self, handle: AppHandle, status: AppStatus | None) -> None:
        self.log.info(
            "%s is %s: deferring to ShipyardJobTrigger",
            handle,
            status.state.name if status else "UNKNOWN",
        )
        self.defer(
            trigger=ShipyardJobTrigger(
                app_handle=handle,
                poll_interval=self.poll_interval,
                target_states=["SUCCEEDED"],
                stream_logs=True,
                shipyard_conn_id=self.shipyard_conn_id,
                max_silence=self._max_silence(),
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout,
        )

    def get_job_result(self, external_id: Any, context: Context) -> Any:
        handle = str(external_id)
        if self._finished is not None and self._finished[0] == handle:
            return self._finished[1]
        # an earlier try's job that already succeeded: show its logs and take its result
        self._handle = handle
        with self._runner() as runner:
            return self._finish(runner, context, self._watch(runner, handle, context))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resumes after :class:`ShipyardJobTrigger` fired: logs the lines the trigger did not
        (all of them if it could not stream), checks the result, pushes XComs."""
        handle = event.get("app_handle") or self._handle
        if not handle:
            raise AirflowException(f"trigger event without app handle: {event}")
        self._handle = handle
        if event.get("status") == "error":
            raise AirflowException(event.get("message") or f"waiting for {handle} failed")
        if event.get("silent"):
            self._silent(context, str(event.get("message")))
        with self._runner() as runner:
            end = self._watch(
                runner, handle, context, _event_cursor(event), event.get("usage") or {}
            )
            return self._finish(runner, context, end)

    def resume_execution(
        self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context
    ) -> Any:
        from airflow.sdk.exceptions import TaskDeferralTimeout

        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except (TaskDeferralError, TaskDeferralTimeout):
            # the trigger timed out (execution_timeout) or failed: the job must not outlive the task
            self._handle = self._handle or self._stored_handle(context)
            self.on_kill()
            raise

    def _stored_handle(self, context: Context) -> AppHandle | None:
        store = context.get("task_state_store")
        stored = store.get(self.external_id_key) if store is not None else None
        if stored:
            return str(stored)
        base, try_number = self._base_key(context), self._try_number(context)
        with self._runner() as runner:
            latest = runner.find_latest(self._scheduler_name, base, try_number, self._cfg())
        return latest[0] if latest is not None else None

    def on_kill(self) -> None:
        """Cancels the job (the task was killed, marked failed or timed out), unless Airflow
        killed this try because a new try of the task instance replaces it."""
        handle = self._handle
        if handle is not None and self._superseded():
            # A scheduler that starts resets the running tasks a dead scheduler had queued and
            # its LocalExecutor cannot adopt (a scheduler restarted under them), and the worker
            # still running this try is told to kill it. The job is fine: the next try
            # re-attaches to it. Cancelling it here made that try follow a job being
            # cancelled, and fail.
            self.log.info(
                "leaving %s running: Airflow runs this task again in a new try (it reset the"
                " task instance), which re-attaches to the job",
                handle,
            )
            # Airflow's handler returns to the task after on_kill: this try must stop here, or
            # it goes on following the job and pushes its XComs beside the new try's
            raise _superseded_error(handle)
        # A fresh runner: on_kill runs in a signal handler, maybe while the main thread holds a
        # lock of the runner it was using.
        with self._runner() as runner:
            if handle is None and self._submit_key:
                # killed while submitting: the job may exist without its handle being known yet
                handle = runner.find(self._scheduler_name, self._submit_key, self._cfg())
            if handle is None:
                return
            self.log.info("cancelling %s", handle)
            runner.cancel(handle)

    def _superseded(self) -> bool:
        """Whether Airflow took the task instance away from this try to run it in a new one.

        Airflow gives each try of a task instance an id of its own, and this try reaches the
        task state store through its id: once a new try replaces it, the handle kept there is
        not found any more, and the task instance waits for, or runs, its next try. A task
        cleared by a user also gets a new id, but stays ``restarting`` until this try ended:
        that user asked for the job to run again, and its job is cancelled. Any doubt (no
        store, an error) reads as not superseded: the job is cancelled, as before."""
        context = self._this_try
        if context is None:
            return False
        store, ti = context.get("task_state_store"), context["ti"]
        try:
            if store is None or store.get(self.external_id_key) is not None:
                return False  # (still this try's task instance)
            states = ti.get_task_states(
                dag_id=ti.dag_id, map_index=ti.map_index, task_ids=[ti.task_id], run_ids=[ti.run_id]
            )
        except Exception as e:
            self.log.warning("cannot tell whether a new try replaces this one: %s", e)
            return False
        key = (
            ti.task_id
            if ti.map_index is None or ti.map_index < 0
            else f"{ti.task_id}_{ti.map_index}"
        )
        run_states = states.get(ti.run_id) or {}
        return key in run_states and run_states[key] in _NEXT_TRY_STATES

    # -- helpers -----------------------------------------------------------------------------

    def _watch(
        self,
        runner: Runner,
        handle: AppHandle,
        context: Context,
        cursor: LogCursor | None = None,
        usage: Mapping[str, Any] | None = None,
    ) -> WatchEnd:
        """Follows the app to its end (:class:`core.watch.JobWatch`), logging its lines
        (``role/k line``) after ``cursor`` (those the task log has already), each once, as they
        are produced; then its usage (completed from ``usage``, what a triggerer measured) and
        result. A job silent past ``max_silence`` is cancelled and fails the task."""
        watch = JobWatch(
            runner,
            handle,
            poll_interval=self.poll_interval,
            logger=self.log,
            logs=True,
            on_line=lambda line: self.log.info("%s", line),
            cursor=MemoryCursorStore(cursor),
            max_silence=self._max_silence(),
            final_usage=True,
            known_usage=usage,
            read_result=True,
            on_status=self._status_log(),
            budget=retry_budget(),
        )
        try:
            return watch.run()
        except JobSilentError as e:
            self._silent(context, str(e))

    def _silent(self, context: Context, message: str) -> NoReturn:
        """Fails the task of a job cancelled for its silence (XCom ``reason`` ``silent``)."""
        self._xcoms(context)("reason", str(Reason.SILENT))
        if Reason.SILENT in self.fail_fast_on:
            raise ShipyardJobSilentNoRetryError(
                f"{message} [reason {Reason.SILENT} is in fail_fast_on: no retry]"
            )
        raise ShipyardJobSilentError(message)

    def _status_log(self) -> Callable[[AppStatus], None]:
        """What the task log tells of each status: an array's counts as they change, each
        requeue of an app."""
        counts = CountsLog(self.log)
        requeue = str(self._cfg().get("max_requeues"))
        attempts = AttemptsLog(self.log, int(requeue) if requeue.isdigit() else None)

        def told(status: AppStatus) -> None:
            counts(status)
            attempts(status)

        return told

    def _push(self, context: Context, handle: AppHandle, status: AppStatus | None) -> None:
        self._push_handle(context, handle)
        self._xcoms(context)("state", status.state.name if status else "UNKNOWN")
        url = job_url(handle, status, self._ui_url_template())
        if url:  # (a link is kept in an XCom of its own, whatever do_xcom_push says)
            context["ti"].xcom_push(key=ShipyardJobLink().xcom_key, value=url)

    def _ui_url_template(self) -> str | None:
        """The task's ``ui_url``, else its connection's, else ``[shipyard] ui_url`` (checked:
        a bad one names where it is set)."""
        if self.ui_url:
            return check_ui_url_template(self.ui_url, "ui_url")
        if self.shipyard_conn_id:
            template = ShipyardHook(self.shipyard_conn_id).ui_url_template()
            if template:
                return check_ui_url_template(template, f"{self.shipyard_conn_id}: extra.ui_url")
        return configured_ui_url()

    def _finish(self, runner: Runner, context: Context, end: WatchEnd) -> Any:
        """Pushes the ended job's XComs and judges it; returns the task's return value (the
        handle, or with ``return_result`` the result)."""
        handle, status = end.handle, end.status
        if self._superseded():  # the job ended before Airflow told this try to stop
            raise _superseded_error(handle)
        push = self._xcoms(context)
        self._push(context, handle, status)
        if status is not None and status.reason:
            push("reason", str(status.reason))
        if status is not None and status.attempts:
            push("attempts", [a.to_json() for a in status.attempts])
        if status is not None and status.elements is not None and status.is_terminal():
            results = finish_array(
                runner, handle, status, self.allow_failures, self.log, push,
                result_key=None if self.return_result else "result",
            )  # fmt: skip
            return results if self.return_result else handle
        value = None
        if status is not None and status.is_terminal():
            value = self._push_outcome(push, status, end.result)
        try:
            runner.check_succeeded(handle, status)
        except AppFailedError as e:
            self._skip_if_told(handle, status)
            if e.reason in self.fail_fast_on:
                raise ShipyardJobFailedNoRetryError(e) from e
            raise ShipyardJobFailedError(e) from e
        self.log.info("%s SUCCEEDED", handle)
        return value if self.return_result else handle

    def _skip_if_told(self, handle: AppHandle, status: AppStatus | None) -> None:
        """Skips the task when the failed job's exit code is one of ``skip_on_exit_code``."""
        code = failed_exit_code(status)
        if code is not None and code in self.skip_on_exit_code:
            raise AirflowSkipException(
                f"{handle} ended FAILED with exit code {code}, which is in skip_on_exit_code"
                f" {sorted(self.skip_on_exit_code)}: skipping the task"
            )

    def _push_outcome(
        self, push: XComs, status: AppStatus, result: AppResult | None
    ) -> dict[str, dict[str, Any]] | None:
        """The ended job's ``usage`` and ``result`` XComs (with ``return_result`` the result is
        returned instead), with a summary in the log."""
        usage = usage_by_replica(status.roles)
        for line in usage_summary(status.roles):
            self.log.info("usage: %s", line)
        if usage:
            push("usage", usage)
        if result is None:  # a scheduler that collects no results
            return None
        for error in result.errors:
            self.log.warning("result: %s", error)
        values = result_value(result)
        if not self.return_result:
            push("result", values)
        return values


def _event_cursor(event: Mapping[str, Any]) -> LogCursor:
    """The lines a trigger event says are in the task log already."""
    try:
        return LogCursor(event.get("log_cursor") or {})
    except ValueError:
        return LogCursor()
