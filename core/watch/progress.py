"""What ``shipyard run --wait`` shows while it waits: replica states as they change (the watch
hands it each status it reads).

On a terminal, one live status line that is redrawn in place (``RUNNING 12s  trainer: 2
RUNNING  ps: 1 SUCCEEDED``); otherwise (a pipe, a file, a CI log) one plain line per change
(``[  1.2s] trainer/0 RUNNING on node1``), so logs stay readable.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from core.watch.attempts import attempt_line

if TYPE_CHECKING:
    from core.specs import AppStatus, ReplicaStatus

log = logging.getLogger(__name__)

__all__ = ["Progress", "is_live_terminal"]

#: erase from the cursor to the end of the line (ANSI)
_CLEAR_EOL = "\x1b[K"


def is_live_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that can redraw a line (not ``TERM=dumb``)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def _replica_text(r: ReplicaStatus) -> str:
    text = r.state.name
    if r.exit_code is not None:
        text += f" (exit {r.exit_code})"
    if r.hostname:
        text += f" on {r.hostname}"
    return text


def _counts_text(status: AppStatus) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(status.counts().items()))


class Progress:
    """Shows an app's progress on ``stream``: a live line if ``live`` (default: when ``stream``
    is a terminal, see :func:`is_live_terminal`), else a plain line per change.

    Feed it each status read with :meth:`update`; :meth:`close` ends a live line.
    """

    def __init__(
        self,
        stream: TextIO,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.live = is_live_terminal(stream) if live is None else live
        self._clock = clock
        self._start = clock()
        self._app_state: str | None = None
        self._replicas: dict[tuple[str, int], str] = {}
        self._drawn_text: str | None = None
        self._attempts_told = 0

    def update(self, status: AppStatus) -> None:
        """Shows what changed since the last status (a live line: redraws it), and each
        requeue on a line of its own."""
        requeues = [attempt_line(a) for a in status.attempts[self._attempts_told :]]
        self._attempts_told = max(self._attempts_told, len(status.attempts))
        if requeues:
            self.close()
            stamp = "" if self.live else f"[{self._elapsed():6.1f}s] "
            self.stream.write("".join(f"{stamp}{line}\n" for line in requeues))
        if self.live:
            self._draw(status)
        else:
            self._print_changes(status)

    def close(self) -> None:
        """Clears the live line (the final status is printed after it)."""
        if self._drawn_text is not None:
            self.stream.write("\r" + _CLEAR_EOL)
            self.stream.flush()
            self._drawn_text = None

    def _elapsed(self) -> float:
        return self._clock() - self._start

    def _print_changes(self, status: AppStatus) -> None:
        stamp = f"[{self._elapsed():6.1f}s]"
        lines = []
        if status.state.name != self._app_state:
            self._app_state = status.state.name
            lines.append(f"{stamp} app {status.state.name}")
        for rs in status.roles:
            for r in rs.replicas:
                text = _replica_text(r)
                if self._replicas.get((rs.role, r.id)) != text:
                    self._replicas[(rs.role, r.id)] = text
                    lines.append(f"{stamp} {rs.role}/{r.id} {text}")
        if status.elements is not None:  # an array: its counts
            text = _counts_text(status)
            if self._replicas.get(("elements", 0)) != text:
                self._replicas[("elements", 0)] = text
                lines.append(f"{stamp} elements: {text}")
        if lines:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()

    def line(self, status: AppStatus) -> str:
        """The live line for ``status``: the app's state, the time waited, and per role how
        many replicas are in each state."""
        parts = [f"{status.state.name} {self._elapsed():.0f}s"]
        for rs in status.roles:
            counts = Counter(r.state.name for r in rs.replicas)
            states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            parts.append(f"{rs.role}: {states or 'no replicas yet'}")
        if status.elements is not None:
            parts.append(f"elements: {_counts_text(status)}")
        return "  ".join(parts)

    def _draw(self, status: AppStatus) -> None:
        width = shutil.get_terminal_size((80, 24)).columns
        text = self.line(status)
        if len(text) >= width:  # a wrapped line could not be redrawn in place
            text = text[: max(width - 4, 1)] + "..."
        if text == self._drawn_text:
            return
        self.stream.write("\r" + text + _CLEAR_EOL)
        self.stream.flush()
        self._drawn_text = text
