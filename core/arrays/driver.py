"""The array driver: a process of its own (``python -m core.arrays DIR``), detached from
whoever submitted the array, that starts the elements as slots free (never more than the cap
running), records every element's state in the array's ``state.json``, honours cancel and retry
requests, and exits when every element has ended. One driver per array: it holds the array's
``driver.lock``; a second one exits at once. If it dies, the next status read starts another,
which re-attaches to the elements already submitted (each element attempt has its own
idempotency key, claimed by the backend).

SIGTERM to the driver cancels the array.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from core.arrays.native import submit_native, take_natives
from core.arrays.spec import ArraySpec, element_app
from core.arrays.store import ArrayDir
from core.specs import AppState, AppStatus, ElementStatus, Reason, is_terminal, make_app_handle

if TYPE_CHECKING:
    from core.watch.polling import StatusWatch

log = logging.getLogger(__name__)

__all__ = ["cancel_targets", "dependency_verdict", "element_key", "ensure_driver", "main"]

_POLL = 0.2  # most seconds between two status reads of a running element (or a dependency)
_LOOK = 0.5  # most seconds between two looks at the requests (cancel, retry)
_ERROR_BACKOFF = (0.5, 5.0)  # first and longest wait after a failed look


def dependency_verdict(
    after: list[str], statuses: dict[str, AppStatus | None], condition: str
) -> tuple[bool | None, str]:
    """Whether apps waiting for ``after`` may start (True), never will (False), or must wait
    (None), and why (naming the dependency)."""
    for h in after:
        s = statuses.get(h)
        if s is None:
            return False, f"dependency {h} is unknown (after_condition {condition})"
        if condition == "ok" and s.state in (AppState.FAILED, AppState.CANCELLED):
            return False, f"dependency {h} ended {s.state.name} (after_condition ok)"
        if condition == "notok" and s.state == AppState.SUCCEEDED:
            return False, f"dependency {h} ended SUCCEEDED (after_condition notok)"
    waiting = [h for h in after if not is_terminal(statuses[h].state)]  # type: ignore[union-attr]
    if waiting:
        return None, f"waiting for {', '.join(waiting)} (after_condition {condition})"
    return True, ""


def element_key(array_id: str, index: int, attempt: int) -> str:
    """The idempotency key of one attempt of one element."""
    base = f"{array_id}[{index}]"
    return base if attempt <= 1 else f"{base}:{attempt}"


def _exit_code(status: AppStatus) -> int | None:
    codes = [c for rs in status.roles for r in rs.replicas for c in [r.exit_code]]
    if not is_terminal(status.state):
        return None
    failed = [c for c in codes if c not in (None, 0)]
    return failed[0] if failed else (0 if status.state == AppState.SUCCEEDED else None)


class Statuses:
    """The statuses of the apps a driver waits on (running elements, dependencies), read by
    the process's shared status poller (:mod:`core.watch.polling`: one ``status_many`` per
    round, transient failures retried for as long as it takes); each new round sets ``wake``."""

    def __init__(self, runner: Any, wake: threading.Event) -> None:
        self.runner, self.wake = runner, wake
        self.watches: dict[str, StatusWatch] = {}
        self.latest: dict[str, AppStatus | None] = {}

    def follow(self, handles: list[str]) -> None:
        """Watches each of ``handles`` not watched yet: it is polled at once, and each of its
        rounds sets ``wake``."""
        from core.watch.polling import status_poller  # (the driver's process only)

        for h in handles:
            if h not in self.watches:
                w = status_poller().watch(h, self.runner, _POLL, first_delay=0.02, budget=math.inf)
                w.add_listener(self.wake.set)
                self.watches[h] = w

    def read(self, handles: list[str]) -> dict[str, AppStatus | None]:
        """The newest status of each of ``handles`` polled at least once (None: unknown)."""
        self.follow(handles)
        for h in handles:
            fresh, status = self.watches[h].take()
            if fresh:
                self.latest[h] = status
        return {h: self.latest[h] for h in handles if h in self.latest}

    def forget(self, handle: str) -> None:
        """Stops watching ``handle`` (it ended)."""
        w = self.watches.pop(handle, None)
        if w is not None:
            w.close()
        self.latest.pop(handle, None)

    def close(self) -> None:
        """Stops every watch."""
        for h in list(self.watches):
            self.forget(h)


class Driver:
    """Drives one array to its end (see the module's docstring)."""

    def __init__(self, adir: ArrayDir) -> None:
        from core.runner import Runner  # (the runner imports this package's public API)

        request = adir.request()
        if request is None:
            raise ValueError(f"no array at {adir.path}")
        self.adir = adir
        self.spec = ArraySpec.from_json(request["spec"])
        self.request = request
        self.runner = Runner(adir.session)
        self.wake = threading.Event()
        self.statuses = Statuses(self.runner, self.wake)
        self.cancel_sent = False
        self.written = False
        self.gate_open = False
        #: the array runs as the backend's own arrays (see :mod:`core.arrays.native`)
        self.native = bool(request.get("native"))
        state = adir.state()
        self.natives_seen = int(state.get("natives", 0)) if state else 0
        self.elements = (
            [ElementStatus.from_json(e) for e in state["elements"]]
            if state
            else [ElementStatus(i, AppState.PENDING) for i in range(self.spec.size)]
        )

    def run(self) -> None:
        """Looks and acts until every element ended: at each new status round, and at least
        every ``_LOOK`` seconds (for cancel and retry requests)."""
        backoff = _ERROR_BACKOFF[0]
        try:
            while not self.done():
                try:
                    self.wake.clear()
                    self.step()
                    backoff = _ERROR_BACKOFF[0]
                    self.wake.wait(_LOOK)
                except Exception as e:  # a submit that failed, SIGTERM raised into local
                    log.warning("array %s: %s (again in %.1fs)", self.adir.array_id, e, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, _ERROR_BACKOFF[1])
        finally:
            self.statuses.close()
        log.info("array %s ended: %s", self.adir.array_id, self.summary())

    def step(self) -> bool:
        """One look: retries taken, states refreshed, cancels sent, free slots filled; the
        state written if anything changed. Returns whether anything did."""
        before = [e.to_json() for e in self.elements]
        if self.native:  # (queued already by whoever submitted them: followed, and cancelled)
            self.natives_seen = take_natives(self.adir, self.elements, self.natives_seen)
        retries = self.adir.retry_requests()
        for _, indices in retries:
            self._retry(indices)
        self._refresh()
        if self.adir.cancel_requested():
            self._cancel()
        elif self._gate_open():
            self._fill_slots()
        # what this look started is watched now, not at the next look: its end wakes the driver
        # (else a cap's worth started together could wait out _LOOK every time)
        self.statuses.follow([e.handle for e in self._live() if e.handle])
        changed = before != [e.to_json() for e in self.elements]
        if changed or not self.written:
            self.write()
        self.adir.drop([path for path, _ in retries])  # (recorded: a reader never misses them)
        return changed

    def _retry(self, indices: list[int]) -> None:
        for i in indices:
            e = self.elements[i]
            if e.state == AppState.FAILED:
                log.info("array %s: element %d runs again", self.adir.array_id, i)
                self.elements[i] = ElementStatus(i, AppState.PENDING, attempts=e.attempts)

    def _gate_open(self) -> bool:
        """Whether the dependencies (``after``) let the elements start; when they never will,
        the waiting elements are CANCELLED with a message naming the dependency."""
        after: list[str] = self.request.get("after") or []
        if self.gate_open or not after or all(e.handle for e in self.elements):
            return True
        if self.request.get("after_native"):
            return True  # (the backend holds the elements: see _dependency_ended)
        statuses = self.statuses.read(after)
        if len(statuses) < len(after):
            return False  # (not all polled yet)
        verdict, why = dependency_verdict(after, statuses, self.request.get("condition", "ok"))
        if verdict is not None:
            for h in after:
                self.statuses.forget(h)
        if verdict is None:
            for e in self.elements:
                if e.handle is None and e.state == AppState.PENDING:
                    e.msg = why
            return False
        if not verdict:
            for e in self.elements:
                if e.handle is None and not is_terminal(e.state):
                    e.state, e.msg, e.reason = AppState.CANCELLED, why, Reason.DEPENDENCY
            return False
        self.gate_open = True
        return True

    def _dependency_ended(self) -> str | None:
        """Why the backend ended an element it held for ``after``, naming the dependency (None
        while no dependency reads as ended so: its record may lag the backend's)."""
        after: list[str] = self.request.get("after") or []
        statuses = self.runner.status_many(after)
        verdict, why = dependency_verdict(after, statuses, self.request.get("condition", "ok"))
        return why if verdict is False else None

    def _live(self) -> list[ElementStatus]:
        return [e for e in self.elements if e.handle and not is_terminal(e.state)]

    def _refresh(self) -> None:
        live = self._live()
        statuses = self.statuses.read([e.handle for e in live if e.handle])
        for e in live:
            if e.handle not in statuses:
                continue  # (not polled yet)
            s = statuses[e.handle]
            if s is None:
                e.state, e.msg = AppState.FAILED, f"{e.handle} is no longer known to its scheduler"
            else:
                e.state, e.msg, e.exit_code, e.reason = s.state, s.msg, _exit_code(s), s.reason
            if e.reason == Reason.DEPENDENCY and self.request.get("after_native"):
                why = self._dependency_ended()
                if why is None:  # (look again: the dependency's own record is behind)
                    e.state, e.reason = AppState.PENDING, None
                    continue
                e.msg = why
            if is_terminal(e.state):
                self.statuses.forget(e.handle)

    def _fill_slots(self) -> None:
        if self.native:
            self._start_native()
            return
        free = self.spec.max_parallel - len(self._live())
        for e in self.elements:
            if free <= 0:
                return
            if e.handle is None and e.state == AppState.PENDING:
                self._start(e)
                free -= 1

    def _start(self, e: ElementStatus) -> None:
        req = self.request
        array_handle = make_app_handle(self.adir.backend, self.adir.session, self.adir.array_id)
        app = _app(req["app"])
        if not req.get("single"):  # (an app that waited for others is no array element)
            app = element_app(app, self.spec, e.index, array_handle)
        key = element_key(self.adir.array_id, e.index, e.attempts + 1)
        try:
            e.handle = self.runner.run(app, self.adir.backend, req["cfg"], idempotency_key=key)
            e.state = AppState.SUBMITTED
        except ValueError as err:  # the backend refused this element: it failed, the rest go on
            e.state, e.msg = AppState.FAILED, f"submit failed: {err}"
        e.attempts += 1

    def _start_native(self) -> None:
        """Submits the elements waiting to start as one native array, once none runs (so the
        backend's cap covers them all)."""
        pending = [e for e in self.elements if e.handle is None and e.state == AppState.PENDING]
        if not pending or self._live():
            return
        sched = self.runner.scheduler(self.adir.backend)
        try:
            submit_native(self.adir, sched, self.natives_seen + 1, [e.index for e in pending])
        except ValueError as err:  # the backend refused it: those elements failed
            for e in pending:
                e.state, e.msg = AppState.FAILED, f"submit failed: {err}"
                e.attempts += 1
            return
        self.natives_seen = take_natives(self.adir, self.elements, self.natives_seen)

    def _cancel(self) -> None:
        for e in self.elements:
            if e.handle is None and not is_terminal(e.state):
                e.state, e.msg = AppState.CANCELLED, "the array was cancelled"
                e.reason = Reason.CANCELLED
        if not self.cancel_sent:
            for handle in cancel_targets(self.adir, self.elements):
                self.runner.cancel(handle)
            self.cancel_sent = True

    def done(self) -> bool:
        """Whether every element ended and nothing asks for more."""
        ended = all(is_terminal(e.state) for e in self.elements)
        return ended and not self.adir.retries_pending()

    def summary(self) -> str:
        """``3 SUCCEEDED, 1 FAILED``"""
        counts: dict[str, int] = {}
        for e in self.elements:
            counts[e.state.name] = counts.get(e.state.name, 0) + 1
        return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

    def write(self) -> None:
        """Writes every element's state (the array's state.json)."""
        self.adir.write_state(
            {
                "elements": [e.to_json() for e in self.elements],
                "pid": os.getpid(),
                "natives": self.natives_seen,
            }
        )
        self.written = True


def cancel_targets(adir: ArrayDir, elements: list[ElementStatus]) -> list[str]:
    """What to cancel so that none of ``elements`` runs on: each live element, or for a native
    array each of its backend arrays that still has a live element (one call for all)."""
    live = {e.handle for e in elements if e.handle and not is_terminal(e.state)}
    request = adir.request() or {}
    if not request.get("native"):
        return sorted(live)
    targets = []
    for record in adir.natives():
        handles = {make_app_handle(adir.backend, adir.session, a) for _, a in record["elements"]}
        if handles & live:
            targets.append(make_app_handle(adir.backend, adir.session, record["array"]))
    return targets


def _app(data: dict[str, Any]) -> Any:
    from core.appfile import app_from_dict

    return app_from_dict(data)


def ensure_driver(adir: ArrayDir) -> None:
    """Starts the array's driver unless one runs (it outlives this process). The lock is taken
    here and handed down: no second driver can start while the first one starts up."""
    import subprocess  # (lazily: the runner imports this module, and `shipyard run` starts)

    with adir.driver_lock() as lock:
        if lock is None:
            return  # one runs
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        request = adir.request() or {}
        with open(adir.log_path, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "core.arrays", adir.path, str(lock)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=request.get("cwd"),
                pass_fds=(lock,),
            )
    # reaped here when it ends (it usually outlives this process, then init reaps it)
    threading.Thread(target=proc.wait, name="shipyard-array-driver-reaper", daemon=True).start()


def _on_sigterm(adir: ArrayDir) -> None:
    def handle(signum: int, frame: object) -> None:
        adir.request_cancel()

    signal.signal(signal.SIGTERM, handle)


def main(argv: list[str] | None = None) -> int:
    """``python -m core.arrays <array dir>``"""
    args = sys.argv[1:] if argv is None else argv
    path = os.path.abspath(args[0])
    backend, session, array_id = path.split(os.sep)[-3:]
    from urllib.parse import unquote

    session = "" if session == "%" else unquote(session)
    adir = ArrayDir(backend, session, array_id)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if len(args) > 1:  # the lock its starter took for it (see ensure_driver)
        os.set_inheritable(int(args[1]), False)  # (what it starts must not hold it)
        _drive(adir)
        return 0
    with adir.driver_lock() as lock:
        if lock is not None:
            _drive(adir)
    return 0


def _drive(adir: ArrayDir) -> None:
    _on_sigterm(adir)
    driver = Driver(adir)
    driver.run()
    driver.write()
