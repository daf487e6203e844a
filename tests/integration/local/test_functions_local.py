"""Python functions as jobs on local processes (``Runner.run_function``): values, exceptions,
maps, and every way a call can be refused before anything runs or fail in the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.functions import FUNCTION_ENV, PYTHON_ENV, FunctionError, runtime_source
from core.runner import Runner, get_runner
from core.specs import AppState
from tests.helpers import wait_until
from tests.integration import functions


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.chdir(tmp_path)
    with get_runner(f"pytest-fn-{uuid.uuid4().hex[:8]}") as r:
        yield r


def test_value_exception_and_map(runner: Runner) -> None:
    functions.check_value_exception_and_map(runner, "local_cwd")


def _apps(runner: Runner) -> set[str]:
    return {a.app_id for a in runner.list("local_cwd")}


def test_bad_calls_refused_before_anything_runs(runner: Runner, tmp_path: Path) -> None:
    before = _apps(runner)
    with pytest.raises(ValueError, match=r"^function: cannot be pickled: TypeError: .*lock"):
        runner.run_function(functions.square, threading.Lock(), scheduler="local_cwd")
    with pytest.raises(ValueError, match=r"^function: .* pickle to \d+ bytes .* pass large"):
        runner.run_function(functions.square, os.urandom(200_000), scheduler="local_cwd")
    with pytest.raises(ValueError, match=r"^fn: expected a callable"):
        runner.run_function(42, scheduler="local_cwd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^cfg.python: cannot run '/no/such/python'"):
        runner.run_function(functions.square, 2, scheduler="local_cwd",
                            cfg={"python": "/no/such/python"})  # fmt: skip
    # (Debian's own python3 has no cloudpickle)
    with pytest.raises(
        ValueError, match=r"^cfg.python: /usr/bin/python3 cannot import cloudpickle"
    ):
        runner.run_function(functions.square, 2, scheduler="local_cwd",
                            cfg={"python": "/usr/bin/python3"})  # fmt: skip
    other = tmp_path / "python3.99"
    other.write_text("#!/bin/sh\necho 3.99\n")
    other.chmod(0o755)
    with pytest.raises(
        ValueError,
        match=r"^cfg.python: .*python3.99 is Python 3.99, but the function is pickled by Python 3\.\d+",
    ):
        runner.run_function(functions.square, 2, scheduler="local_cwd", cfg={"python": str(other)})
    assert _apps(runner) == before


def test_result_too_large_is_an_error_naming_it(runner: Runner) -> None:
    handle = runner.run_function(os.urandom, 2_000_000, scheduler="local_cwd")
    functions.check_no_outcome(runner, handle, r"result: the return value pickles to \d+ bytes")
    status = runner.status(handle)
    assert status is not None and status.state == AppState.FAILED


def test_exit_and_cancel_give_no_value(runner: Runner) -> None:
    exits = runner.run_function(sys.exit, 4, scheduler="local_cwd")
    functions.check_no_outcome(runner, exits, r"ended FAILED without an outcome")
    sleeper = runner.run_function(functions.sleep_then, 300, scheduler="local_cwd")
    wait_until(lambda: (s := runner.status(sleeper)) is not None and s.state == AppState.RUNNING)
    runner.cancel(sleeper)
    functions.check_no_outcome(runner, sleeper, r"ended CANCELLED without an outcome")


def _runtime(env: dict[str, str], result: Path) -> tuple[int, dict[str, object]]:
    full = {**os.environ, **env, "SHIPYARD_RESULT_FILE": str(result)}
    p = subprocess.run([sys.executable, "-c", runtime_source()], env=full, capture_output=True)
    return p.returncode, json.loads(result.read_text())


def test_the_job_checks_its_interpreter_and_payload_first(tmp_path: Path) -> None:
    """Where no pre-flight could run (a named cluster), the job itself refuses to start."""
    code, doc = _runtime({PYTHON_ENV: "3.99", FUNCTION_ENV: "x"}, tmp_path / "a.json")
    assert code == 3 and doc["kind"] == "interpreter", doc
    assert "pickled by Python 3.99 but this job's interpreter" in str(doc["message"])
    code, doc = _runtime({FUNCTION_ENV: "bm90IGEgcGlja2xl"}, tmp_path / "b.json")
    assert code == 3 and doc["kind"] == "load" and "could not load" in str(doc["message"])


def test_function_error_when_the_job_wrote_nothing(runner: Runner) -> None:
    handle = runner.run_function(functions.square, 3, scheduler="local_cwd")
    assert runner.wait_function(handle) == 9
    with pytest.raises(FunctionError, match="no such job"):
        runner.wait_function(handle.rsplit("/", 1)[0] + "/square-0000000000")
