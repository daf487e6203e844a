"""Python functions as jobs: the submitting side of :meth:`core.runner.Runner.run_function`.

A call ``fn(*args, **kwargs)`` travels by value: cloudpickle of ``(fn, args, kwargs)``,
compressed and base64-encoded in the job's environment (``$SHIPYARD_FUNCTION``, at most
:data:`MAX_PAYLOAD_BYTES`). The job runs :mod:`core.fnrun`'s source with the chosen
interpreter (``python -c``), which needs cloudpickle and the function's imports, and the same
Python minor version as this one. Its outcome comes back through the result channel
(``$SHIPYARD_RESULT_FILE``, :mod:`core.reports`): :func:`function_value` turns it into the
return value, or re-raises the function's exception with the remote traceback as its cause.

Functions are pickled by reference when their module is importable by name (cloudpickle's
rule): the job must then import that module too. ``__main__``'s functions, those of a module
no import could find (an Airflow DAG file, a Prefect flow script loaded by path) and those of
modules registered with :func:`cloudpickle.register_pickle_by_value` travel by value.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from core.errors import ShipyardError
from core.reports import AppResult
from core.specs import AppDef, AppState, AppStatus, Resource, Role

if TYPE_CHECKING:
    from core.schedulers.api import Scheduler
    from core.schedulers.docker.engine import DockerEngine

log = logging.getLogger(__name__)

__all__ = [
    "FUNCTION_ENV",
    "MAX_PAYLOAD_BYTES",
    "PYTHON_CFG",
    "FunctionError",
    "RemoteTraceback",
    "check_interpreter",
    "element_params",
    "function_app",
    "function_job",
    "function_value",
    "outcome",
    "split_cfg",
]

#: the environment variable carrying the pickled call
FUNCTION_ENV = "SHIPYARD_FUNCTION"
#: the environment variable naming the file the function was written in (for tracebacks)
FILE_ENV = "SHIPYARD_FUNCTION_FILE"
#: the environment variable naming the submitter's Python minor version (``3.11``)
PYTHON_ENV = "SHIPYARD_FUNCTION_PYTHON"
#: the largest encoded call (one environment string may hold 128 KiB on Linux)
MAX_PAYLOAD_BYTES = 96 * 1024
#: the cfg key choosing the job's interpreter (taken out before the scheduler sees cfg)
PYTHON_CFG = "python"
#: the result document's marker (:data:`core.fnrun.MARKER`)
MARKER = "shipyard_function"
_PROBE = "import sys, cloudpickle; print('{}.{}'.format(*sys.version_info[:2]))"


class FunctionError(ShipyardError, RuntimeError):
    """A function job gave no return value: it could not start (interpreter, imports), its
    return value could not come back, it ended without an outcome (killed, cancelled), or it
    raised an exception that cannot be rebuilt here (the message names its type)."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a job; the ``__cause__`` of the re-raised one."""

    def __init__(self, handle: str, text: str) -> None:
        super().__init__(f"\nin {handle}:\n{with_source_lines(text)}")


_FRAME_RE = re.compile(r'^  File "([^"<][^"]*)", line (\d+), in ')


def with_source_lines(text: str) -> str:
    """A formatted traceback with each frame's source line added where the job could not
    read it (a file only this host has)."""
    import linecache

    lines = text.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        m = _FRAME_RE.match(line)
        has_source = i + 1 < len(lines) and lines[i + 1].startswith("    ")
        if m and not has_source:
            source = linecache.getline(m.group(1), int(m.group(2))).strip()
            if source:
                out.append(f"    {source}")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


@functools.cache
def runtime_source() -> str:
    """The text of :mod:`core.fnrun`, run by the job as ``python -c``."""
    from core import fnrun

    with open(fnrun.__file__, encoding="utf-8") as f:
        return f.read()


def _ship_module(fn: Callable[..., Any]) -> None:
    """Pickles ``fn``'s module by value when a fresh import could not find it (an Airflow DAG
    file, a Prefect flow script loaded by path): the job could not import it either."""
    import importlib.machinery

    import cloudpickle

    name = getattr(fn, "__module__", None) or "__main__"
    module = sys.modules.get(name)
    if name == "__main__" or module is None:
        return
    if importlib.machinery.PathFinder.find_spec(name.partition(".")[0], sys.path) is None:
        log.debug("pickling module %s by value (it is not importable by name)", name)
        cloudpickle.register_pickle_by_value(module)


def _encode(obj: Any, what: str) -> str:
    import cloudpickle

    try:
        data = cloudpickle.dumps(obj)
    except Exception as e:
        raise ValueError(f"{what}: cannot be pickled: {type(e).__name__}: {e}") from None
    import base64  # (lazily, as subprocess: the runner imports this module)

    return base64.b64encode(zlib.compress(data)).decode("ascii")


def split_cfg(cfg: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """``cfg`` without the :data:`PYTHON_CFG` key, and that key's value."""
    rest = dict(cfg or {})
    python = rest.pop(PYTHON_CFG, None)
    if python is not None and (not isinstance(python, str) or not python.strip()):
        raise ValueError(f"cfg.{PYTHON_CFG}: expected an interpreter path or name, got {python!r}")
    return rest, python


def _on_this_host(scheduler: str, cfg: Mapping[str, Any]) -> bool:
    """True where the job's processes see this host's files: local processes, and a Slurm
    cluster reached through this host's commands."""
    if scheduler == "local_docker":
        return False
    if scheduler == "slurm" and cfg.get("cluster"):
        from core.clusters import get_cluster

        return get_cluster(str(cfg["cluster"])).transport == "local"
    return True


def default_python(scheduler: str, cfg: Mapping[str, Any]) -> str:
    """This interpreter where the job shares this host's files (local processes, a Slurm
    cluster reached from here, as submitit does), else ``python3`` on the job's PATH."""
    return sys.executable if _on_this_host(scheduler, cfg) else "python3"


def _role_name(fn: Callable[..., Any]) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", getattr(fn, "__name__", "") or "function")
    return (name.strip("-._") or "function")[:63]


def function_app(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    python: str,
    image: str = "",
    resource: Resource | None = None,
) -> AppDef:
    """The app that calls ``fn(*args, **kwargs)`` once with ``python``.

    Raises:
        ValueError: ``fn`` is not callable, or the call cannot be pickled, or it is too large.
    """
    if not callable(fn):
        raise ValueError(f"fn: expected a callable, got {fn!r}")
    _ship_module(fn)
    payload = _encode((fn, tuple(args), dict(kwargs)), "function")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"function: the function and its arguments pickle to {len(payload)} bytes (encoded),"
            f" more than the {MAX_PAYLOAD_BYTES} that travel with a job; pass large inputs by"
            " path (a file the job can read)"
        )
    role = Role(
        name=_role_name(fn),
        image=image,
        entrypoint=python,
        args=["-c", runtime_source()],
        env={FUNCTION_ENV: payload, PYTHON_ENV: "{}.{}".format(*sys.version_info[:2])},
    )
    source = _source_file(fn)
    if source:
        role.env[FILE_ENV] = source
    if resource is not None:
        role.resource = resource
    return AppDef(name=role.name, roles=[role], metadata={"shipyard.function": "1"})


def _source_file(fn: Callable[..., Any]) -> str | None:
    code = getattr(fn, "__code__", None)
    name = getattr(code, "co_filename", None)
    return name if isinstance(name, str) and not name.startswith("<") else None


def element_params(calls: Iterable[Any]) -> list[dict[str, str]]:
    """One array element's params per argument of ``calls`` (each a tuple of positional
    arguments, or one value), for :meth:`core.runner.Runner.map_function`."""
    out = []
    for i, call in enumerate(calls):
        args = call if isinstance(call, tuple) else (call,)
        out.append({MARKER: _encode((args, {}), f"iterable[{i}]")})
    return out


@functools.cache
def _probe_local(python: str) -> str:
    import subprocess

    try:
        out = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as e:
        raise ValueError(f"cfg.{PYTHON_CFG}: cannot run {python!r}: {e.strerror}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"cfg.{PYTHON_CFG}: {python} cannot import cloudpickle ({last})")
    return out.stdout.strip()


@functools.cache
def _probe_image(
    image: str, python: str, engine: DockerEngine | None, pull: bool, docker_host: str | None
) -> str:
    """(``docker_host``: ``$DOCKER_HOST``, which names the engine when ``engine`` is None)"""
    from docker.errors import DockerException

    from core.schedulers.docker.checks import image_python
    from core.schedulers.docker.engine import connect

    try:
        client = connect(engine)
    except DockerException as e:
        raise ValueError(f"image: cannot check {image!r}: no Docker engine answers ({e})") from None
    try:
        status, out, err = image_python(client.api, image, python, _PROBE, pull)
    finally:
        client.close()
    if status != 0:
        last = err.strip().splitlines() or [f"exit code {status}"]
        raise ValueError(f"cfg.{PYTHON_CFG}: {python} in {image} cannot import cloudpickle"
                         f" ({last[-1]})")  # fmt: skip
    return out.strip()


def check_interpreter(
    scheduler: str,
    cfg: Mapping[str, Any],
    python: str,
    image: str = "",
    docker_engine: DockerEngine | None = None,
) -> None:
    """Pre-flight of the job's interpreter where this host can run it (local processes, a
    Docker image, a Slurm cluster reached through this host's commands; once per interpreter
    and image): it must import cloudpickle and be this Python's minor version. Behind a login
    node or slurmrestd the job checks it first and fails with the same message. A Docker image
    is run on ``docker_engine`` (None: the environment's engine), in a container removed
    at once; it is pulled first if the engine lacks it, unless cfg ``pull`` is ``never``.

    Raises:
        ValueError: naming ``cfg.python`` (or ``image``) and what was found.
    """
    if scheduler == "local_docker":
        if not image:
            raise ValueError("image: expected a Docker image with Python and cloudpickle, got none")
        pull = cfg.get("pull") != "never"
        have = _probe_image(image, python, docker_engine, pull, os.environ.get("DOCKER_HOST"))
    elif _on_this_host(scheduler, cfg):
        have = _probe_local(python)
    else:
        return
    want = "{}.{}".format(*sys.version_info[:2])
    if have != want:
        raise ValueError(
            f"cfg.{PYTHON_CFG}: {python} is Python {have}, but the function is pickled by"
            f" Python {want} (cloudpickle needs the same minor version)"
        )


def outcome(result: AppResult) -> dict[str, Any] | None:
    """The function job's outcome document (None: the job wrote none)."""
    for replica in result.replicas:
        if replica.error:
            raise FunctionError(f"{result.handle}: {replica.error}")
        if isinstance(replica.value, dict) and replica.value.get(MARKER):
            return replica.value
    return None


def function_value(result: AppResult, status_text: str = "") -> Any:
    """The return value of a function job from its :class:`AppResult`.

    Raises:
        The function's own exception (its ``__cause__`` the :class:`RemoteTraceback`), or
        :class:`FunctionError` when there is no return value to give.
    """
    doc = outcome(result)
    if doc is None:
        detail = f": {status_text}" if status_text else ""
        if result.state == AppState.SUCCEEDED:
            raise FunctionError(f"{result.handle}: the job wrote no function outcome{detail}")
        raise FunctionError(
            f"{result.handle}: the function job ended {result.state.name} without an"
            f" outcome{detail}"
        )
    if doc.get("ok"):
        return _unpickle(doc["value"])
    if doc.get("kind") != "raised":
        raise FunctionError(f"{result.handle}: {doc.get('message')}")
    raise _rebuilt(result.handle, doc)


def _unpickle(blob: str) -> Any:
    import base64
    import pickle

    return pickle.loads(base64.b64decode(blob))


def _rebuilt(handle: str, doc: dict[str, Any]) -> BaseException:
    cause = RemoteTraceback(handle, str(doc.get("traceback", "")))
    exc: BaseException | None = None
    if doc.get("exception"):
        try:
            exc = _unpickle(doc["exception"])
        except Exception as e:  # its class is not importable here
            log.debug("exception of %s does not load here: %s", handle, e)
    if not isinstance(exc, BaseException):
        exc = FunctionError(
            f"{handle}: the function raised {doc.get('type')}: {doc.get('message')}"
        )
    exc.__cause__ = cause
    return exc


def function_job(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    scheduler: str | None,
    cfg: Mapping[str, Any] | None,
    image: str = "",
    resource: Resource | None = None,
    docker_engine: DockerEngine | None = None,
) -> tuple[str, dict[str, Any], AppDef]:
    """The scheduler, run options and app that call ``fn(*args, **kwargs)`` there, the
    interpreter checked (:func:`check_interpreter`, a Docker image on ``docker_engine``):
    what :meth:`FunctionRunner.run_function` submits, for integrations that submit it their
    own way.

    Raises:
        ValueError: naming the argument, before anything starts.
    """
    from core.schedulers import get_default_scheduler_name

    scheduler = scheduler or get_default_scheduler_name()
    rest, python = split_cfg(cfg)
    python = python or default_python(scheduler, rest)
    check_interpreter(scheduler, rest, python, image, docker_engine)
    app = function_app(fn, args, kwargs, python=python, image=image, resource=resource)
    return scheduler, rest, app


class FunctionRunner:
    """The function-job methods of :class:`core.runner.Runner` (mixed into it)."""

    if TYPE_CHECKING:  # (what they use of the runner)

        def scheduler(self, backend: str) -> Scheduler[Any]: ...

        def run(self, app: AppDef, scheduler: str | None, cfg: Mapping[str, Any]) -> str: ...

        def run_array(
            self, app: AppDef, scheduler: str | None, cfg: Mapping[str, Any], *,
            params: list[dict[str, Any]], max_parallel: int | None,
        ) -> str: ...  # fmt: skip

        def wait(self, handle: str, *, timeout: float | None) -> AppStatus | None: ...

        def result(self, handle: str) -> AppResult: ...

        def results(self, handle: str) -> list[AppResult | None]: ...

    def run_function(
        self,
        fn: Callable[..., Any],
        *args: Any,
        scheduler: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        image: str = "",
        resource: Resource | None = None,
        **kwargs: Any,
    ) -> str:
        """Runs ``fn(*args, **kwargs)`` as a one-replica job and returns its handle, as
        ``executor.submit(fn, *args, **kwargs)`` does (the four keyword names above are the
        runner's; every other keyword goes to ``fn``). :meth:`wait_function` gives its return
        value or re-raises its exception.

        The job's interpreter is cfg ``python`` (default: this interpreter on local processes
        and on a Slurm cluster reached from this host, ``python3`` in a Docker image or on a
        named cluster); it needs cloudpickle, the function's imports and this Python's minor
        version, checked before submitting where this host can run it.

        Raises:
            ValueError: ``fn`` or its arguments cannot be pickled or are too large, or the
                interpreter is unfit (each message names it), before anything starts.
        """
        name, rest, app = function_job(
            fn, args, kwargs, scheduler=scheduler, cfg=cfg, image=image, resource=resource,
            docker_engine=self._docker_engine(scheduler),
        )  # fmt: skip
        return self.run(app, name, rest)

    def map_function(
        self,
        fn: Callable[..., Any],
        calls: Iterable[Any],
        *,
        scheduler: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        image: str = "",
        resource: Resource | None = None,
        max_parallel: int | None = None,
    ) -> str:
        """Runs ``fn`` once per item of ``calls`` (a tuple of positional arguments, or one
        argument) as one array (:meth:`run_array`; one Slurm array on Slurm), at most
        ``max_parallel`` at once; :meth:`wait_map` gives the return values in order."""
        params = element_params(calls)
        if not params:
            raise ValueError("calls: expected at least one call, got none")
        name, rest, app = function_job(
            fn, (), {}, scheduler=scheduler, cfg=cfg, image=image, resource=resource,
            docker_engine=self._docker_engine(scheduler),
        )  # fmt: skip
        return self.run_array(app, name, rest, params=params, max_parallel=max_parallel)

    def _docker_engine(self, scheduler: str | None) -> DockerEngine | None:
        """The engine of this runner's ``local_docker`` scheduler, where a function job's
        image is checked (None: another scheduler, or the environment's engine)."""
        from core.schedulers import get_default_scheduler_name

        if (scheduler or get_default_scheduler_name()) != "local_docker":
            return None
        engine: DockerEngine | None = getattr(self.scheduler("local_docker"), "engine", None)
        return engine

    def wait_function(self, handle: str, timeout: float | None = None) -> Any:
        """Waits for the function job ``handle`` and returns what the function returned.

        Raises:
            The function's exception, with the job's traceback as its ``__cause__``;
            :class:`FunctionError` when the job gave no return value (the message says why);
            TimeoutError: ``timeout`` seconds passed first (the job keeps running).
        """
        status = self.wait(handle, timeout=timeout)
        if status is None:
            raise FunctionError(f"{handle}: no such job")
        return function_value(self.result(handle), status.msg)

    def wait_map(self, handle: str, timeout: float | None = None) -> list[Any]:
        """Waits for the array of :meth:`map_function` and returns each call's return value,
        in order; the first call that raised re-raises (its index in the message's handle)."""
        self.wait(handle, timeout=timeout)
        out = []
        for i, result in enumerate(self.results(handle)):
            if result is None:
                raise FunctionError(f"{handle}[{i}]: the call never started")
            out.append(function_value(result))
        return out
