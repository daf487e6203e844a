"""The `shipyard` command, run as a user runs it (a subprocess) on the local scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))
APP = """
name: cli-demo
roles:
  - name: hello
    entrypoint: sh
    args: ["-c", "echo hello from ${replica_id}; echo oops >&2"]
    num_replicas: 2
  - name: other
    entrypoint: echo
    args: [other, role]
"""


def sh(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHIPYARD, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def appfile(tmp_path: Path) -> Path:
    p = tmp_path / "app.yaml"
    p.write_text(APP)
    return p


def test_run_yaml_with_logs_then_address_it_by_handle(appfile: Path, tmp_path: Path) -> None:
    r = sh("run", str(appfile), "--log", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.splitlines()[0]
    assert handle.startswith("local_cwd://")
    assert "hello/0 hello from 0" in r.stdout and "hello/1 hello from 1" in r.stdout
    assert "other/0 other role" in r.stdout
    assert "State: SUCCEEDED" in r.stdout

    st = sh("status", handle, "--json")
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["state"] == "SUCCEEDED"
    assert [r["exit_code"] for r in data["roles"][0]["replicas"]] == [0, 0]

    lg = sh("log", f"{handle}/hello/1")
    assert lg.returncode == 0 and "hello from 1\n" in lg.stdout
    err = sh("log", f"{handle}/hello/1", "--streams", "stderr")
    assert err.stdout == "oops\n"
    only = sh("log", handle, "--regex", "^hello")
    assert sorted(only.stdout.splitlines()) == ["hello/0 hello from 0", "hello/1 hello from 1"]

    ls = sh("list", "-s", "local_cwd", "--json")
    assert handle in [a["app_handle"] for a in json.loads(ls.stdout)]


def test_inline_failing_app_exits_nonzero_with_its_exit_code(tmp_path: Path) -> None:
    r = sh("run", "--wait", "--name", "failer", "--", "sh", "-c", "exit 3", cwd=tmp_path)
    assert r.returncode == 1
    assert "State: FAILED" in r.stdout and "exit_code=3" in r.stdout


def test_cancel_a_running_app(tmp_path: Path) -> None:
    r = sh("run", "--", "sleep", "60", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    c = sh("cancel", handle, "--wait")
    assert c.returncode == 0 and c.stdout.strip() == f"{handle} CANCELLED"


def test_dryrun_prints_the_request_and_starts_nothing(appfile: Path) -> None:
    before = sh("list", "--json").stdout
    r = sh("run", str(appfile), "--dryrun")
    assert r.returncode == 0 and "scheduler request (local_cwd)" in r.stdout
    assert sh("list", "--json").stdout == before


def test_runopts_prints_the_options() -> None:
    r = sh("runopts", "local_cwd")
    assert r.returncode == 0 and "log_dir=LOG_DIR (str, None)" in r.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["status", "not-a-handle"], "app handle: expected {scheduler}://{session}/{app_id}"),
        (["cancel", "local_cwd:/x"], "app handle: expected"),
        (["log", "local_cwd://s/app/role/x"], "replica: expected a non-negative integer"),
        (["run", "--cfg", "colour=red", "--", "echo"], "cfg: unknown option(s) colour"),
        (["run", "--cfg", "prepend_cwd=maybe", "--", "echo"], "cfg.prepend_cwd: expected a bool"),
        (["run", "-s", "nope", "--", "echo"], "--scheduler: unknown scheduler 'nope'"),
        (["run", "/does/not/exist.yaml"], "app file: cannot read"),
        (
            ["run", "--replicas", "0", "--", "echo"],
            "num_replicas: expected a positive integer, got 0",
        ),
        (["run", "--name", "bad name", "--", "echo"], "name: expected 1-63 characters"),
        (["run", "--env", "NOEQUALS", "--", "echo"], "--env: expected KEY=VALUE"),
        (["log", "x://s/a", "--since", "yesterday"], "--since: expected an ISO 8601 time"),
        (["frobnicate"], "invalid choice"),
        ([], "the following arguments are required"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], msg: str) -> None:
    r = sh(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_yaml_names_the_field(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(
        "name: x\nroles:\n  - {name: a, entrypoint: e}\n  - {name: b, entrypoint: e, num_replicas: -2}\n"
    )
    r = sh("run", str(p))
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == "shipyard: error: roles[1].num_replicas: expected a positive integer, got -2"
    )


def test_unknown_handle_exits_1() -> None:
    r = sh("status", "local_cwd://shipyard/never-existed-123")
    assert r.returncode == 1 and "no such app" in r.stderr
