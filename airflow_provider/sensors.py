"""ShipyardJobSensor: wait until a Shipyard app (by handle) reaches a state."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider._common import TERMINAL_STATES, make_runner, state_names
from airflow_provider.config import retry_budget
from airflow_provider.hooks.shipyard import ShipyardHook
from airflow_provider.triggers import ShipyardJobTrigger
from core.specs import AppState, parse_app_handle
from core.transient import call_with_retries
from core.watch import LogCursor, lines_after

if TYPE_CHECKING:
    from airflow.sdk import Context

    from core.runner import Runner
    from core.schedulers.docker_scheduler import DockerEngine

__all__ = ["ShipyardJobSensor"]


class ShipyardJobSensor(BaseSensorOperator):
    """Pokes the status of ``app_handle`` until it reaches one of ``target_states``.

    Args:
        app_handle: ``{scheduler}://{session}/{app_id}``, usually
            ``"{{ ti.xcom_pull(task_ids='submit') }}"`` (templated)
        target_states: states that end the wait successfully (default: SUCCEEDED)
        failure_states: states that fail the task at once, without waiting for the timeout and
            without retrying (default: FAILED, CANCELLED). A terminal state that is neither a
            target nor a failure state fails the task too: it can never change again.
        deferrable: wait in :class:`~airflow_provider.triggers.ShipyardJobTrigger` in the
            triggerer (default: ``[operators] default_deferrable``); otherwise ``mode`` (poke or
            reschedule) applies
        shipyard_conn_id: the Airflow connection of the app's backend, when it is a Slurm
            cluster reached through one (templated)
        stream_logs: put the app's log lines (``role/replica line``) in the task log, each
            once: deferrable, the trigger logs them as they come and the task adds the rest
            when it resumes; otherwise they are logged once the wait is over

    Returns (and pushes as XCom) the name of the state reached.
    """

    template_fields: Sequence[str] = (
        "app_handle",
        "target_states",
        "failure_states",
        "shipyard_conn_id",
    )
    ui_color = "#e1eef9"

    def __init__(
        self,
        *,
        app_handle: str,
        target_states: Iterable[str | AppState] = ("SUCCEEDED",),
        failure_states: Iterable[str | AppState] = ("FAILED", "CANCELLED"),
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        shipyard_conn_id: str | None = None,
        stream_logs: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 5.0)
        super().__init__(**kwargs)
        self.app_handle = app_handle
        self.target_states = self._states_or_template(target_states, "target_states")
        self.failure_states = self._states_or_template(failure_states, "failure_states")
        overlap = set(self.target_states) & set(self.failure_states)
        if overlap and not any("{" in s for s in self.target_states + self.failure_states):
            raise ValueError(f"failure_states: {sorted(overlap)} cannot also be target_states")
        self.deferrable = deferrable
        self.shipyard_conn_id = shipyard_conn_id
        self.stream_logs = stream_logs
        self._engine: DockerEngine | None = None
        self._connected = False

    @staticmethod
    def _states_or_template(states: Iterable[Any] | str, field: str) -> list[str]:
        if isinstance(states, str) and "{" in states:
            return [states]
        items = [states] if isinstance(states, str | AppState) else list(states)
        if any(isinstance(s, str) and "{" in s for s in items):
            return [str(s) for s in items]  # validated after rendering
        return state_names(items, field)

    def _checked_states(self) -> tuple[list[str], list[str]]:
        targets = state_names(_split(self.target_states), "target_states")
        failures = state_names(_split(self.failure_states), "failure_states")
        return targets, failures

    def poke(self, context: Context) -> bool | PokeReturnValue:
        handle = str(self.app_handle).strip()
        parse_app_handle(handle)  # a malformed handle fails with the reason
        targets, failures = self._checked_states()
        with self._runner() as runner:
            # a transient failure is retried within the budget ([shipyard] retry_budget, else
            # core.transient's), then fails
            status = call_with_retries(
                lambda: runner.status(handle), f"status of {handle}", budget=retry_budget()
            )
        if status is None:
            raise AirflowFailException(f"app {handle} is unknown to its scheduler")
        state = status.state.name
        self.log.info("%s is %s", handle, state)
        if state in targets:
            if self.stream_logs:
                self._log_lines(handle, LogCursor())
            return PokeReturnValue(is_done=True, xcom_value=state)
        if state in failures or state in TERMINAL_STATES:
            codes = ", ".join(
                f"{role}/{k}={code}"
                for role, role_codes in status.exit_codes().items()
                for k, code in enumerate(role_codes)
                if code not in (None, 0)
            )
            raise AirflowFailException(
                f"app {handle} is {state}, not one of {targets}"
                + (f" (exit codes: {codes})" if codes else "")
            )
        return False

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        result = self.poke(context)
        if isinstance(result, PokeReturnValue):
            return result.xcom_value
        targets, failures = self._checked_states()
        self.defer(
            trigger=ShipyardJobTrigger(
                app_handle=str(self.app_handle).strip(),
                poll_interval=self.poke_interval,
                target_states=targets,
                failure_states=failures,
                shipyard_conn_id=self.shipyard_conn_id,
                stream_logs=self.stream_logs,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> str:
        """Resumes after the trigger fired: succeeds on a target state, fails otherwise."""
        state = str(event.get("state"))
        if self.stream_logs and event.get("app_handle"):
            try:
                cursor = LogCursor(event.get("log_cursor") or {})
            except ValueError:
                cursor = LogCursor()
            self._log_lines(str(event["app_handle"]), cursor)
        if event.get("status") == "success":
            self.log.info("%s is %s", event.get("app_handle"), state)
            return state
        if event.get("status") == "error":
            raise AirflowException(event.get("message") or "waiting for the app failed")
        raise AirflowFailException(
            f"app {event.get('app_handle')} is {state}, not one of {self.target_states}"
        )

    def _runner(self) -> Runner:
        """A runner that reaches the connection's backend (its cluster registered here, its
        Docker engine used)."""
        if self.shipyard_conn_id and not self._connected:
            self._engine = ShipyardHook(self.shipyard_conn_id).docker_engine()
            self._connected = True
        return make_runner(engine=self._engine)

    def _log_lines(self, handle: str, cursor: LogCursor) -> None:
        """Logs the app's lines after ``cursor`` (those not in the task log yet)."""
        try:
            with self._runner() as runner:
                for _, line in lines_after(runner, handle, cursor):
                    self.log.info("%s", line)
        except Exception as e:
            self.log.warning("cannot read the logs of %s: %s", handle, e)


def _split(states: list[str]) -> list[str]:
    """Rendered templates may give ``"A,B"`` or ``"['A', 'B']"``: split them into names."""
    out: list[str] = []
    for s in states:
        out.extend(p.strip(" '\"") for p in str(s).strip("[]() ").split(",") if p.strip(" '\""))
    return out
