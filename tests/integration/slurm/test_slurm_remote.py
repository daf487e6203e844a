"""Slurm clusters reached from elsewhere: the SSH login node and slurmrestd in front of the real
cluster (scripts/start_slurm_remote.sh), with no Slurm command on the client's PATH.

Covers what the scheduler tests (parametrized over every transport) do not: bad settings as
one-line errors before anything is queued, the CLI and a second process holding only the
handle, secrets kept off every command line, racing submitters with one idempotency key, and a
dropped SSH connection.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.clusters import ClusterConfig, ClusterError, Secret, load_clusters, register_cluster
from core.runner import get_runner
from core.schedulers.api import DescribeAppResponse, Stream
from core.schedulers.slurm import rest_v0042
from core.schedulers.slurm.transport import LocalFiles
from core.schedulers.slurm_scheduler import SlurmScheduler
from core.specs import AppDef, AppState, Role, is_terminal
from core.transient import BackendUnavailableError
from tests.helpers import ROOT
from tests.integration.slurm.slurm_clusters import (
    ALL_CLUSTERS,
    REMOTE_USER,
    Cluster,
    make_cluster,
    slurm_release,
    use_remote_clusters,
    wait,
)
from tests.services import REMOTE_DIR, require, slurm26_problem

REPO = ROOT
SHIPYARD = [sys.executable, "-m", "core.cli"]


@pytest.fixture(params=ALL_CLUSTERS)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


@pytest.fixture(params=["ssh", "rest", "ssh-26", "rest-26"])
def remote(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    yield from make_cluster(request.param, tmp_path, monkeypatch)


def _jobs_of_user() -> set[str]:
    # the test harness asks the cluster directly (the client has no Slurm commands)
    out = subprocess.run(
        ["/usr/bin/squeue", "-h", "-t", "all", "-u", REMOTE_USER, "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*SHIPYARD, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


# ---------------------------------------------------------------------------------------------
# the clusters file
# ---------------------------------------------------------------------------------------------


def test_clusters_file_errors_name_the_file_cluster_and_setting(tmp_path: Path) -> None:
    f = tmp_path / "clusters.yaml"
    f.write_text("hpc1:\n  transport: ssh\n  hots: login\n")
    with pytest.raises(ClusterError, match=rf"{f}: cluster 'hpc1': hots: unknown setting"):
        load_clusters(str(f))
    f.write_text("hpc1:\n  transport: ssh\n")
    with pytest.raises(ClusterError, match=r"cluster 'hpc1': host: required for transport ssh"):
        load_clusters(str(f))
    f.write_text("hpc2:\n  transport: rest\n  rest_url: http://x:1\n  user: u\n")
    with pytest.raises(ClusterError, match=r"cluster 'hpc2': remote_dir: an absolute"):
        load_clusters(str(f))
    f.write_text("hpc3:\n  transport: carrier-pigeon\n")
    with pytest.raises(ClusterError, match=r"cluster 'hpc3': transport: expected one of"):
        load_clusters(str(f))
    f.write_text("hpc4:\n  transport: ssh\n  host: h\n  port: 70000\n")
    with pytest.raises(ClusterError, match=r"cluster 'hpc4': port: expected a port"):
        load_clusters(str(f))
    f.write_text("ok:\n  transport: ssh\n  host: h\n  token: s3cr3t-value\n")
    config = load_clusters(str(f))["ok"]
    assert "s3cr3t-value" not in repr(config) and "s3cr3t-value" not in str(config)
    assert config.token is not None and config.token.get_secret_value() == "s3cr3t-value"


def test_unknown_cluster_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "clusters.yaml"
    f.write_text("a:\n  transport: local\n")
    monkeypatch.setenv("SHIPYARD_CLUSTERS", str(f))
    app = AppDef("x", [Role("w", entrypoint="/bin/true")])
    with pytest.raises(ClusterError, match=r"cfg\.cluster: unknown cluster 'nope'; clusters in"):
        SlurmScheduler("t").submit_dryrun(app, {"cluster": "nope"})


# ---------------------------------------------------------------------------------------------
# bad settings: one line naming the cluster and the setting, before anything is queued
# ---------------------------------------------------------------------------------------------


def _base(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "transport": "ssh",
        "host": "127.0.0.1",
        "port": 2222,
        "user": REMOTE_USER,
        "identity_file": os.path.join(REMOTE_DIR, "userkey"),
        "known_hosts": os.path.join(REMOTE_DIR, "known_hosts"),
    }


def _rest(name: str, **kw: Any) -> dict[str, Any]:
    home = f"/home/{REMOTE_USER}/shipyard"
    return {"name": name, "transport": "rest", "rest_url": "http://127.0.0.1:6820",
            "user": REMOTE_USER, "remote_dir": home, **kw}  # fmt: skip


def _token(user: str = REMOTE_USER, lifespan: int = 600) -> str:
    out = subprocess.run(
        ["/usr/bin/scontrol", "token", f"username={user}", f"lifespan={lifespan}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().partition("=")[2]


@pytest.fixture
def v37_slurmrestd() -> Iterator[str]:
    """A real slurmrestd that speaks only API v0.0.37 (one this client does not), started and
    stopped by the test."""
    port = _free_port()
    env = {**os.environ, "SLURM_JWT": "daemon"}
    p = subprocess.Popen(
        ["slurmrestd", "-u", "slurmrest", "-g", "slurmrest", "-a", "rest_auth/jwt",
         "-s", "openapi/v0.0.37", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return p.poll() is not None  # (ended: the assertion below says so)

        wait(up, 30, "the v0.0.37 slurmrestd")
        assert p.poll() is None, "slurmrestd with openapi/v0.0.37 did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)


def _bad_settings(
    case: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[dict[str, Any], str]:
    name = f"bad-{case.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
    if case == "unreachable host":
        return {**_base(name), "port": _free_port()}, r"host: .*cannot reach"
    if case == "refused key":
        key = tmp_path / "otherkey"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        return {**_base(name), "identity_file": str(key)}, r"identity_file: .* refused the key"
    if case == "unknown host key":
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        return {
            **_base(name),
            "known_hosts": str(empty),
        }, r"known_hosts: the host key of .* is not trusted"
    if case == "rejected token":  # a token whose signature is not the cluster's
        head, payload, sig = _token().split(".")
        forged = ".".join([head, payload, sig[::-1]])
        return _rest(name, token=Secret(forged)), r"token: slurmrestd refused the token"
    if case == "expired token":
        token = _token(lifespan=1)
        born = time.monotonic()
        wait(lambda: time.monotonic() - born > 2.5, 10, "the token to expire")
        return _rest(name, token=Secret(token)), r"token: slurmrestd refused the token"
    if case == "wrong API version":
        url = request.getfixturevalue("v37_slurmrestd")
        return _rest(
            name, rest_url=url, token=Secret(_token())
        ), r"rest_url: .* offers API versions v0.0.37; shipyard speaks v0.0.45, .*, v0.0.38$"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    ["unreachable host", "refused key", "unknown host key", "rejected token", "expired token",
     "wrong API version"],
)  # fmt: skip
def test_bad_settings_are_one_line_errors_before_anything_is_queued(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    use_remote_clusters(monkeypatch, tmp_path)
    settings, pattern = _bad_settings(case, tmp_path, request)
    register_cluster(ClusterConfig(**settings))
    before = _jobs_of_user()
    app = AppDef("bad", [Role("w", entrypoint="/bin/true")])
    # a host that cannot be reached may be up again later (the CLI exits 75); the rest are
    # bad settings (ValueError, exit 2)
    expected = BackendUnavailableError if case == "unreachable host" else ClusterError
    with get_runner("bad") as runner, pytest.raises(expected) as err:
        runner.run(app, "slurm", {"cluster": settings["name"]})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cluster {settings['name']!r}: "), message
    assert re.search(pattern, message), message
    assert _jobs_of_user() == before


# ---------------------------------------------------------------------------------------------
# users' paths
# ---------------------------------------------------------------------------------------------


def test_cli_runs_follows_and_cancels_on_a_named_cluster(remote: Cluster) -> None:
    p = _cli("run", "-s", "slurm", "--cfg", f"cluster={remote.name}", "--wait", "--",
             "/bin/sh", "-c", "echo hi from $SHIPYARD_REPLICA_ID")  # fmt: skip
    assert p.returncode == 0, p.stderr
    handle = next(w for w in p.stdout.split() if w.startswith("slurm://"))
    assert f"/{remote.name}:" in handle  # the handle names the cluster
    remote.jobs.append(handle.rsplit("/", 1)[1])
    status = _cli("status", handle, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "SUCCEEDED"
    log = _cli("log", f"{handle}/sh/0")
    assert log.returncode == 0 and "hi from 0" in log.stdout
    listed = _cli("list", "-s", "slurm", "--cfg", f"cluster={remote.name}", "--json")
    assert handle in [a["app_handle"] for a in json.loads(listed.stdout)]

    # a second process holding only the handle cancels a running job
    with get_runner("cli") as runner:
        h = runner.run(AppDef("long", [Role("w", entrypoint="sleep", args=["300"])]), "slurm",
                       remote.cfg())  # fmt: skip
        remote.jobs.append(h.rsplit("/", 1)[1])
        wait(lambda: (s := runner.status(h)) is not None and s.state == AppState.RUNNING, 90,
             "the job to run")  # fmt: skip
    cancel = _cli("cancel", h, "--wait")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == f"{h} CANCELLED"


SCRAPE = """
import os, sys, time
secret = sys.stdin.read().encode()  # (not in this scraper's own argv)
seen, hits = 0, []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        continue
    seen += 1
    if secret in cmd:
        hits.append(cmd.replace(b"\\0", b" ").decode(errors="replace"))
print(seen, len(hits))
for h in hits:
    print(h)
"""


def test_env_values_never_reach_a_command_line(cluster: Cluster, tmp_path: Path) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    started = cluster.scratch / "started"
    script = f'touch {started}; printf %s "$API_TOKEN" | sha256sum; sleep 3'
    app = AppDef("sec", [Role("w", entrypoint="/bin/sh", args=["-c", script],
                               env={"API_TOKEN": secret}, num_replicas=2)])  # fmt: skip
    job_dir_cfg, job_dir = cluster.job_dir("secret-job")
    app_id = cluster.submit(app, {"job_dir": job_dir_cfg})
    wait(started.exists, 90, "a replica to start")
    # every process of the machine, scraped while the job runs (as any user could with ps)
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", SCRAPE], input=secret, capture_output=True,
                             text=True, check=True).stdout.splitlines()  # fmt: skip
        seen, hits = (int(x) for x in out[0].split())
        assert seen > 10 and hits == 0, out[1:]
    done = cluster.wait_done(app_id)
    assert done.state == AppState.SUCCEEDED
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert list(cluster.sched.log_iter(app_id, "w", 1)) == [f"{digest}  -\n"]  # it got the value
    script_file = job_dir / "shipyard-sbatch.sh"
    assert secret in script_file.read_text()  # the script holds it ...
    assert script_file.stat().st_mode & 0o077 == 0  # ... readable by its owner only


RACE = """
import json, os, sys, time
from core.runner import get_runner
from core.specs import AppDef, Role
gate, key, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
app = AppDef("race", [Role("w", entrypoint="/bin/sh", args=["-c", "echo ran; sleep 2"])])
with get_runner("race") as runner:
    open(f"{gate}.ready.{os.getpid()}", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.001)
    print(runner.run(app, "slurm", cfg, idempotency_key=key))
"""


def test_racing_submitters_with_one_key_start_one_job(cluster: Cluster, tmp_path: Path) -> None:
    key = f"airflow:dag:run:task:-1:{uuid.uuid4().hex}"
    gate = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", RACE, str(gate), key, json.dumps(cluster.cfg())],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(4)
    ]  # fmt: skip
    # every submitter ready (its imports done), then the gate opens for all at once
    wait(lambda: len(list(tmp_path.glob("go.ready.*"))) == len(procs), 60, "the submitters")
    gate.touch()
    handles = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        handles.append(out.strip())
    assert len(set(handles)) == 1, handles
    app_id = handles[0].rsplit("/", 1)[1]
    cluster.jobs.append(app_id)
    assert cluster.wait_done(app_id).state == AppState.SUCCEEDED
    # exactly one job carries the key; every other submission was cancelled before it ran
    jobs = cluster.sched.client(cluster.name).user_jobs()
    from core.schedulers.slurm.script import comment_key, key_token

    with_key = [j for j, info in jobs.items() if comment_key(info.comment) == key_token(key)]
    assert with_key == [cluster.job_id(app_id)]
    losers = [j for j, info in jobs.items() if f"shipyard-lost={key_token(key)}" in info.comment]
    assert len(losers) <= 3
    for j in losers:
        assert jobs[j].state == "CANCELLED" and not any(
            c.nodes for c in jobs[j].components.values()
        )
    assert list(cluster.sched.log_iter(app_id, "w", 0)) == ["ran\n"]


def test_a_held_job_of_a_crashed_submitter_is_finished_by_the_retry(cluster: Cluster) -> None:
    # a submitter that died between queueing its held job and releasing it
    key = f"crashed-{uuid.uuid4().hex}"
    app = AppDef("held", [Role("w", entrypoint="/bin/echo", args=["done"])])
    sched = cluster.sched
    req = sched.submit_dryrun(app, cluster.cfg(), idempotency_key=key).request
    client = sched.client(cluster.name)
    orphan = client.submit(req, req.job_dir or sched.default_dir(cluster.name), hold=True)
    orphan_id = f"{cluster.name}:{orphan}" if cluster.name else orphan
    cluster.jobs.append(orphan_id)
    d = sched.describe(orphan_id)
    assert d is not None and d.state == AppState.PENDING and "JobHeldUser" in d.msg
    with get_runner("held") as runner:
        handle = runner.run(app, "slurm", cluster.cfg(), idempotency_key=key)
        assert handle.endswith(f"/{orphan_id}")  # the retry re-attaches ... and releases it
        status = runner.wait(handle, timeout=90)
        assert status is not None and status.state == AppState.SUCCEEDED


def test_a_job_id_seen_before_in_its_directory_starts_clean(cluster: Cluster) -> None:
    """Two clusters sharing a directory (or a controller whose ids started again) run jobs of
    the same id there: what the earlier one left (log lines, results, retry counts) is not
    this job's."""
    app = AppDef("again", [Role("w", entrypoint="/bin/echo", args=["fresh"])])
    sched = cluster.sched
    req = sched.submit_dryrun(app, cluster.cfg()).request
    client = sched.client(cluster.name)
    workdir = req.job_dir or sched.default_dir(cluster.name) or os.getcwd()
    job = client.submit(req, workdir, hold=True)
    app_id = f"{cluster.name}:{job}" if cluster.name else job
    cluster.jobs.append(app_id)
    files = client.files or LocalFiles()
    files.write(f"{workdir}/slurm-{job}-w-0.out", b"stale line\n")
    files.mkdir(f"{workdir}/shipyard-results-{job}")
    files.write(f"{workdir}/shipyard-results-{job}/w-0.json", b'{"stale": true}')
    client.release(job)
    assert cluster.wait_done(app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "w", 0)) == ["fresh\n"]
    assert [(r.name, r.present) for r in sched.read_results(app_id)] == [("w/0", False)]


def test_in_process_cluster_with_secrets_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an Airflow connection or a Prefect block hands over: the key and the token
    themselves, never a file of the client's."""
    use_remote_clusters(monkeypatch, tmp_path)
    monkeypatch.delenv("SHIPYARD_CLUSTERS")
    key = Path(REMOTE_DIR, "userkey").read_text()
    name = f"mem-{uuid.uuid4().hex[:6]}"
    config = ClusterConfig(**{**_rest(name, token=Secret(_token())), "host": "127.0.0.1",
                              "port": 2222, "private_key": Secret(key),
                              "known_hosts": os.path.join(REMOTE_DIR, "known_hosts")})  # fmt: skip
    assert key.strip()[-20:] not in repr(config)
    register_cluster(config)
    app = AppDef("mem", [Role("w", entrypoint="/bin/echo", args=["in memory"])])
    with get_runner("mem") as runner:
        h = runner.run(app, "slurm", {"cluster": name})
        status = runner.wait(h, timeout=90)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert list(runner.log_lines(h, "w", 0)) == ["in memory\n"]


@pytest.mark.parametrize("version", rest_v0042.VERSIONS)
def test_each_api_version_of_slurm_26_runs_a_het_job_and_reads_its_accounting(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No API version ships untested: a client without any Slurm command pins each version
    slurmrestd 26.05 serves, runs a het job with a failing role, and reads both the
    controller's and accounting's record of it."""
    require("slurm26", slurm26_problem())
    use_remote_clusters(monkeypatch, tmp_path)
    rest26 = load_clusters(os.path.join(REMOTE_DIR, "clusters.yaml"))["rest26"]
    name = f"v{version[-2:]}-{uuid.uuid4().hex[:6]}"
    register_cluster(dataclasses.replace(rest26, name=name, api_version=version))
    sh = "/bin/sh"
    app = AppDef(
        "het",
        [Role("ok", entrypoint=sh, args=["-c", "echo ok"]),
         Role("bad", entrypoint=sh, args=["-c", "echo bad >&2; exit 3"])],
    )  # fmt: skip
    caplog.set_level(logging.DEBUG, logger="core.schedulers.slurm.rest")
    sched = SlurmScheduler("test")
    try:
        app_id = sched.submit(app, {"cluster": name})
        done = wait(lambda: _ended(sched, app_id), 90, f"the het job over {version}")
        assert f"slurmrestd API {version}" in caplog.text
        codes = {(r.role, r.exit_code) for rs in done.roles_statuses for r in rs.replicas}
        assert done.state == AppState.FAILED and codes == {("ok", 0), ("bad", 3)}, done
        client = sched.client(name)
        acct = wait(lambda: client.accounting_jobs([app_id.partition(":")[2]]), 60, "accounting")
        info = acct[app_id.partition(":")[2]]
        assert sorted(c.exit_code for c in info.components.values()) == [0, 3]
        assert list(sched.log_iter(app_id, "bad", 0, streams=Stream.STDERR)) == ["bad\n"]
    finally:
        sched.close()


def test_a_pinned_api_version_the_server_lacks_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("slurm26", slurm26_problem())
    use_remote_clusters(monkeypatch, tmp_path)
    rest26 = load_clusters(os.path.join(REMOTE_DIR, "clusters.yaml"))["rest26"]
    name = f"pinned-{uuid.uuid4().hex[:6]}"
    register_cluster(dataclasses.replace(rest26, name=name, api_version="v0.0.38"))
    app = AppDef("never", [Role("w", entrypoint="/bin/true")])
    with get_runner("pin") as runner, pytest.raises(ClusterError) as err:
        runner.run(app, "slurm", {"cluster": name})
    assert re.search(
        r"api_version: .* offers API versions v0.0.42, v0.0.43, v0.0.44, v0.0.45;"
        r" shipyard was asked for v0.0.38",
        str(err.value),
    ), err.value


@pytest.mark.parametrize("transport", ["rest", "rest-26"])
def test_an_expired_token_is_fetched_again_while_a_job_is_followed(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token that expires mid-follow is fetched again from token_command, once, on both
    releases (22.05 says "Unspecified error", 26.05 "Protocol authentication error" with
    HTTP 511, 422 or 502 by path)."""
    use_remote_clusters(monkeypatch, tmp_path)
    release = slurm_release(transport)
    calls = tmp_path / "token-calls"
    command = tmp_path / "token.sh"
    command.write_text(
        f"#!/bin/sh\necho made >> {calls}\n"
        f"exec {release.bin}/scontrol token username={REMOTE_USER} lifespan=3\n"
    )
    command.chmod(0o755)
    base = load_clusters(os.path.join(REMOTE_DIR, "clusters.yaml"))[
        "rest-api" if transport == "rest" else "rest26"
    ]
    name = f"tok-{uuid.uuid4().hex[:6]}"
    register_cluster(dataclasses.replace(base, name=name, token_command=str(command)))
    sched = SlurmScheduler("test")
    try:
        app_id = sched.submit(AppDef("tok", [Role("w", entrypoint="sleep", args=["6"])]),
                              {"cluster": name})  # fmt: skip
        made = time.monotonic()
        assert sched.describe(app_id) is not None
        wait(lambda: time.monotonic() - made > 4, 10, "the first token to expire")
        done = wait(lambda: _ended(sched, app_id), 90, "the job to end")
        assert done.state == AppState.SUCCEEDED, done
        assert calls.read_text().split() == ["made", "made"]  # (once more, not per call)
    finally:
        sched.close()


def _ended(sched: SlurmScheduler, app_id: str) -> DescribeAppResponse | None:
    desc = sched.describe(app_id)
    return desc if desc is not None and is_terminal(desc.state) else None


def _sshd_children() -> set[int]:
    """The sshd processes serving one connection each (children of the login node's sshd)."""
    master = int(Path("/run/shipyard-sshd.pid").read_text())
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(master)], capture_output=True, text=True
    )
    return {int(p) for p in out.stdout.split()}


def test_a_dropped_ssh_connection_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for c in make_cluster("ssh", tmp_path, monkeypatch):
        # a cluster of its own: a connection of its own, made by the submit below
        c.name = f"drop-{uuid.uuid4().hex[:6]}"
        register_cluster(ClusterConfig(**{**_base(c.name), "remote_dir": c.remote_dir}))
        before = _sshd_children()
        app = AppDef(
            "drop", [Role("w", entrypoint="/bin/sh", args=["-c", "sleep 3; echo survived"])]
        )
        app_id = c.submit(app)
        ours = _sshd_children() - before
        assert ours, "no sshd process serves this client"
        for pid in ours:  # the login node drops our connection mid-wait
            os.kill(pid, signal.SIGKILL)
        done = c.wait_done(app_id)
        assert done.state == AppState.SUCCEEDED
        assert list(c.sched.log_iter(app_id, "w", 0)) == ["survived\n"]


LONG_LINES = textwrap.dedent(
    """
    import sys
    for n in (1024, 16 * 1024 + 1, 1 << 20, 8 << 20):
        sys.stdout.write("%d:" % n + "x" * n + "\\n")
        sys.stdout.flush()
    sys.stdout.write("end\\n")
    """
)


def test_long_lines_arrive_whole_while_tailing(cluster: Cluster) -> None:
    app = AppDef("long", [Role("w", entrypoint=cluster.python, args=["-c", LONG_LINES])])
    app_id = cluster.submit(app)
    lines = list(cluster.sched.log_iter(app_id, "w", 0, should_tail=True))
    sizes = [1024, 16 * 1024 + 1, 1 << 20, 8 << 20]
    assert [len(line) for line in lines] == [len(f"{n}:") + n + 1 for n in sizes] + [4]
    assert all(line.endswith("\n") for line in lines)
    assert lines[-1] == "end\n"
