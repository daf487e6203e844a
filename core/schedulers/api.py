"""The scheduler interface every backend implements, and helpers shared by the backends."""

from __future__ import annotations

import abc
import builtins
import copy
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Generic, TypeVar

from core.reports import Problem, ReplicaResult
from core.specs import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    Attempt,
    Cfg,
    CfgVal,
    Role,
    RoleStatus,
    runopts,
    validate_app,
)

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "DescribeAppResponse",
    "ListAppResponse",
    "Scheduler",
    "Stream",
    "filter_regex",
    "split_lines",
    "split_lines_iterator",
]


class Stream(StrEnum):
    """Which output of a replica to read."""

    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


@dataclass
class DescribeAppResponse:
    """What a scheduler knows about an app: its state, restarts, messages and replica statuses.

    Fields are accessed directly; a scheduler that returns free text fills ``msg``, one that
    returns structured JSON fills ``structured_error_msg``.
    """

    app_id: str = "<NOT_SET>"
    state: AppState = AppState.UNSUBMITTED
    num_restarts: int = -1
    msg: str = NONE
    structured_error_msg: str = NONE
    ui_url: str | None = None
    roles_statuses: list[RoleStatus] = field(default_factory=list)
    roles: list[Role] = field(default_factory=list)
    #: why it ended, where the backend knows better than exit codes (a Slurm TIMEOUT, ...)
    reason: str | None = None
    #: the ended attempts before the current one (a job the backend requeued in place)
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class ListAppResponse:
    """One app of :meth:`Scheduler.list`: its id and state (``app_handle`` filled by the runner)."""

    app_id: str
    state: AppState
    app_handle: str = "<NOT_SET>"


T = TypeVar("T")


class Scheduler(abc.ABC, Generic[T]):
    """An interface over one backend. Implementors need only the abstract methods.

    Args:
        backend: the scheduler's registered name (``local_cwd``, ``local_docker``, ``slurm`` ...)
        session_name: the session the apps are submitted under (part of their handles)
    """

    def __init__(self, backend: str, session_name: str) -> None:
        self.backend = backend
        self.session_name = session_name
        self._cfg_opts: runopts | None = None  # run_opts(), built once for resolve_cfg

    def close(self) -> None:
        """Frees what the scheduler holds. Never raises; safe to call more than once.

        Only schedulers with local state need to override it.
        """

    def __enter__(self) -> Scheduler[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        app: AppDef,
        cfg: Cfg | None,
        workspace: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Submits ``app`` and returns its app id (once per ``idempotency_key``, see
        :meth:`schedule`).

        Mostly used for tests: users should prefer :class:`core.runner.Runner`.
        """
        resolved = self.resolve_cfg(cfg)
        if workspace:
            app = self.apply_workspace(app, workspace, resolved)
        dryrun_info = self.submit_dryrun(app, resolved, idempotency_key)
        return self.schedule(dryrun_info)

    def apply_workspace(self, app: AppDef, workspace: str, cfg: Mapping[str, CfgVal]) -> AppDef:
        """Returns a copy of ``app`` whose first role (and every role sharing its image) runs
        with ``workspace`` applied (``cfg``: as resolved by :meth:`resolve_cfg`).

        Raises:
            ValueError: if this scheduler does not support workspaces, or the app is invalid.
        """
        from core.workspace import WorkspaceMixin

        if not isinstance(self, WorkspaceMixin):
            raise ValueError(f"workspace: scheduler {self.backend} does not support workspaces")
        validate_app(app)
        app = copy.deepcopy(app)
        first = app.roles[0]
        old_image = first.image
        self.build_workspace_and_update_role(first, workspace, cfg)
        for role in app.roles[1:]:
            if role.image == old_image:
                role.image = first.image
        return app

    def preflight_workspace(self, app: AppDef, workspace: str, cfg: Mapping[str, CfgVal]) -> AppDef:
        """The app as a submit with ``workspace`` would run it, for :meth:`preflight`: by
        default :meth:`apply_workspace` (a Docker image built on the role's is what its
        entrypoints are looked up in). A scheduler whose workspace leaves state a submit
        would trip over (a snapshot into the new ``job_dir``) only checks the workspace."""
        return self.apply_workspace(app, workspace, cfg)

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[T]) -> str:
        """Same as :meth:`submit` but takes the request from :meth:`submit_dryrun`.

        Exactly once: when the request carries an idempotency key
        (:attr:`AppDryRunInfo.idempotency_key`), the scheduler claims the key atomically in the backend before
        any replica's command can run. If another submission (any thread, process or host)
        already holds the key, nothing is started and the id of that submission's app is
        returned instead, so racing submitters all get the same app.
        """

    def submit_dryrun(
        self, app: AppDef, cfg: Cfg | None, idempotency_key: str | None = None
    ) -> AppDryRunInfo[T]:
        """Returns the request that would be submitted, without submitting it; with
        ``idempotency_key``, one that claims the key when scheduled (see :meth:`schedule`).

        The app and cfg are validated first; errors name the bad field.
        """
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key
        ):
            raise ValueError(
                f"idempotency_key: expected a non-empty string, got {idempotency_key!r}"
            )
        resolved = self.resolve_cfg(cfg)
        validate_app(app)
        self._validate(app, self.backend, resolved)
        dryrun_info = self._submit_dryrun(app, resolved)
        for role in app.roles:
            dryrun_info = role.pre_proc(self.backend, dryrun_info)
        dryrun_info.app = app
        dryrun_info.cfg = resolved
        dryrun_info.scheduler = self.backend
        if idempotency_key:
            dryrun_info.idempotency_key = idempotency_key
            self._keep_idempotency_key(dryrun_info, idempotency_key)
        return dryrun_info

    def _keep_idempotency_key(self, dryrun_info: AppDryRunInfo[T], key: str) -> None:
        """Puts ``key`` into the request where the backend keeps it with the job (a
        container label, a Slurm comment), so :meth:`find_by_idempotency_key` finds the job
        from any process. By default nothing: :meth:`schedule` claims it."""

    @abc.abstractmethod
    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[T]: ...

    def run_opts(self) -> runopts:
        """The run options this scheduler takes: a ``--help`` for its cfg."""
        return self._run_opts()

    def resolve_cfg(self, cfg: Cfg | None) -> dict[str, CfgVal]:
        """``cfg`` checked against :meth:`run_opts`, with the defaults filled in.

        Raises:
            ValueError: naming the unknown, mistyped or missing option.
        """
        opts = getattr(self, "_cfg_opts", None)  # (a subclass may skip __init__)
        if opts is None:
            opts = self._cfg_opts = self.run_opts()
        return opts.resolve(cfg)

    def _run_opts(self) -> runopts:
        return runopts()

    @abc.abstractmethod
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """Describes the app; ``None`` if it does not exist."""

    def describe_many(self, app_ids: Iterable[str]) -> dict[str, DescribeAppResponse | None]:
        """Describes several apps; backends that can answer for all in one call override it."""
        return {app_id: self.describe(app_id) for app_id in app_ids}

    @abc.abstractmethod
    def list(self) -> list[ListAppResponse]:
        """The apps launched on this scheduler, with their states."""

    def notify_changes(
        self, app_id: str, callback: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Calls ``callback()`` (from another thread; it must be short) whenever the app's
        state may have changed, until the returned function is called: a watcher then
        describes the app at once instead of at its next poll. None (the default) when this
        scheduler cannot tell: the watcher only polls. The local scheduler tells of the apps
        this process launched (each time one of their processes ends)."""
        return None

    def exists(self, app_id: str) -> bool:
        """True if the app exists (was submitted)."""
        return self.describe(app_id) is not None

    def find_by_idempotency_key(
        self, key: str, cfg: Mapping[str, CfgVal] | None = None
    ) -> str | None:
        """The id of the app submitted with ``key`` (see :meth:`schedule`), or None.

        ``cfg`` is the run configuration the app was submitted with, for backends where it
        says where to look (the ``slurm`` scheduler's ``cluster``). Backends that can find apps
        by key override this; the default finds none.
        """
        return None

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
        """An iterator over the log lines of replica ``k`` of ``role_name``.

        Lines keep their whitespace and end in ``\\n`` (``\\r`` is preserved). ``regex`` keeps
        only matching lines; ``since``/``until`` bound the time window where the backend knows
        line times; ``should_tail`` follows the output until the app is terminal; ``streams``
        picks stdout, stderr or combined, ``ValueError`` if the backend cannot.

        Raises:
            NotImplementedError: if the scheduler does not support log iteration.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support log iteration")

    def cancel(self, app_id: str) -> None:
        """Cancels the app. Idempotent: cancelling a finished or cancelled app does nothing.

        Does not wait for the app to reach CANCELLED; use the runner's ``wait`` for that.
        """
        if self.exists(app_id):
            self._cancel_existing(app_id)

    @abc.abstractmethod
    def _cancel_existing(self, app_id: str) -> None: ...

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        """Scheduler-specific validation, run before the request is built."""

    def preflight(self, dryrun_info: AppDryRunInfo[T]) -> builtins.list[Problem]:
        """Checks, without starting anything, what a submit of ``dryrun_info`` would hit in
        the backend (images, entrypoints, directories, partitions ...). Every problem is
        returned, each naming its field; the default finds none.

        ``dryrun_info.request`` is None when the dry run itself failed (the runner reports
        that error): check what can be checked from ``dryrun_info.app`` and ``.cfg``.
        """
        return []

    def native_array(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> bool:
        """Whether :meth:`submit_array` runs ``app`` as one array of the backend's own (the
        default: no, an array's driver starts each element as an app of its own)."""
        return False

    def submit_array(
        self,
        app: AppDef,
        cfg: Mapping[str, CfgVal],
        template: tuple[AppDef, builtins.list[dict[int, str]]],
        indices: builtins.list[int],
        max_parallel: int,
        idempotency_key: str | None = None,
    ) -> tuple[str, builtins.list[str]]:
        """Submits elements ``indices`` of an array as one native array of the backend, at most
        ``max_parallel`` running at once; ``template`` is the app every element runs and its
        per-element values (:func:`core.arrays.spec.array_template` of ``app``). Returns the
        native array's app id (cancelling it cancels every element) and each element's app id.
        Exactly once with ``idempotency_key``, as :meth:`schedule`.

        Raises:
            NotImplementedError: :meth:`native_array` is False for ``app``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no native arrays")

    def native_after(
        self, app_ids: builtins.list[str], condition: str, cfg: Mapping[str, CfgVal]
    ) -> dict[str, CfgVal] | None:
        """The run options that make the backend itself hold an app until ``app_ids`` (apps of
        this backend, none ended yet) ended as ``condition`` says (``ok``, ``any``, ``notok``),
        ending it CANCELLED when that can no longer be; None (the default) if it cannot (a
        driver process then holds the app)."""
        return None

    def read_results(self, app_id: str) -> builtins.list[ReplicaResult]:
        """The results (``$SHIPYARD_RESULT_FILE``) of the app's collected replicas: replica 0
        of each role, or every replica with ``result_replicas=all``. A replica's oversized or
        invalid result is its :attr:`ReplicaResult.error`, not an exception.

        Raises:
            ValueError: the app does not exist.
            NotImplementedError: the scheduler does not collect results.
        """
        raise NotImplementedError(f"{type(self).__name__} does not collect results")


def split_lines(text: str) -> list[str]:
    """Splits ``text`` into lines, each keeping its ``\\n`` (a trailing partial line is kept)."""
    return text.splitlines(keepends=True) if "\r" not in text else _split_on_newline(text)


def _split_on_newline(text: str) -> list[str]:
    # str.splitlines also splits on \r and other separators; only \n ends a log line.
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def split_lines_iterator(chunks: Iterable[str]) -> Iterator[str]:
    """Re-chunks a stream of text pieces into whole lines (each ending in ``\\n``)."""
    buf = ""
    for chunk in chunks:
        buf += chunk
        if "\n" not in buf:
            continue
        head, _, buf = buf.rpartition("\n")
        yield from _split_on_newline(head + "\n")
    if buf:
        yield buf


def filter_regex(regex: str | None, lines: Iterable[str]) -> Iterator[str]:
    """The lines that match ``regex`` (``re.search``); all lines when ``regex`` is None (then
    ``lines`` itself, not wrapped: a generator more per line costs a 200k-line read 10%)."""
    if not regex:
        return iter(lines)
    pattern = re.compile(regex)
    return (line for line in lines if pattern.search(line))


def check_stream(streams: Stream | str | None, supported: Iterable[Stream]) -> Stream:
    """Normalises ``streams`` (default: combined) and raises ``ValueError`` if unsupported."""
    supported = list(supported)
    if streams is None:
        return Stream.COMBINED if Stream.COMBINED in supported else supported[0]
    try:
        stream = Stream(streams)
    except ValueError:
        raise ValueError(
            f"streams: expected one of {[s.value for s in Stream]}, got {streams!r}"
        ) from None
    if stream not in supported:
        raise ValueError(
            f"streams: {stream.value} is not supported by this scheduler;"
            f" expected one of {[s.value for s in supported]}"
        )
    return stream
