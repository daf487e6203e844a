"""What the ``shipyard`` commands print on stdout: text for a person, or JSON with ``--json``.

JSON output, one object per line (JSON lines where a command prints several):

* ``run``: ``{"app_handle": ...}`` at once; with ``--wait`` (or ``--log``, ``--max-silence``)
  one object once the app ended instead: the handle, its status as ``status --json`` prints
  it (``state``, ``roles`` ...), ``result`` and ``over_requests``. With ``--log`` each log line
  comes first as its own object, as ``log --json`` prints it.
* ``run --dryrun``: ``{"scheduler", "request"}`` (the request as text).
* ``run --check``: ``{"scheduler", "errors", "problems": [{"severity", "field", "message"}]}``.
* ``log``: ``{"app_handle", "role", "replica", "line"}`` per line (``element`` too for an
  array's element).
* ``cancel``: ``{"app_handle", "cancelled": true, "state"}`` (``state``: with ``--wait``, the
  state it ended in, else null).
* ``runopts``: ``{scheduler: [{"name", "type", "default", "help", "required"}]}``.

``status --json`` and ``list --json`` keep their own shapes (in :mod:`core.cli`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from core.options import runopts
    from core.reports import AppResult, Problem
    from core.specs import AppStatus

__all__ = ["Output", "problems_json", "runopts_json"]


def runopts_json(opts: Mapping[str, runopts]) -> dict[str, list[dict[str, Any]]]:
    """The run options of each scheduler: ``name``, ``type``, ``default``, ``help``,
    ``required``, in the order the scheduler declares them."""
    return {
        scheduler: [
            {
                "name": name,
                "type": opt.type_name,
                "default": opt.default,
                "help": opt.help,
                "required": opt.is_required,
            }
            for name, opt in o
        ]
        for scheduler, o in opts.items()
    }


def problems_json(scheduler: str, problems: Iterable[Problem]) -> dict[str, Any]:
    """``run --check``'s findings: every problem (and ``info`` entry) and how many errors."""
    found = list(problems)
    return {
        "scheduler": scheduler,
        "errors": sum(p.is_error for p in found),
        "problems": [
            {"severity": p.severity, "field": p.field, "message": p.message} for p in found
        ],
    }


class Output:
    """Prints what a command found, as text or (``as_json``) as JSON objects, one a line;
    each line flushed unless ``flush`` is False (then the caller flushes :attr:`stream`: a
    long log is written in large chunks)."""

    def __init__(
        self, as_json: bool = False, stream: TextIO | None = None, flush: bool = True
    ) -> None:
        self.as_json = as_json
        self._stream = stream
        self._flush = flush

    @property
    def stream(self) -> TextIO:
        """Where it prints (stdout unless given another)."""
        return self._stream if self._stream is not None else sys.stdout

    def object(self, obj: Any) -> None:
        """One JSON object on its own line (flushed: a reader may be waiting for it)."""
        self.stream.write(json.dumps(obj) + "\n")
        if self._flush:
            self.stream.flush()

    def text(self, text: str) -> None:
        """A line of text (``text`` without its newline)."""
        self.stream.write(text + "\n")
        if self._flush:
            self.stream.flush()

    def submitted(self, handle: str, waiting: bool) -> None:
        """A new app's handle: its line of text at once; in JSON, the object at once unless
        the command waits (the handle is then in its final object; stderr names it now)."""
        if not self.as_json:
            self.text(handle)
        elif waiting:
            print(f"shipyard: submitted {handle}", file=sys.stderr, flush=True)
        else:
            self.object({"app_handle": handle})

    def log_line(
        self,
        handle: str,
        role: str,
        replica: int,
        line: str,
        prefix: bool = True,
        element: int | None = None,
    ) -> None:
        """One log line of a replica: ``role/k line`` (without ``prefix``: the bare line; of
        an array's ``element``: ``[i] line``), or its JSON object."""
        line = line.rstrip("\n")
        if self.as_json:
            obj: dict[str, Any] = {"app_handle": handle, "role": role, "replica": replica}
            if element is not None:
                obj["element"] = element
            self.object({**obj, "line": line})
        elif element is not None:
            self.text(f"[{element}] {line}")
        else:
            self.text(f"{role}/{replica} {line}" if prefix else line)

    def final(self, handle: str, status: AppStatus, result: AppResult | None) -> None:
        """An app's status once it ended (or as it is): its replicas and what they used,
        the replicas that asked for far more memory than they used, and the results."""
        from core.reports import over_requests

        over = over_requests(status.roles) if status.is_terminal() else []
        if self.as_json:
            obj = {"app_handle": handle, **status.to_json()}
            obj["result"] = result.to_json()["replicas"] if result is not None else None
            obj["over_requests"] = over
            self.object(obj)
            return
        self.text(f"{handle}\n{status.format()}")
        for line in over:
            self.text(f"Over-request: {line}")
        for r in result.replicas if result is not None else ():
            if r.error:
                self.text(f"Result error: {r.error}")
            elif r.present:
                self.text(f"Result {r.name}: {json.dumps(r.value)}")

    def ended_without_status(self, handle: str, why: str) -> None:
        """A waited-for app whose final status is not known (``why``: ``interrupted``,
        ``unknown``): in JSON, its handle and why, so the handle is never lost."""
        if self.as_json:
            self.object({"app_handle": handle, "state": None, why: True})
