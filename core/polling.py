"""Waiting on many apps from one process with one status poll loop.

:func:`status_poller` is the process's :class:`StatusPoller`. Whoever waits on an app (an
Airflow trigger, operator or sensor, a Prefect task, ``Runner.wait``) takes a
:class:`StatusWatch` of it; the poller's thread reads the status of every watched app with one
:meth:`~core.runner.Runner.status_many` call per round — one backend call per scheduler and
session, however many waiters — and hands each watch the outcome.

Each app is polled fast just after it is watched (0.05 s, doubling) and then every
``poll_interval`` seconds (the smallest of its watchers), on the ticks of that interval (the
multiples of it on the monotonic clock), so that all apps waited on with one interval share
each round. A transient failure (:mod:`core.transient`) is retried with backoff and
only reaches the watchers as :class:`~core.transient.BackendUnavailable` once it outlasted the
retry budget; any other error reaches them at once. Sync code calls :meth:`StatusWatch.next`,
async code awaits :meth:`StatusWatch.next_async` (no thread per waiter).

Nothing here imports Airflow or Prefect.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.runner import Runner, get_runner
from core.specs import AppHandle, AppStatus
from core.transient import RetryBudget, is_transient, retry_budget

log = logging.getLogger(__name__)

__all__ = ["StatusPoller", "StatusWatch", "Warns", "status_poller"]

#: first delay between two polls of a newly watched app (then doubling to its interval)
FIRST_DELAY = 0.05
#: an app due within this fraction of its current delay joins a round early
COALESCE = 0.1
#: how long the loop thread lingers without watches before it ends
IDLE_EXIT = 5.0


class Warns(Protocol):
    """Any logger (``logging``, a Prefect run logger, Airflow's structlog loggers)."""

    def warning(self, msg: Any, /, *args: Any) -> Any: ...


@dataclass(eq=False)
class StatusWatch:
    """One waiter's view of one app. Use it as a context manager (leaving it unwatches)."""

    poller: StatusPoller
    handle: AppHandle
    poll_interval: float
    #: where this waiter wants to hear of retried failures (e.g. a task's run logger)
    logger: Warns = log
    #: the waiter's own runner, when the app must be polled through it (None: the poller's)
    runner: Runner | None = None
    _taken: int = 0
    _listeners: list[Callable[[], None]] = field(default_factory=list)

    def __enter__(self) -> StatusWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops watching (idempotent)."""
        self.poller.unwatch(self)

    def take(self) -> tuple[bool, AppStatus | None]:
        """``(True, status)`` if a round newer than the last one taken has an answer (status
        None: the scheduler does not know the app), else ``(False, None)``; never blocks.

        Raises:
            BackendUnavailable: the backend kept failing for longer than the retry budget.
            Exception: a status error that is not transient.
        """
        got = self.poller.outcome(self.handle)
        if got is None or got[0] <= self._taken:
            return False, None
        self._taken, outcome = got
        if isinstance(outcome, BaseException):
            raise outcome
        return True, outcome

    def next(self, timeout: float) -> tuple[bool, AppStatus | None]:
        """:meth:`take`, waiting up to ``timeout`` seconds for a new round."""
        self.poller.wait_for_round(self.handle, self._taken, timeout)
        return self.take()

    async def next_async(self, timeout: float) -> tuple[bool, AppStatus | None]:
        """:meth:`next` for async code: waits on the event loop, not in a thread."""
        fresh = self.take()
        if fresh[0]:
            return fresh
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:  # in the poller's thread
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

        self.add_listener(wake)
        try:
            fresh = self.take()  # a round may have come in between
            if not fresh[0]:
                try:
                    await asyncio.wait_for(woken.wait(), timeout)
                except TimeoutError:
                    pass
                fresh = self.take()
        finally:
            self.remove_listener(wake)
        return fresh

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` (in the poller's thread: keep it short) after each new round
        of this app; e.g. to wake an event loop that also does other work while it waits."""
        with self.poller.lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        """Undoes :meth:`add_listener`."""
        with self.poller.lock:
            if callback in self._listeners:
                self._listeners.remove(callback)


@dataclass(eq=False)
class _Polled:
    """The poller's state of one watched app."""

    budget: RetryBudget
    watches: list[StatusWatch] = field(default_factory=list)
    next_at: float = 0.0
    delay: float = FIRST_DELAY
    rounds: int = 0
    outcome: Any = None

    @property
    def interval(self) -> float:
        return min(w.poll_interval for w in self.watches)

    @property
    def runner(self) -> Runner | None:
        """A watcher's own runner (one made for a remote Docker engine), while one watches;
        None: the poller's own."""
        return next((w.runner for w in self.watches if w.runner is not None), None)


class StatusPoller:
    """Polls the status of every watched app in one daemon thread, batched per round.

    Args:
        runner_factory: makes the runner the poll thread uses (one of its own)
        budget: seconds a transient failure is retried before waiters get it (default:
            :func:`core.transient.retry_budget`, read when an app is first watched)
    """

    def __init__(
        self, runner_factory: Callable[[], Runner] = get_runner, budget: float | None = None
    ) -> None:
        self._runner_factory = runner_factory
        self._budget = budget
        self.lock = threading.Condition()
        self._polled: dict[AppHandle, _Polled] = {}
        self._thread: threading.Thread | None = None
        #: rounds made (each one ``status_many`` call), for tests and benchmarks
        self.rounds = 0

    def watch(
        self,
        handle: AppHandle,
        poll_interval: float,
        logger: Warns | None = None,
        runner: Runner | None = None,
    ) -> StatusWatch:
        """Starts watching ``handle`` every ``poll_interval`` seconds (polled at once first).

        ``logger`` hears of failed polls being retried (default: this module's logger).
        ``runner`` is the caller's: unless it :attr:`~core.runner.Runner.uses_defaults` (then the
        poller's own runner asks, batched with every other app), the app is polled through it,
        e.g. one made for a remote Docker engine; the caller keeps it open while it watches.
        """
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: expected a positive number, got {poll_interval!r}")
        theirs = None if runner is None or runner.uses_defaults else runner
        watch = StatusWatch(self, handle, float(poll_interval), logger or log, theirs)
        with self.lock:
            polled = self._polled.get(handle)
            if polled is None:
                seconds = retry_budget() if self._budget is None else self._budget
                budget = RetryBudget(f"status of {handle}", seconds)
                polled = self._polled[handle] = _Polled(budget)
            polled.watches.append(watch)
            polled.next_at = 0.0  # a new waiter wants an answer now
            polled.delay = FIRST_DELAY
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="shipyard-status-poller"
                )
                self._thread.start()
            self.lock.notify_all()
        return watch

    def unwatch(self, watch: StatusWatch) -> None:
        """Stops ``watch`` (:meth:`StatusWatch.close` calls this)."""
        with self.lock:
            polled = self._polled.get(watch.handle)
            if polled is not None and watch in polled.watches:
                polled.watches.remove(watch)
                if not polled.watches:
                    del self._polled[watch.handle]

    def outcome(self, handle: AppHandle) -> tuple[int, Any] | None:
        """``(round number, status or exception)`` of the app's last answered round."""
        with self.lock:
            polled = self._polled.get(handle)
            if polled is None or not polled.rounds:
                return None
            return polled.rounds, polled.outcome

    def wait_for_round(self, handle: AppHandle, after: int, timeout: float) -> None:
        """Blocks until the app has a round later than ``after``, or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                polled = self._polled.get(handle)
                left = deadline - time.monotonic()
                if polled is None or polled.rounds > after or left <= 0:
                    return
                self.lock.wait(left)

    # -- the loop ----------------------------------------------------------------------------

    def _due(self, now: float) -> dict[Runner | None, list[AppHandle]]:
        """The apps to poll now, by the runner to ask (None: the poller's own)."""
        due: dict[Runner | None, list[AppHandle]] = {}
        for handle, polled in self._polled.items():
            if polled.next_at <= now + COALESCE * polled.delay:
                due.setdefault(polled.runner, []).append(handle)
        return due

    def _loop(self) -> None:
        runner: Runner | None = None
        idle_since: float | None = None
        try:
            while True:
                with self.lock:
                    now = time.monotonic()
                    if not self._polled:
                        idle_since = idle_since or now
                        if now - idle_since >= IDLE_EXIT:
                            self._thread = None
                            return
                        self.lock.wait(IDLE_EXIT)
                        continue
                    idle_since = None
                    due = self._due(now)
                    if not due:
                        soonest = min(p.next_at for p in self._polled.values())
                        self.lock.wait(max(0.0, soonest - now))
                        continue
                outcomes: dict[AppHandle, Any] = {}
                for theirs, handles in due.items():
                    if theirs is None:
                        runner = theirs = runner or self._runner_factory()
                    outcomes.update(_poll(theirs, handles))
                self._publish(outcomes)
        except BaseException:  # never leave waiters hanging on a dead loop
            log.exception("the status poll loop failed")
            with self.lock:
                self._thread = None
            raise
        finally:
            if runner is not None:
                runner.close()

    def _publish(self, outcomes: dict[AppHandle, Any]) -> None:
        listeners: list[Callable[[], None]] = []
        with self.lock:
            self.rounds += 1
            now = time.monotonic()
            for handle, outcome in outcomes.items():
                polled = self._polled.get(handle)
                if polled is None:
                    continue  # unwatched meanwhile
                answer = self._settle(polled, handle, outcome, now)
                if answer is not _RETRYING:
                    polled.rounds += 1
                    polled.outcome = answer
                    for watch in polled.watches:
                        listeners.extend(watch._listeners)
            self.lock.notify_all()
        for listener in listeners:
            listener()

    @staticmethod
    def _settle(polled: _Polled, handle: AppHandle, outcome: Any, now: float) -> Any:
        """Schedules the app's next poll and returns what its waiters get: the status, the
        error (not transient, or transient past the budget), or ``_RETRYING``."""
        if not isinstance(outcome, BaseException):
            polled.budget.succeeded()
            interval = polled.interval
            if polled.delay < interval:
                polled.next_at = now + polled.delay
                polled.delay = min(polled.delay * 2, interval)
            else:
                polled.next_at = (now // interval + 1) * interval
            return outcome
        try:
            pause = polled.budget.failed(outcome)
        except BaseException as final:
            polled.budget.succeeded()  # whoever goes on waiting gets a fresh budget
            polled.next_at = now + polled.interval
            return final
        for logger in {id(w.logger): w.logger for w in polled.watches}.values():
            logger.warning(
                "reading the status of %s failed (try %d, again in %.1fs): %s",
                handle,
                polled.budget.failures,
                pause,
                outcome,
            )
        polled.next_at = now + pause
        return _RETRYING


#: what :meth:`StatusPoller._settle` returns while a transient failure is being retried
_RETRYING: Any = object()


def _poll(runner: Runner, handles: list[AppHandle]) -> dict[AppHandle, Any]:
    """Statuses of ``handles`` in one call. A transient failure is every handle's outcome;
    another error is retried handle by handle, so one bad handle fails only its waiters."""
    try:
        return dict(runner.status_many(handles))
    except Exception as e:
        if is_transient(e) or len(handles) == 1:
            return dict.fromkeys(handles, e)
    return {h: _one(runner, h) for h in handles}


def _one(runner: Runner, handle: AppHandle) -> Any:
    try:
        return runner.status(handle)
    except Exception as e:
        return e


_poller: StatusPoller | None = None
_poller_lock = threading.Lock()


def status_poller() -> StatusPoller:
    """The process's shared :class:`StatusPoller` (made on first use)."""
    global _poller
    with _poller_lock:
        if _poller is None:
            _poller = StatusPoller()
        return _poller


def _forget_after_fork() -> None:
    # a forked child (e.g. an Airflow task process) has no poll thread: it starts its own
    global _poller, _poller_lock
    _poller = None
    _poller_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
