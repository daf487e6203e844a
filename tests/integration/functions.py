"""The checks every backend's function-job tests make (``Runner.run_function`` and
``Runner.map_function`` on the real service).

The functions below travel by value (this module is registered with cloudpickle), as a
function of a script's ``__main__`` does: the job's interpreter needs cloudpickle, not the
tests.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import cloudpickle
import pytest

from core.functions import FunctionError, RemoteTraceback
from core.runner import Runner
from core.specs import AppState

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Refused(Exception):
    """An exception of the tests' own, rebuilt on this side from the job's pickle."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what, code)
        self.code = code


def combine(a: int, b: int = 1, *, scale: int = 1, timeout: str = "") -> dict[str, Any]:
    """Uses a keyword named like one of the runner's own (``timeout``): it reaches ``fn``."""
    return {"sum": (a + b) * scale, "timeout": timeout, "host": socket.gethostname()}


def refuse(what: str) -> None:
    raise Refused(f"refused {what}", 7)


_RAISE_LINE = refuse.__code__.co_firstlineno + 1


def square(x: int) -> int:
    return x * x


def check_value_exception_and_map(
    runner: Runner, scheduler: str, cfg: dict[str, Any] | None = None, image: str = ""
) -> None:
    """A return value (positional, keyword and runner-like keyword arguments), an exception
    re-raised here with the job's traceback, and a map of 20 calls, in order."""
    kw: dict[str, Any] = {"scheduler": scheduler, "cfg": cfg, "image": image}
    ok = runner.run_function(combine, 2, b=5, scale=3, timeout="10m", **kw)
    bad = runner.run_function(refuse, "politely", **kw)
    mapped = runner.map_function(square, [*range(19), (19,)], max_parallel=8, **kw)

    value = runner.wait_function(ok, timeout=120)
    assert value["sum"] == 21 and value["timeout"] == "10m", value
    with pytest.raises(Refused) as info:
        runner.wait_function(bad, timeout=120)
    assert info.value.code == 7 and str(info.value) == "('refused politely', 7)"
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    # the job's frame names this file, the line and its text
    assert bad in str(cause), str(cause)
    assert f'{__file__}", line {_RAISE_LINE}, in refuse' in str(cause), str(cause)
    assert 'raise Refused(f"refused {what}", 7)' in str(cause), str(cause)
    status = runner.status(bad)
    assert status is not None and status.state == AppState.FAILED
    assert runner.wait_map(mapped, timeout=180) == [i * i for i in range(20)]


def check_no_outcome(runner: Runner, handle: str, words: str) -> None:
    """A function job that ended without an outcome: a :class:`FunctionError` saying so."""
    with pytest.raises(FunctionError, match=words):
        runner.wait_function(handle, timeout=120)


def sleep_then(seconds: float) -> None:
    import time

    time.sleep(seconds)
