"""The array methods of :class:`core.runner.Runner` (mixed into it): arrays, and apps that
wait for other apps (both run by a driver process, see :mod:`core.arrays`).

:mod:`core.arrays` is imported by the methods that use it: a runner that never meets an array
does not load it (start-up of every command).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from core.schedulers import get_default_scheduler_name
from core.specs import (
    AppDef,
    AppHandle,
    AppStatus,
    Cfg,
    is_array_id,
    make_app_handle,
    parse_app_handle,
)

if TYPE_CHECKING:
    from core import arrays
    from core.reports import AppResult
    from core.runner import Runner
    from core.schedulers.api import Scheduler

log = logging.getLogger("core.runner")

__all__ = ["ArrayRunner"]


class ArrayRunner:
    """The array methods of :class:`core.runner.Runner`."""

    if TYPE_CHECKING:  # (what they use of the runner)
        _name: str
        _plain: bool

        def _scheduler(self, backend: str, session: str | None = None) -> Scheduler[Any]: ...

        def status(self, app_handle: AppHandle) -> AppStatus | None: ...

        def describe(self, app_handle: AppHandle) -> AppDef | None: ...

        def result(self, app_handle: AppHandle) -> AppResult: ...

    def run_array(
        self,
        app: AppDef,
        scheduler: str | None = None,
        cfg: Cfg | None = None,
        *,
        size: int | None = None,
        params: list[dict[str, Any]] | None = None,
        max_parallel: int | None = None,
        idempotency_key: str | None = None,
        after: list[AppHandle] | None = None,
        after_condition: str = "ok",
    ) -> AppHandle:
        """Runs ``app`` as an array of elements and returns the array's handle.

        ``size=N`` runs elements 0..N-1; ``params=[{...}, ...]`` one element per mapping. Each
        element sees ``$SHIPYARD_ARRAY_INDEX`` and the macro ``${array_index}``; with ``params``
        its mapping as JSON in ``$SHIPYARD_ARRAY_PARAMS`` and as macros ``${params.NAME}`` in
        args and env. At most ``max_parallel`` elements run at once (the rest are PENDING).

        The array's handle (``{scheduler}://{session}/{array_id}``) gives the aggregate status
        with every element's (``status(h).elements``, ``.counts()``), and takes :meth:`wait`,
        :meth:`cancel` (every element not yet ended), :meth:`retry_failed` and
        :meth:`results`; each element is ``{handle}[i]``, with :meth:`status`,
        :meth:`log_lines`, :meth:`result` and :meth:`cancel` of its latest attempt. The elements
        are started by a driver process that outlives this one (see :mod:`core.arrays`). With
        ``idempotency_key``, a second submit gets the same array, and each element runs once.
        ``after``/``after_condition``: as for :meth:`run`, for every element.

        Raises:
            ValueError: an invalid argument (the message names it), before anything starts.
        """
        from core import arrays
        from core.arrays.native import first_submission, native_after

        scheduler = scheduler or get_default_scheduler_name()
        spec = arrays.make_spec(app, size, params, max_parallel)
        after = arrays.check_after(cast("Runner", self), after, after_condition)
        sched = self._scheduler(scheduler)
        native = sched.native_array(app, sched.resolve_cfg(cfg))
        # (a native array's submit checks its app before anything is queued)
        self._check_driven(arrays.first_element(app, spec), scheduler, cfg, dryrun=not native)
        held = (
            native_after(cast("Runner", self), scheduler, after, after_condition, cfg)
            if native
            else None
        )
        array_id = arrays.create_array(
            app, scheduler, self._name, {**(cfg or {}), **(held or {})}, spec, idempotency_key,
            after, after_condition, native=native, after_native=held is not None,
            submit_first=(
                first_submission(sched, spec.size, bool(idempotency_key), app)
                if native and (held or not after) else None
            ),
        )  # fmt: skip
        handle = make_app_handle(scheduler, self._name, array_id)
        log.info(
            "launched array %s (%d elements, at most %d at once%s)",
            handle,
            spec.size,
            spec.max_parallel,
            f", one {scheduler} array" if native else "",
        )
        return handle

    def _run_after(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Cfg | None,
        after: list[AppHandle],
        condition: str,
        key: str | None,
    ) -> AppHandle:
        from core import arrays
        from core.arrays.native import first_submission, native_after

        after = arrays.check_after(cast("Runner", self), after, condition)
        self._check_driven(app, scheduler, cfg)
        one = arrays.ArraySpec(1, None, 1)
        held = native_after(cast("Runner", self), scheduler, after, condition, cfg)
        first = first_submission(self._scheduler(scheduler), 1, bool(key), app) if held else None
        app_id = arrays.create_array(
            app, scheduler, self._name, {**(cfg or {}), **(held or {})}, one, key, after,
            condition, single=True, native=held is not None, after_native=held is not None,
            submit_first=first,
        )  # fmt: skip
        handle = make_app_handle(scheduler, self._name, app_id)
        log.info("queued %s after %s (%s)", handle, ", ".join(after), condition)
        return handle

    def _check_driven(
        self, app: AppDef, scheduler: str, cfg: Cfg | None, dryrun: bool = True
    ) -> None:
        """Checks what a driver process will submit, before anything starts (``dryrun``: the
        backend's own checks too)."""
        if not self._plain:
            raise ValueError(
                "scheduler: an array's (or a waiting app's) driver makes its schedulers the"
                " default way; this runner was given its own scheduler factories or parameters"
            )
        if dryrun:
            sched = self._scheduler(scheduler)
            sched.submit_dryrun(app, sched.resolve_cfg(cfg))  # (the backend's own checks)

    def retry_failed(self, app_handle: AppHandle) -> list[int]:
        """Runs an array's failed elements again under the same handles (each element's
        ``attempts`` counts it); returns their indices (empty: none failed).

        Raises:
            ValueError: ``app_handle`` is not an array, or the array was cancelled.
        """
        from core import arrays

        adir, index = self._array(app_handle)
        if index is not None:
            raise ValueError(f"app handle: {app_handle} is an element; retry_failed takes an array")
        return arrays.request_retry(adir)

    def results(self, app_handle: AppHandle) -> list[AppResult | None]:
        """Each element's :meth:`result`, by index (None for one that did not start)."""
        status = self.status(app_handle)
        if status is None or status.elements is None:
            raise ValueError(f"app handle: {app_handle} is not an array known here")
        return [self.result(e.handle) if e.handle else None for e in status.elements]

    def _array(self, app_handle: AppHandle) -> tuple[arrays.ArrayDir, int | None]:
        from core import arrays

        p = parse_app_handle(app_handle)
        array_id, index = arrays.split_element_id(p.app_id)
        adir = arrays.open_array(p.scheduler_backend, p.session_name, array_id)
        if adir is None:
            raise ValueError(f"app handle: no array {app_handle} was submitted on this host")
        if index is None and arrays.is_single(adir):
            return adir, 0  # (an app that waited for others: the handle is its one element's)
        return adir, index

    def _array_status(self, app_handle: AppHandle) -> AppStatus | None:
        from core import arrays

        try:
            adir, index = self._array(app_handle)
        except ValueError:
            return None
        if index is None:
            return arrays.array_status(adir)
        return arrays.element_app_status(adir, index, self.status)

    def _element_app(self, app_handle: AppHandle) -> AppHandle:
        """The app an element handle stands for (any other handle unchanged)."""
        if not is_array_id(parse_app_handle(app_handle).app_id):
            return app_handle
        from core import arrays

        adir, index = self._array(app_handle)
        if index is None:
            raise ValueError(
                f"app handle: {app_handle} is an array; name one of its elements, {app_handle}[i]"
            )
        found = arrays.element_handle(adir, index)
        if found is None:
            raise ValueError(f"app handle: element {app_handle} has not started yet")
        return found

    def _describe_array(self, app_handle: AppHandle) -> AppDef | None:
        from core import arrays

        try:
            adir, index = self._array(app_handle)
        except ValueError:
            return None
        found = arrays.element_handle(adir, index) if index is not None else None
        return self.describe(found) if found else arrays.requested_app(adir)
