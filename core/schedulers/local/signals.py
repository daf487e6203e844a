"""Orphan clean-up: a :class:`LocalScheduler` created in the main thread terminates the apps its
process launched when the process gets SIGTERM or SIGINT, then raises
:class:`SignalException` (what the specification asks; one small registry per process)."""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from types import FrameType
from typing import Any, Protocol

from core.errors import ShipyardError

log = logging.getLogger(__name__)

__all__ = ["HANDLERS", "SignalException"]


class SignalException(ShipyardError):
    """Raised when the process that created a ``LocalScheduler`` gets SIGTERM or SIGINT
    (after the apps it launched were terminated)."""

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval


class _Terminable(Protocol):
    def terminate_launched(self) -> None: ...


class SignalHandlers:
    """SIGTERM/SIGINT handlers shared by the schedulers created in the main thread."""

    def __init__(self) -> None:
        self._schedulers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._previous: dict[int, Any] = {}
        self._handling = False

    def register(self, sched: _Terminable) -> None:
        """Installs the handlers (main thread only; an ignored signal stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._schedulers.add(sched)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                current = signal.getsignal(sig)
                if current == self._handle or current is signal.SIG_IGN:
                    continue  # (installed already, or deliberately ignored: e.g. nohup)
                signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not the main interpreter
                continue
            self._previous[sig] = current

    def unregister(self, sched: _Terminable) -> None:
        """Removes ``sched``; the last one out restores the previous handlers."""
        self._schedulers.discard(sched)
        if len(self._schedulers) or threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in list(self._previous.items()):
            try:
                if signal.getsignal(sig) == self._handle:
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
                del self._previous[sig]
            except (ValueError, OSError):
                pass

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self._handling:  # a chained handler called back into us (or a second signal)
            raise SignalException(f"terminating on {sig.name}", sig)
        self._handling = True
        try:
            log.info("received %s: terminating the local apps launched by this process", sig.name)
            for sched in list(self._schedulers):
                sched.terminate_launched()
            previous = self._previous.get(signum)
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signum, frame)
        finally:
            self._handling = False
        raise SignalException(f"terminating on {sig.name}", sig)


HANDLERS = SignalHandlers()
