"""The pure parts of function jobs (core.functions): the cfg key of the interpreter, the app
of a call, the outcome documents turned into values and exceptions, and the source lines
added to a job's traceback."""

from __future__ import annotations

import base64
import pickle
import sys

import pytest

from core.functions import (
    FILE_ENV,
    FUNCTION_ENV,
    FunctionError,
    RemoteTraceback,
    function_app,
    function_value,
    split_cfg,
    with_source_lines,
)
from core.reports import AppResult, ReplicaResult
from core.specs import AppState


def _result(doc: object, state: AppState = AppState.SUCCEEDED) -> AppResult:
    replica = ReplicaResult("fn", 0, value=doc, present=doc is not None)
    return AppResult("local_cwd://s/fn-1", state, [replica])


def test_the_interpreter_is_a_cfg_key_taken_out_before_the_scheduler() -> None:
    assert split_cfg({"python": "/opt/py/bin/python", "log_dir": "x"}) == (
        {"log_dir": "x"},
        "/opt/py/bin/python",
    )
    assert split_cfg(None) == ({}, None)
    with pytest.raises(ValueError, match=r"^cfg.python: expected an interpreter"):
        split_cfg({"python": 3})


def test_the_app_of_a_call() -> None:
    def add(a: int, b: int = 1) -> int:
        return a + b

    app = function_app(add, (1,), {"b": 2}, python="/usr/bin/python3")
    (role,) = app.roles
    assert role.name == "add" and role.entrypoint == "/usr/bin/python3"
    assert role.args[0] == "-c" and "def main()" in role.args[1] and "$" not in role.args[1]
    assert role.env[FILE_ENV] == __file__ and role.env[FUNCTION_ENV]
    assert app.metadata == {"shipyard.function": "1"}


def test_outcomes_become_values_and_exceptions() -> None:
    blob = base64.b64encode(pickle.dumps({"loss": 0.5})).decode()
    assert function_value(_result({"shipyard_function": 1, "ok": True, "value": blob})) == {
        "loss": 0.5
    }
    raised = {
        "shipyard_function": 1, "ok": False, "kind": "raised", "type": "mod.Gone",
        "message": "gone", "traceback": "Traceback...\nmod.Gone: gone\n", "exception": None,
    }  # fmt: skip
    with pytest.raises(FunctionError, match=r"the function raised mod.Gone: gone") as info:
        function_value(_result(raised, AppState.FAILED))
    assert isinstance(info.value.__cause__, RemoteTraceback)
    refused = {"shipyard_function": 1, "ok": False, "kind": "interpreter", "message": "python: x"}
    with pytest.raises(FunctionError, match=r"fn-1: python: x"):
        function_value(_result(refused, AppState.FAILED))
    with pytest.raises(FunctionError, match=r"ended CANCELLED without an outcome: why"):
        function_value(_result(None, AppState.CANCELLED), "why")


def test_source_lines_are_added_where_the_job_had_none() -> None:
    here = sys._getframe().f_lineno
    text = f'Traceback:\n  File "{__file__}", line {here}, in test\nValueError: x\n'
    lines = with_source_lines(text).splitlines()
    assert lines[2].strip().startswith("here = sys._getframe()"), lines
    kept = 'Traceback:\n  File "/nowhere.py", line 3, in f\n    own line\nValueError: x\n'
    assert with_source_lines(kept) == kept
