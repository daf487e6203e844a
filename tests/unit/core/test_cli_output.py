"""The text and JSON forms of what `shipyard` prints (core.cli_output)."""

from __future__ import annotations

import io
import json

from core.cli_output import Output, problems_json, runopts_json
from core.options import runopts
from core.reports import Problem
from core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus


def _out(as_json: bool) -> tuple[Output, io.StringIO]:
    buf = io.StringIO()
    return Output(as_json, stream=buf), buf


def test_log_lines_as_text_and_as_json() -> None:
    text, buf = _out(False)
    text.log_line("h", "r", 0, "one\n")
    text.log_line("h", "r", 1, "two", prefix=False)
    text.log_line("h", "r", 0, "three\n", element=4)
    assert buf.getvalue() == "r/0 one\ntwo\n[4] three\n"
    js, buf = _out(True)
    js.log_line("h", "r", 1, "a {b}\n")
    js.log_line("h", "r", 0, "c", element=2)
    assert [json.loads(x) for x in buf.getvalue().splitlines()] == [
        {"app_handle": "h", "role": "r", "replica": 1, "line": "a {b}"},
        {"app_handle": "h", "role": "r", "replica": 0, "element": 2, "line": "c"},
    ]


def test_a_submitted_handle_waits_for_the_final_object_in_json() -> None:
    text, buf = _out(False)
    text.submitted("h", waiting=True)
    assert buf.getvalue() == "h\n"
    js, buf = _out(True)
    js.submitted("h", waiting=False)
    assert json.loads(buf.getvalue()) == {"app_handle": "h"}
    js, buf = _out(True)
    js.submitted("h", waiting=True)  # (named on stderr: the final object carries it)
    js.ended_without_status("h", "interrupted")
    assert json.loads(buf.getvalue()) == {"app_handle": "h", "state": None, "interrupted": True}


def test_the_final_status_has_the_same_fields_in_both_forms() -> None:
    replica = ReplicaStatus(0, AppState.FAILED, "w", "node1", exit_code=3)
    status = AppStatus(AppState.FAILED, roles=[RoleStatus("w", [replica])], reason="exit_code")
    text, buf = _out(False)
    text.final("h", status, None)
    assert buf.getvalue().startswith("h\n") and "FAILED" in buf.getvalue()
    js, buf = _out(True)
    js.final("h", status, None)
    obj = json.loads(buf.getvalue())
    assert obj["app_handle"] == "h" and obj["state"] == "FAILED"
    assert obj["roles"][0]["replicas"][0]["exit_code"] == 3
    assert obj["result"] is None and obj["over_requests"] == []


def test_runopts_and_problems() -> None:
    opts = runopts()
    opts.add("partition", type_=str, help="where", required=True)
    opts.add("retries", type_=int, help="how often", default=2)
    assert runopts_json({"s": opts}) == {
        "s": [
            {"name": "partition", "type": "str", "default": None, "help": "where",
             "required": True},
            {"name": "retries", "type": "int", "default": 2, "help": "how often",
             "required": False},
        ]
    }  # fmt: skip
    found = [Problem("cfg.partition", "unknown"), Problem("start", "in 5 min", "info")]
    assert problems_json("slurm", found) == {
        "scheduler": "slurm",
        "errors": 1,
        "problems": [
            {"severity": "error", "field": "cfg.partition", "message": "unknown"},
            {"severity": "info", "field": "start", "message": "in 5 min"},
        ],
    }
