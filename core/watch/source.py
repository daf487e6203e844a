"""What the watch needs of a runner: :class:`JobSource`.

The watch sits below :mod:`core.runner` (``Runner.wait`` and ``Runner.stream_logs`` are built
on it), so it names what it uses of a runner here instead of importing the class.
:class:`core.runner.Runner` is a ``JobSource``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from core.specs import AppHandle, AppStatus

__all__ = ["JobSource", "LineSource"]


class LineSource(Protocol):
    """Reads the log lines of one replica (see ``Scheduler.log_iter``)."""

    def log_lines(
        self,
        app_handle: AppHandle,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: Any = None,
        until: Any = None,
        should_tail: bool = False,
        streams: Any = None,
    ) -> Iterable[str]: ...


class JobSource(LineSource, Protocol):
    """A runner, as the watch uses it: statuses (one or many), log lines, cancel, result."""

    @property
    def uses_defaults(self) -> bool:
        """Whether any runner made the default way reaches the same apps (the poller then
        asks through one of its own, batched with every other such waiter)."""
        ...

    def sibling(self) -> JobSource:
        """A new runner that reaches the same apps (for another thread to own)."""
        ...

    def close(self) -> None: ...

    def status(self, app_handle: AppHandle) -> AppStatus | None: ...

    def status_many(
        self, app_handles: Iterable[AppHandle]
    ) -> dict[AppHandle, AppStatus | None]: ...

    def notify_changes(
        self, app_handle: AppHandle, callback: Callable[[], None]
    ) -> Callable[[], None] | None: ...

    def replicas(self, app_handle: AppHandle) -> list[tuple[str, int]]: ...

    def cancel(self, app_handle: AppHandle) -> None: ...

    def result(self, app_handle: AppHandle) -> Any: ...
