"""The `shipyard` command, run as a user runs it (a subprocess) on the local scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, wait_until

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
        == f"shipyard: error: {p}:4:44: roles[1].num_replicas: expected a positive integer, got -2"
    )


def test_unknown_handle_exits_1() -> None:
    r = sh("status", "local_cwd://shipyard/never-existed-123")
    assert r.returncode == 1 and "no such app" in r.stderr


# -- issue 20: --version, schema, progress, exit codes, completion ---------------------------


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    r = sh("--version")
    assert r.returncode == 0 and r.stdout == f"shipyard {version('shipyard')}\n", r


EXAMPLE_APP_FILES = sorted(
    p for d in ("dags", "scripts") for p in (ROOT / d).rglob("*.y*ml") if "roles:" in p.read_text()
)


def test_schema_validates_every_example_app_file(tmp_path: Path) -> None:
    import yaml

    r = sh("schema")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert schema["title"] == "Shipyard app" and "roles" in schema["required"]
    assert len(EXAMPLE_APP_FILES) >= 2, EXAMPLE_APP_FILES
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(schema)
    for path in EXAMPLE_APP_FILES:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, (path, errors)
    bad = {"name": "x", "roles": [{"name": "a", "entrypoint": "e", "num_replicas": 0}]}
    assert [e.message for e in validator.iter_errors(bad)] == ["0 is less than the minimum of 1"]


def test_every_app_file_error_is_a_line_and_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nroles:\n  - {name: a, entrypoint: e, num_replicas: 0}\n  - {name: b}\n")
    r = sh("run", str(p))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"shipyard: error: {p}:3:44: roles[0].num_replicas: expected a positive integer, got 0",
        f"shipyard: error: {p}:4:5: roles[1].entrypoint: required",
    ]


def _gated_job(gate: Path, *extra: str) -> list[str]:
    """A 2-replica job that runs until ``gate`` exists (or 60 s, so nothing is left behind)."""
    loop = f"i=0; while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"
    return [SHIPYARD, "run", "--wait", "--replicas", "2", *extra, "--", "sh", "-c", loop]


def test_run_wait_prints_replica_states_as_they_change(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    p = subprocess.Popen(
        _gated_job(gate), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stderr is not None and p.stdout is not None
    lines = []
    for line in p.stderr:  # not a terminal: one plain line per change
        lines.append(line.split("] ", 1)[-1].rstrip("\n"))
        if {"sh/0 RUNNING on localhost", "sh/1 RUNNING on localhost"} <= set(lines):
            gate.touch()
    assert p.wait(timeout=60) == 0
    # one line per change, in order (the replicas may be seen ending in different polls)
    assert lines[0] == "app RUNNING", lines
    assert sorted(lines) == sorted(
        [
            "app RUNNING",
            "app SUCCEEDED",
            *(f"sh/{k} RUNNING on localhost" for k in (0, 1)),
            *(f"sh/{k} SUCCEEDED (exit 0) on localhost" for k in (0, 1)),
        ]
    ), lines
    for k in (0, 1):
        assert lines.index(f"sh/{k} RUNNING on localhost") < lines.index(
            f"sh/{k} SUCCEEDED (exit 0) on localhost"
        )
    assert "State: SUCCEEDED" in p.stdout.read()


def test_run_wait_on_a_terminal_redraws_one_status_line(tmp_path: Path) -> None:
    import os
    import pty
    import select

    gate = tmp_path / "go"
    master, slave = pty.openpty()
    p = subprocess.Popen(
        _gated_job(gate), cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave,
        env={**os.environ, "TERM": "xterm"},
    )  # fmt: skip
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, seen
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if b"sh: 2 RUNNING" in seen:
            gate.touch()
    os.close(master)
    assert p.wait(timeout=60) == 0
    text = seen.decode()
    assert "\n" not in text, text  # redrawn in place, never scrolled
    assert text.startswith("\r") and text.endswith("\r\x1b[K")  # cleared at the end
    draws = [d.removesuffix("\x1b[K") for d in text.split("\r") if d.removesuffix("\x1b[K")]
    assert draws[0].startswith("RUNNING ") and draws[0].endswith("  sh: 2 RUNNING"), draws
    assert draws[-1].startswith("SUCCEEDED ") and draws[-1].endswith("sh: 2 SUCCEEDED"), draws
    assert len(draws) == len(set(draws))  # drawn only when it changes


def test_an_unreachable_backend_has_its_own_exit_code(tmp_path: Path) -> None:
    pytest.importorskip("requests")
    import os

    clusters = tmp_path / "clusters.yaml"
    clusters.write_text(
        "down:\n  transport: rest\n  rest_url: http://127.0.0.1:9\n  user: u\n"
        f"  token_env: DOWN_TOKEN\n  local_mount: {tmp_path}\n  remote_dir: {tmp_path}\n"
    )
    env = {
        **os.environ,
        "SHIPYARD_CLUSTERS": str(clusters),
        "DOWN_TOKEN": "x",
        "SHIPYARD_RETRY_BUDGET": "0",
    }
    r = subprocess.run(
        [SHIPYARD, "status", "slurm://shipyard/down:1"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert r.returncode == 75, (r.returncode, r.stderr)
    assert r.stderr.startswith("shipyard: error: backend unavailable")
    assert len(r.stderr.splitlines()) == 1 and "127.0.0.1:9" in r.stderr
    # so does a submission, naming the setting
    r = subprocess.run(
        [SHIPYARD, "run", "-s", "slurm", "--cfg", "cluster=down", "--", "/bin/true"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert r.returncode == 75, (r.returncode, r.stderr)
    assert "cluster 'down': rest_url: cannot reach http://127.0.0.1:9" in r.stderr, r.stderr
    assert "75" in sh("--help").stdout


def test_shell_completion_offers_commands_and_choices(tmp_path: Path) -> None:
    import os

    out = tmp_path / "completions"

    def complete(line: str) -> list[str]:
        env = {
            **os.environ,
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        }
        subprocess.run([SHIPYARD], env=env, timeout=60, check=True, capture_output=True)
        return sorted(w.strip() for w in out.read_text().split("\x0b"))

    assert complete("shipyard sch") == ["schema"]
    assert complete("shipyard run --progress ") == ["auto", "live", "none", "plain"]


def test_run_wait_exits_as_soon_as_the_app_ended(tmp_path: Path) -> None:
    import time

    t0 = time.monotonic()
    r = sh("run", "--wait", "--progress", "none", "--", "sh", "-c", "sleep 0.3", cwd=tmp_path)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    # the exit flush of log collections used to wait out its whole 10 s timeout when the app
    # was the process's first submit (its launch was counted before the first-use reset)
    assert elapsed < 8, elapsed


RESULT_APP = """
name: cli-result
roles:
  - name: train
    entrypoint: python3
    resource: {memMB: 4096}
    args:
      - "-c"
      - "import json, os; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]);
         json.dump({'loss': 0.25}, open(os.environ['SHIPYARD_RESULT_FILE'], 'w'))"
  - name: broken
    entrypoint: sh
    args: ["-c", "echo '{not json' > $SHIPYARD_RESULT_FILE"]
"""


def test_results_and_usage_through_run_wait_and_status(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(RESULT_APP)
    r = sh("run", "--wait", "--progress", "none", "app.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.splitlines()[0]
    assert 'Result train/0: {"loss": 0.25}' in r.stdout.splitlines()
    assert any(
        line.startswith("Result error: broken/0: result file is not valid JSON")
        for line in r.stdout.splitlines()
    ), r.stdout
    # each replica's line has what it used (wall and CPU time; the peak of one that used more
    # memory than the submitting process, here 200 MiB)
    train = next(line for line in r.stdout.splitlines() if line.startswith("  train/0 "))
    assert "wall " in train and "peak " in train and " of 4 GiB" in train, train
    # asked for 4 GiB, used about 200 MiB: flagged
    (over,) = [line for line in r.stdout.splitlines() if line.startswith("Over-request: ")]
    assert over.startswith("Over-request: train/0: requested 4 GiB, peak 2"), over

    data = json.loads(sh("status", handle, "--json").stdout)
    by_name = {f"{x['role']}/{x['replica_id']}": x for x in data["result"]}
    assert by_name["train/0"]["value"] == {"loss": 0.25}
    assert "not valid JSON" in by_name["broken/0"]["error"]
    usage = data["roles"][0]["replicas"][0]["usage"]
    assert usage["wall_time"] > 0 and usage["peak_memory"] > 0, usage


@pytest.mark.parametrize("scheduler", ["local_docker", "slurm"])
def test_results_through_the_cli_on_docker_and_slurm(scheduler: str, tmp_path: Path) -> None:
    """Copied out of the stopped container (Docker), read from the job's directory (Slurm),
    by the run that waited and by a status from another process."""
    from tests.services import docker_problem, require, slurm_problem

    if scheduler == "slurm":
        require("slurm", slurm_problem())
    else:
        require("docker", docker_problem())
    write = 'echo "{\\"replica\\": $SHIPYARD_REPLICA_ID}" > "$SHIPYARD_RESULT_FILE"'
    (tmp_path / "app.yaml").write_text(
        "name: cli-result\nroles:\n  - name: w\n    image: shipyard-test/busybox:latest\n"
        f"    entrypoint: sh\n    args: [-c, {json.dumps(write)}]\n    num_replicas: 2\n"
    )
    r = sh("run", "--wait", "--progress", "none", "-s", scheduler, "app.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.splitlines()[0]
    assert 'Result w/0: {"replica": 0}' in r.stdout.splitlines(), r.stdout
    try:
        data = json.loads(sh("status", handle, "--json", cwd=tmp_path).stdout)
        assert [(x["role"], x["replica_id"], x["value"]) for x in data["result"]] == [
            ("w", 0, {"replica": 0})
        ]
    finally:
        if scheduler == "local_docker":
            from core.schedulers.docker_scheduler import create_scheduler
            from core.specs import parse_app_handle

            parsed = parse_app_handle(handle)
            with create_scheduler(parsed.session_name) as docker:
                docker.purge(parsed.app_id)


def test_run_check_lists_every_problem_and_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(
        "name: cli-check\n"
        "roles:\n"
        "  - name: a\n    entrypoint: /nonexistent/train\n"
        "  - name: b\n    entrypoint: sh\n    args: [-c, 'touch started']\n"
        "    env: {CUDA_VISIBLE_DEVICES: ''}\n"
        "  - name: c\n    entrypoint: no-such-command-anywhere\n"
    )
    r = sh("run", "--check", "app.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stdout.splitlines() if line.startswith("error: ")]
    assert [e.split(":")[1].strip() for e in errors] == [
        "roles[0].entrypoint",
        "roles[2].entrypoint",
    ], r.stdout
    assert r.stdout.splitlines()[-1] == "local_cwd: 2 problem(s) found"
    assert not (tmp_path / "started").exists()
    ok = sh("run", "--check", "--", "sh", "-c", "touch started", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == "local_cwd: no problems", ok
    assert not (tmp_path / "started").exists()


def test_run_max_silence_cancels_a_silent_app(tmp_path: Path) -> None:
    r = sh("run", "--max-silence", "2", "--log", "--", "sh", "-c", "echo started; exec sleep 300",
           cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "sh/0 started" in r.stdout.splitlines()
    assert "no log line for 2s from sh/0 (max_silence); last lines: sh/0: 'started'" in r.stderr
    assert "State: CANCELLED" in r.stdout
    bad = sh("run", "--max-silence", "0", "--", "true", cwd=tmp_path)
    assert bad.returncode == 2 and "--max-silence: expected a positive duration" in bad.stderr


def test_an_apps_own_max_silence_applies_to_run_wait(tmp_path: Path) -> None:
    app = tmp_path / "app.yaml"
    app.write_text(
        "name: quiet\nmetadata: {max_silence: '2'}\n"
        "roles: [{name: sh, entrypoint: sh, args: ['-c', 'echo started; exec sleep 300']}]\n"
    )
    r = sh("run", "--wait", str(app), cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no log line for 2s from sh/0 (max_silence)" in r.stderr
    assert "State: CANCELLED" in r.stdout
    app.write_text(app.read_text().replace("'2'", "'-1'"))
    bad = sh("run", "--wait", str(app), cwd=tmp_path)
    assert (
        bad.returncode == 2 and "metadata.max_silence: expected a positive duration" in bad.stderr
    )


def test_status_json_says_why_each_app_ended(tmp_path: Path) -> None:
    """``status --json`` as a user runs it: the reason of apps ended by their exit code, a
    signal, the time limit, a cancel, and a dependency that failed."""

    def run(*args: str) -> str:
        r = sh("run", *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    handles = {
        "exit_code": run("--", "sh", "-c", "exit 3"),
        "signal": run("--", "sh", "-c", "kill -9 $$"),
        "timeout": run("--cfg", "time_limit=1s", "--", "sleep", "300"),
        "cancelled": run("--", "sleep", "300"),
    }
    handles["dependency"] = run("--after", handles["exit_code"], "--", "echo", "never")
    assert sh("cancel", handles["cancelled"], "--wait").returncode == 0

    def ended(handle: str) -> dict[str, object] | None:
        status = json.loads(sh("status", "--json", handle).stdout)
        return status if status["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    for reason, handle in handles.items():
        status = wait_until(lambda h=handle: ended(h), 60, f"{reason} app to end")
        assert status["reason"] == reason, (reason, status)
