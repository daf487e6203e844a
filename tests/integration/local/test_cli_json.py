"""`--json` on every `shipyard` command that prints data (issue 29), run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def sh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHIPYARD, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def objects(stdout: str) -> list[dict[str, Any]]:
    """Every line of ``stdout`` as one JSON object (fails on any other line)."""
    out = [json.loads(line) for line in stdout.splitlines()]
    assert all(isinstance(o, dict) for o in out), out
    return out


def test_run_prints_the_handle_and_once_waited_for_the_final_status(tmp_path: Path) -> None:
    r = sh("run", "--json", "--", "true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (only,) = objects(r.stdout)
    assert list(only) == ["app_handle"] and only["app_handle"].startswith("local_cwd://")

    # replica 1 fails once replica 0 ignores SIGTERM: else the gang's SIGTERM may end replica 0
    # before its own exit 0 (a loaded run saw [-15, 1])
    ready = tmp_path / "ready0"
    script = (
        f"if [ $SHIPYARD_REPLICA_ID = 0 ]; then trap '' TERM; touch {ready};"
        f" else while [ ! -e {ready} ]; do sleep 0.01; done; fi;"
        " echo $SHIPYARD_REPLICA_ID; exit $SHIPYARD_REPLICA_ID"
    )
    r = sh("run", "--json", "--wait", "--replicas", "2", "--", "sh", "-c", script, cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # (replica 1 failed)
    (final,) = objects(r.stdout)
    assert final["state"] == "FAILED"
    assert [x["exit_code"] for x in final["roles"][0]["replicas"]] == [0, 1]
    assert final["over_requests"] == [] and isinstance(final["result"], list)
    assert f"submitted {final['app_handle']}" in r.stderr  # (named before the wait)
    # the fields of `status --json`, which says the same afterwards (but for the usage
    # figures, which may be measured after the run printed them)
    st = json.loads(sh("status", final["app_handle"], "--json", cwd=tmp_path).stdout)
    assert set(st) < set(final) and (st["state"], st["reason"]) == ("FAILED", final["reason"])
    assert [(x["id"], x["state"], x["exit_code"]) for x in st["roles"][0]["replicas"]] == [
        (x["id"], x["state"], x["exit_code"]) for x in final["roles"][0]["replicas"]
    ]


def test_run_log_is_json_lines_then_the_final_status(tmp_path: Path) -> None:
    r = sh("run", "--json", "--log", "--replicas", "2", "--", "sh", "-c", "echo a; echo b >&2",
           cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    *lines, final = objects(r.stdout)
    assert final["state"] == "SUCCEEDED"
    assert all(o["app_handle"] == final["app_handle"] for o in lines)
    assert sorted((o["role"], o["replica"], o["line"]) for o in lines) == [
        ("sh", 0, "a"), ("sh", 0, "b"), ("sh", 1, "a"), ("sh", 1, "b"),
    ]  # fmt: skip


def test_an_arrays_lines_name_their_element(tmp_path: Path) -> None:
    r = sh("run", "--json", "--log", "--array", "0-1", "--", "sh", "-c",
           "echo i=$SHIPYARD_ARRAY_INDEX", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    *lines, final = objects(r.stdout)
    assert sorted((o["element"], o["line"]) for o in lines) == [(0, "i=0"), (1, "i=1")]
    assert final["counts"] == {"SUCCEEDED": 2}


def test_log_prints_one_object_per_line(tmp_path: Path) -> None:
    r = sh("run", "--wait", "--progress", "none", "--replicas", "2", "--", "sh", "-c",
           "echo one; echo 'two {\"x\": 1}'", cwd=tmp_path)  # fmt: skip
    handle = r.stdout.splitlines()[0]
    lg = sh("log", handle, "--json", cwd=tmp_path)
    assert lg.returncode == 0, lg.stderr
    assert [(o["role"], o["replica"], o["line"]) for o in objects(lg.stdout)] == [
        ("sh", 0, "one"), ("sh", 0, 'two {"x": 1}'), ("sh", 1, "one"), ("sh", 1, 'two {"x": 1}'),
    ]  # fmt: skip
    one = objects(sh("log", f"{handle}/sh/1", "--json", "--regex", "^one", cwd=tmp_path).stdout)
    assert one == [{"app_handle": handle, "role": "sh", "replica": 1, "line": "one"}]


def test_cancel_says_what_it_did(tmp_path: Path) -> None:
    handle = objects(sh("run", "--json", "--", "sleep", "300", cwd=tmp_path).stdout)[0][
        "app_handle"
    ]
    r = sh("cancel", handle, "--json", "--wait", "--timeout", "1m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert objects(r.stdout) == [{"app_handle": handle, "cancelled": True, "state": "CANCELLED"}]
    again = objects(sh("cancel", handle, "--json", cwd=tmp_path).stdout)
    assert again == [{"app_handle": handle, "cancelled": True, "state": None}]


def test_check_and_dryrun(tmp_path: Path) -> None:
    r = sh("run", "--check", "--json", "--", "/nonexistent/train", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    (found,) = objects(r.stdout)
    assert found["scheduler"] == "local_cwd" and found["errors"] == 1
    assert found["problems"] == [
        {"severity": "error", "field": "roles[0].entrypoint",
         "message": "'/nonexistent/train' does not exist"},
    ]  # fmt: skip
    ok = sh("run", "--check", "--json", "--", "true", cwd=tmp_path)
    assert ok.returncode == 0 and objects(ok.stdout) == [
        {"scheduler": "local_cwd", "errors": 0, "problems": []}
    ]
    dry = sh("run", "--dryrun", "--json", "--", "true", cwd=tmp_path)
    (request,) = objects(dry.stdout)
    assert request["scheduler"] == "local_cwd" and "args: /usr/bin/true" in request["request"]


def test_runopts_lists_each_schedulers_options(tmp_path: Path) -> None:
    r = sh("runopts", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    opts = json.loads(r.stdout)
    assert {"local_cwd", "local_docker", "slurm"} <= set(opts)
    for entries in opts.values():
        for entry in entries:
            assert list(entry) == ["name", "type", "default", "help", "required"], entry
    slurm = {e["name"]: e for e in opts["slurm"]}
    assert slurm["partition"]["type"] == "str" and slurm["partition"]["required"] is False
    docker = {e["name"]: e for e in opts["local_docker"]}
    assert docker["stop_timeout"]["type"] == "int" and docker["stop_timeout"]["default"] > 0
    one = json.loads(sh("runopts", "local_cwd", "--json", cwd=tmp_path).stdout)
    assert list(one) == ["local_cwd"] and one["local_cwd"] == opts["local_cwd"]
