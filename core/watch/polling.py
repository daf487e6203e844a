"""Polling the status of every watched app of a process in one thread, batched per round.

:func:`status_poller` is the process's :class:`StatusPoller`. Every :class:`~core.watch.JobWatch`
(``Runner.wait``, the CLI, the Airflow operator and trigger, the Prefect tasks and worker) takes a
:class:`StatusWatch` of its app; the poller's thread reads the status of every watched app with one
``status_many`` call per round — one backend call per scheduler and session, however many
waiters — and wakes each watch with the outcome.

Each app is polled soon after it is watched (``first_delay``, doubling) and then every
``poll_interval`` seconds (the smallest of its watchers), on the ticks of that interval (the
multiples of it on the monotonic clock), so that all apps waited on with one interval share each
round. A transient failure (:mod:`core.transient`) is retried with backoff for as long as anyone
watches; each watch gives up on its own budget (:class:`~core.errors.BackendUnavailableError`
once failures outlasted it). Any other error reaches the watchers at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import BackendUnavailableError
from core.specs import AppHandle, AppStatus
from core.transient import backoff, is_transient, retry_budget
from core.watch.source import JobSource

log = logging.getLogger(__name__)

__all__ = ["FIRST_DELAY", "Logger", "OwnWatch", "StatusPoller", "StatusWatch", "status_poller"]

#: first delay between two polls of a newly watched app (then doubling to its interval)
FIRST_DELAY = 0.05
#: an app due within this fraction of its current delay joins a round early
COALESCE = 0.1
#: how long the loop thread lingers without watches before it ends
IDLE_EXIT = 5.0


class Logger(Protocol):
    """Any logger (``logging``, a Prefect run logger, Airflow's structlog loggers)."""

    def info(self, msg: Any, /, *args: Any) -> Any: ...

    def warning(self, msg: Any, /, *args: Any) -> Any: ...


@dataclass(frozen=True)
class _Failing:
    """A round whose poll failed: the error, and since when (monotonic) polls have failed."""

    error: BaseException
    since: float
    tries: int


@dataclass(eq=False)
class StatusWatch:
    """One waiter's view of one app. Use it as a context manager (leaving it unwatches)."""

    poller: StatusPoller
    handle: AppHandle
    poll_interval: float
    #: seconds of transient failures after which :meth:`take` raises
    budget: float
    #: where this waiter wants to hear of retried failures (e.g. a task's run logger)
    logger: Logger = log
    #: the waiter's own runner, when the app must be polled through it (None: the poller's)
    runner: JobSource | None = None
    first_delay: float = FIRST_DELAY
    #: when the watch started (failures before it do not count against its budget)
    started: float = field(default_factory=time.monotonic)
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
        """``(True, status)`` if a round newer than the last one taken has a status (None: the
        scheduler does not know the app), else ``(False, None)``; never blocks.

        Raises:
            BackendUnavailableError: polls kept failing transiently for longer than ``budget``.
            Exception: a status error that is not transient.
        """
        got = self.poller.outcome(self.handle)
        if got is None or got[0] <= self._taken:
            return False, None
        self._taken, outcome = got
        return _answer(self.handle, outcome, self.started, self.budget)

    def due_in(self) -> float | None:
        """Seconds until the watch must poll itself: never (None), the poller does."""
        return None

    def wait(self, timeout: float) -> None:
        """Blocks until a round newer than the last one taken came, or ``timeout`` passed."""
        self.poller.wait_for_round(self.handle, self._taken, timeout)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` (in the poller's thread: keep it short) after each new round
        of this app, e.g. to wake a thread or an event loop that waits for other things too.
        It may still be called just after the watch is closed; an exception it raises is
        logged, and the polls go on."""
        with self.poller.lock:
            self._listeners.append(callback)


@dataclass(eq=False)
class _Polled:
    """The poller's state of one watched app."""

    watches: list[StatusWatch] = field(default_factory=list)
    next_at: float = 0.0
    delay: float = FIRST_DELAY
    rounds: int = 0
    outcome: Any = None
    failing_since: float | None = None
    failures: int = 0

    @property
    def interval(self) -> float:
        return min(w.poll_interval for w in self.watches)

    @property
    def runner(self) -> JobSource | None:
        """A watcher's own runner, while one watches; None: the poller's own."""
        return next((w.runner for w in self.watches if w.runner is not None), None)


class StatusPoller:
    """Polls the status of every watched app in one daemon thread, batched per round.

    Args:
        runner_factory: makes the runner the poll thread asks through for the waiters whose
            runners :attr:`~core.watch.source.JobSource.uses_defaults` (default: a sibling of
            the first such waiter's runner)
    """

    def __init__(self, runner_factory: Callable[[], JobSource] | None = None) -> None:
        self._runner_factory = runner_factory
        self.lock = threading.Condition()
        self._polled: dict[AppHandle, _Polled] = {}
        self._thread: threading.Thread | None = None
        #: rounds made (each one ``status_many`` call), for tests and benchmarks
        self.rounds = 0

    def watch(
        self,
        handle: AppHandle,
        runner: JobSource,
        poll_interval: float,
        *,
        logger: Logger | None = None,
        first_delay: float = FIRST_DELAY,
        budget: float | None = None,
    ) -> StatusWatch:
        """Starts watching ``handle`` every ``poll_interval`` seconds (polled at once first,
        then after ``first_delay``, doubling).

        ``logger`` hears of failed polls being retried (default: this module's logger);
        ``budget`` is how many seconds of such failures the watch takes before it raises
        (default: :func:`core.transient.retry_budget`). ``runner`` is the caller's: when it
        :attr:`~core.watch.source.JobSource.uses_defaults`, the poller's own runner asks,
        batched with every other app; otherwise the app is polled through it (e.g. a runner
        made for a remote Docker engine), and the caller keeps it open while it watches.
        """
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: expected a positive number, got {poll_interval!r}")
        theirs: JobSource | None = runner
        if runner.uses_defaults:
            theirs = None
            if self._runner_factory is None:
                self._runner_factory = runner.sibling
        budget = retry_budget() if budget is None else budget
        w = StatusWatch(self, handle, float(poll_interval), budget, logger or log, theirs)
        w.first_delay = min(first_delay, w.poll_interval)
        with self.lock:
            polled = self._polled.setdefault(handle, _Polled())
            polled.watches.append(w)
            polled.next_at = 0.0  # a new waiter wants an answer now
            polled.delay = w.first_delay
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="shipyard-status-poller"
                )
                self._thread.start()
            self.lock.notify_all()
        return w

    def unwatch(self, watch: StatusWatch) -> None:
        """Stops ``watch`` (:meth:`StatusWatch.close` calls this)."""
        with self.lock:
            polled = self._polled.get(watch.handle)
            if polled is not None and watch in polled.watches:
                polled.watches.remove(watch)
                if not polled.watches:
                    del self._polled[watch.handle]

    def outcome(self, handle: AppHandle) -> tuple[int, Any] | None:
        """``(round number, status or failure)`` of the app's last round."""
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

    def _due(self, now: float) -> dict[JobSource | None, list[AppHandle]]:
        """The apps to poll now, by the runner to ask (None: the poller's own)."""
        due: dict[JobSource | None, list[AppHandle]] = {}
        for handle, polled in self._polled.items():
            if polled.next_at <= now + COALESCE * polled.delay:
                due.setdefault(polled.runner, []).append(handle)
        return due

    def _loop(self) -> None:
        own: JobSource | None = None
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
                        if own is None:
                            assert self._runner_factory is not None
                            own = self._runner_factory()
                        theirs = own
                    outcomes.update(_poll(theirs, handles))
                self._publish(outcomes)
        except BaseException:  # never leave waiters hanging on a dead loop
            log.exception("the status poll loop failed")
            with self.lock:
                self._thread = None
            raise
        finally:
            if own is not None:
                own.close()

    def _publish(self, outcomes: dict[AppHandle, Any]) -> None:
        listeners: list[Callable[[], None]] = []
        with self.lock:
            self.rounds += 1
            now = time.monotonic()
            for handle, outcome in outcomes.items():
                polled = self._polled.get(handle)
                if polled is None:
                    continue  # unwatched meanwhile
                polled.rounds += 1
                polled.outcome = _settle(polled, handle, outcome, now)
                for w in polled.watches:
                    listeners.extend(w._listeners)
            self.lock.notify_all()
        for listener in listeners:
            try:
                listener()
            except Exception:  # (one waiter's listener must not stop every app's polls)
                log.exception("a status listener failed")


def _settle(polled: _Polled, handle: AppHandle, outcome: Any, now: float) -> Any:
    """Schedules the app's next poll; returns what its watchers get: the status, or a
    :class:`_Failing` (a transient one is retried with backoff)."""
    if not isinstance(outcome, BaseException):
        polled.failing_since, polled.failures = None, 0
        interval = polled.interval
        if polled.delay < interval:
            polled.next_at = now + polled.delay
            polled.delay = min(polled.delay * 2, interval)
        else:
            polled.next_at = (now // interval + 1) * interval
        return outcome
    if polled.failing_since is None:
        polled.failing_since = now
    polled.failures += 1
    pause = backoff(polled.failures) if is_transient(outcome) else polled.interval
    polled.next_at = now + pause
    if is_transient(outcome):
        for logger in {id(w.logger): w.logger for w in polled.watches}.values():
            logger.warning(
                "reading the status of %s failed (try %d, again in %.1fs): %s",
                handle,
                polled.failures,
                pause,
                outcome,
            )
    return _Failing(outcome, polled.failing_since, polled.failures)


def _answer(
    handle: AppHandle, outcome: Any, started: float, budget: float
) -> tuple[bool, AppStatus | None]:
    """What a watch that started at ``started`` makes of a round's ``outcome``: ``(True, status)``,
    or ``(False, None)`` for a transient failure within its ``budget``; raises past it, or for
    any other error."""
    if not isinstance(outcome, _Failing):
        return True, outcome
    if not is_transient(outcome.error):
        raise outcome.error
    failing_for = time.monotonic() - max(outcome.since, started)
    if failing_for >= budget:
        raise BackendUnavailableError(
            f"status of {handle}: the backend kept failing for {failing_for:.0f}s"
            f" ({outcome.tries} tries): {outcome.error}"
        ) from outcome.error
    return False, None


class OwnWatch:
    """A watch that polls its app itself, through its waiter's runner, when the waiter asks
    (:meth:`due_in`, :meth:`poll`): no thread and no hand-off, for a waiter alone with its app
    (``Runner.wait``, the CLI). Same schedule, retries and budget as the poller's watches; and
    a poll at once when the scheduler tells that the app may have changed (a local app of this
    process: one of its replicas ended). The shared poller keeps to its rounds, one call for
    all its apps."""

    def __init__(
        self,
        handle: AppHandle,
        runner: JobSource,
        poll_interval: float,
        *,
        logger: Logger | None = None,
        first_delay: float = FIRST_DELAY,
        budget: float | None = None,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: expected a positive number, got {poll_interval!r}")
        self.handle, self.runner = handle, runner
        self.poll_interval = float(poll_interval)
        self.logger = logger or log
        self.budget = retry_budget() if budget is None else budget
        self.started = time.monotonic()
        self._polled = _Polled(watches=[self])  # type: ignore[list-item]
        self._polled.delay = min(first_delay, self.poll_interval)
        self._taken = 0
        #: set (from the scheduler's thread) when the app may have changed: poll now
        self._changed = False
        self._stop_notices: Callable[[], None] | None = None

    def due_in(self) -> float:
        """Seconds until the next poll is due (0 or less: now)."""
        if self._changed:
            return 0.0
        return self._polled.next_at - time.monotonic()

    def poll(self) -> None:
        """Reads the app's status now (a blocking call to the backend)."""
        self._changed = False  # (before the read: a change during it is polled again)
        outcome = _one(self.runner, self.handle)
        polled = self._polled
        polled.rounds += 1
        polled.outcome = _settle(polled, self.handle, outcome, time.monotonic())

    def take(self) -> tuple[bool, AppStatus | None]:
        """As :meth:`StatusWatch.take`."""
        polled = self._polled
        if polled.rounds <= self._taken:
            return False, None
        self._taken = polled.rounds
        return _answer(self.handle, polled.outcome, self.started, self.budget)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` (from the scheduler's thread) when the scheduler tells that the
        app may have changed (``notify_changes``; one listener): the waiter, woken, finds a
        poll due at once. Without such notices the waiter only polls on its schedule."""
        if self._stop_notices is not None:
            raise RuntimeError("OwnWatch: a listener was already added")

        def changed() -> None:
            self._changed = True
            callback()

        try:
            self._stop_notices = self.runner.notify_changes(self.handle, changed)
        except Exception as e:  # (the polls say what is wrong with the handle)
            log.debug("no change notices for %s: %s", self.handle, e)

    def close(self) -> None:
        """Stops the scheduler's notices (idempotent)."""
        stop, self._stop_notices = self._stop_notices, None
        if stop is not None:
            stop()


def _poll(runner: JobSource, handles: list[AppHandle]) -> dict[AppHandle, Any]:
    """Statuses of ``handles`` in one call. A transient failure is every handle's outcome;
    another error is retried handle by handle, so one bad handle fails only its waiters."""
    try:
        return dict(runner.status_many(handles))
    except Exception as e:
        if is_transient(e) or len(handles) == 1:
            return dict.fromkeys(handles, e)
    return {h: _one(runner, h) for h in handles}


def _one(runner: JobSource, handle: AppHandle) -> Any:
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
