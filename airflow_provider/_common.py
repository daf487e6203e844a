"""Helpers shared by the operator, the sensor and the trigger (no Airflow imports here)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from core.appfile import app_from_dict, app_from_yaml, load_app
from core.runner import Runner, get_runner
from core.specs import AppDef, AppState, Role

if TYPE_CHECKING:
    from core.schedulers.docker_scheduler import DockerEngine

#: file name endings of app files (Jinja-templated like any Airflow template file)
APP_FILE_EXTS = (".yaml", ".yml")

ACTIVE_STATES = frozenset(
    s.name for s in (AppState.UNSUBMITTED, AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING)
)
TERMINAL_STATES = frozenset(
    s.name for s in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)
)


def make_runner(session_name: str | None = None, engine: DockerEngine | None = None) -> Runner:
    """A runner for ``session_name`` (default: Airflow's ``[shipyard] session``, else
    ``$SHIPYARD_SESSION``, else ``shipyard``), whose ``local_docker`` connects to ``engine``
    (a connection's Docker engine) when given."""
    from airflow_provider.config import session_name as configured_session

    session_name = configured_session(session_name)
    if engine is None:
        return get_runner(session_name)
    from airflow_provider.hooks.shipyard import docker_scheduler_factories

    return get_runner(session_name, scheduler_factories=docker_scheduler_factories(engine))


def idempotency_key(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """The deterministic key a task instance tags its job with (the same on every try)."""
    mi = -1 if map_index is None else map_index
    return f"airflow:{dag_id}:{run_id}:{task_id}:{mi}"


def state_names(states: Iterable[Any] | str | AppState, field: str) -> list[str]:
    """Normalizes app states given as names (any case) or :class:`AppState` to upper-case names.

    Raises:
        ValueError: naming ``field`` when a state is not an app state.
    """
    if isinstance(states, str | AppState):
        states = [states]
    out: list[str] = []
    for s in states:
        if isinstance(s, AppState):
            out.append(s.name)
            continue
        name = str(s).strip().upper()
        if name not in AppState.__members__:
            raise ValueError(
                f"{field}: expected app states ({', '.join(AppState.__members__)}), got {s!r}"
            )
        out.append(name)
    return out


def to_app_def(app: Any, env: Mapping[str, str] | None = None) -> AppDef:
    """Turns what a DAG author passed as ``app`` into a validated :class:`AppDef`.

    Accepts an ``AppDef``, a dict (as in an app file), the path of a YAML app file, or YAML
    text (what Airflow's templating leaves of an app file). ``env`` is added to every role.

    Raises:
        ValueError: naming the bad field.
    """
    if isinstance(app, AppDef):
        result = app
    elif isinstance(app, Mapping):
        result = app_from_dict(dict(app))
    elif isinstance(app, str | os.PathLike):
        text = os.fspath(app)
        if "\n" not in text and text.strip().endswith(APP_FILE_EXTS):
            result = load_app(text.strip())
        else:
            result = app_from_yaml(text, source="app")
    else:
        raise ValueError(
            f"app: expected an AppDef, a dict or the path of a YAML app file, got {type(app).__name__}"
        )
    if env:
        for key, val in env.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise ValueError(f"env.{key}: expected a string, got {val!r}")
        result = AppDef(
            name=result.name,
            roles=[_with_env(r, env) for r in result.roles],
            metadata=dict(result.metadata),
        )
    return result


def _with_env(role: Role, env: Mapping[str, str]) -> Role:
    import copy

    role = copy.deepcopy(role)
    role.env = {**role.env, **env}
    return role
