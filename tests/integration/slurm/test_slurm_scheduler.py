"""The slurm scheduler: the generated batch script, bad input, and real jobs on the real
three-node cluster with accounting (scripts/start_slurm.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.api import Stream
from core.schedulers.slurm import jobinfo, logs
from core.schedulers.slurm.transport import LocalFiles, LocalShell
from core.schedulers.slurm_scheduler import (
    SLURM_STATES,
    SlurmBatchRequest,
    SlurmReplicaRequest,
    SlurmScheduler,
    create_scheduler,
)
from core.specs import (
    AppDef,
    AppState,
    BindMount,
    Resource,
    RetryPolicy,
    Role,
    is_terminal,
    macros,
)
from tests.helpers import ROOT
from tests.integration.slurm.slurm_clusters import (
    CLUSTERS,
    SLOW_CLUSTERS,
    Cluster,
    make_cluster,
    wait,
)
from tests.unit.core.hostile_inputs import AWKWARD_STRINGS, injection_strings

SNAPSHOTS = Path(__file__).parent / "snapshots"
PY = sys.executable


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


_wait = wait


@pytest.fixture(params=CLUSTERS)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    """The real clusters (22.05, 26.05) through each transport: this host's commands, SSH,
    slurmrestd."""
    yield from make_cluster(request.param, tmp_path, monkeypatch)


@pytest.fixture
def local_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The real cluster through this host's commands only."""
    yield from make_cluster("local", tmp_path, monkeypatch)


def _sh(script: str) -> list[str]:
    return ["-c", script]


def _replicas(desc: Any) -> dict[tuple[str, int], Any]:
    return {(r.role, r.id): r for rs in desc.roles_statuses for r in rs.replicas}


def _elsewhere(tmp_path: Path, code: str, *args: str) -> Any:
    """Runs ``code`` in a new Python process in another directory; returns its JSON output."""
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [PY, "-c", textwrap.dedent(code), *args],
        cwd=other,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


DESCRIBE_ELSEWHERE = """
import json, sys
from core.schedulers.slurm_scheduler import create_scheduler
d = create_scheduler("other").describe(sys.argv[1])
print(json.dumps(None if d is None else {
    "state": d.state.name,
    "num_restarts": d.num_restarts,
    "replicas": [[r.role, r.id, r.state.name, r.exit_code, r.hostname]
                 for rs in d.roles_statuses for r in rs.replicas],
}))
"""

LOGS_ELSEWHERE = """
import json, sys
from core.schedulers.slurm_scheduler import create_scheduler
s = create_scheduler("other")
print(json.dumps(list(s.log_iter(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                 should_tail=sys.argv[4] == "tail"))))
"""


def _accounted(cluster: Cluster, app_id: str, components: int) -> Any:
    """The job as accounting records it, once accounting has its final state (the record of a
    het job is briefly one "allocation" before its components are recorded)."""
    job_id = cluster.job_id(app_id)

    def check() -> Any:
        client = cluster.sched.client(cluster.name)
        info = (client.accounting_jobs([job_id]) or {}).get(job_id)
        if info is None or len(info.components) != components:
            return None
        return (
            info
            if info is not None and is_terminal(SLURM_STATES.get(info.state, AppState.UNKNOWN))
            else None
        )

    return _wait(check, 30, f"accounting to record the end of job {job_id}")


def _two_role_app(
    trainer: str = "echo trainer $SHIPYARD_REPLICA_ID", ps: str = "echo ps"
) -> AppDef:
    res = Resource(cpu=2, gpu=0, memMB=256)
    return AppDef(
        "tworole",
        [
            Role("trainer", entrypoint="/bin/sh", args=_sh(trainer), num_replicas=2, resource=res),
            Role("ps", entrypoint="/bin/sh", args=_sh(ps), num_replicas=1, resource=res),
        ],
    )


# ---------------------------------------------------------------------------------------------
# the batch script (no cluster needed)
# ---------------------------------------------------------------------------------------------


def _offline_scheduler(mem: dict[str, int] | None = None) -> SlurmScheduler:
    s = create_scheduler("snap")
    # a fixed partition table, so the script does not depend on the cluster (nomem lookup)
    s._partitions[None] = (dict(mem or {"debug": 4000}), "debug")
    return s


def _snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("SHIPYARD_UPDATE_SNAPSHOTS") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs (SHIPYARD_UPDATE_SNAPSHOTS=1 to update)"


def test_dryrun_script_snapshot_two_roles() -> None:
    s = _offline_scheduler()
    app = AppDef(
        "snap",
        [
            Role(
                "trainer",
                entrypoint="python",
                args=["-m", "train", "--rank0-env", macros.rank0_env, "--id", macros.app_id],
                env={"LR": "0.1", "MSG": "it's $HOME"},
                num_replicas=2,
                resource=Resource(cpu=2, gpu=0, memMB=1024),
            ),
            Role("ps", entrypoint="/bin/echo", args=[f"replica {macros.replica_id}"]),
        ],
    )
    cfg = {
        "partition": "debug",
        "time": "1:30:00",
        "comment": 'say "hi" \\ there',
        "constraint": "fast&big",
        "mail-user": "me@example.com",
        "mail-type": "END,FAIL",
        "job_dir": "/nonexistent/shipyard-snapshot-dir",
    }
    info = s.submit_dryrun(app, cfg)
    text = str(info)
    _snapshot("slurm_two_roles.sh", text)
    # the printable form is the whole script, the same as the request's
    assert text == info.request.materialize()
    assert info.request.job_dir == "/nonexistent/shipyard-snapshot-dir"
    # components that ask for no memory come first (no --mem is carried over to them); rank 0
    # is still trainer-0's node, wherever its component is
    assert list(info.request.replicas) == ["ps-0", "trainer-0", "trainer-1"]
    assert 'SHIPYARD_RANK0_HOST="${SLURM_JOB_NODELIST_HET_GROUP_1:-' in text


def test_dryrun_script_snapshot_retries_key_and_nomem() -> None:
    s = _offline_scheduler({"tiny": 500})
    app = AppDef(
        "retry",
        [
            Role(
                "worker",
                entrypoint="/bin/true",
                max_retries=3,
                resource=Resource(cpu=1, gpu=0, memMB=2048),
            )
        ],
    )
    info = s.submit_dryrun(
        app, {"partition": "tiny", "comment": "mine"}, idempotency_key="run 42/attempt"
    )
    text = str(info)
    _snapshot("slurm_retries.sh", text)
    assert "--mem" not in text  # the partition's RealMemory is under 1 GB
    assert "--requeue" in text and "scontrol requeue" in text and "-lt 3 ]" in text
    assert '--comment="mine shipyard-key=sha256-' in text  # user's comment kept, key hashed
    assert "hetjob" not in text  # a single replica is a plain job


def test_replica_request_from_role_and_materialize() -> None:
    role = Role(
        "w",
        entrypoint="run me",
        args=["a b", "${app_id}-x"],
        env={"K": "v,w=1"},
        resource=Resource(cpu=3, gpu=1, memMB=100),
    )
    req = SlurmReplicaRequest.from_role("w-0", role, {"partition": "p", "time": "5"}, nomem=False)
    assert req.sbatch_opts == {
        "job-name": "w-0",
        "ntasks": "1",
        "partition": "p",
        "time": "5",
        "cpus-per-task": "3",
        "mem": "100",
        "gpus-per-task": "1",
    }
    sbatch, srun = req.materialize()
    assert "--job-name=w-0" in sbatch and "--gpus-per-task=1" in sbatch
    assert srun[0] == '--output=slurm-"$SLURM_JOB_ID"-w-0.out'
    assert srun[-4:] == ["shipyard-replica", "'run me'", "'a b'", '"$SLURM_JOB_ID"-x']
    # the value is exported by the script under a private name, never on srun's command line
    assert not any("v,w=1" in token for token in srun)
    assert req.env_exports(0) == ["export SHIPYARD_ENV_0_0=v,w=1"]
    nomem = SlurmReplicaRequest.from_role("w-0", role, {}, nomem=True)
    assert "mem" not in nomem.sbatch_opts
    batch = SlurmBatchRequest(["sbatch"], {"w-0": req}, None, 0)
    assert batch.materialize().count("srun") == 1


def test_app_ids_with_a_trailing_newline_are_not_jobs() -> None:
    s = _offline_scheduler()
    for bad in ("123\n", "hpc1:123\n", " 123", "123 ", "12 3"):
        with pytest.raises(ValueError, match="not a slurm app id"):
            list(s.log_iter(bad, "r"))  # refused before any cluster is asked


def test_components_without_memory_do_not_inherit_it() -> None:
    # sbatch carries --mem from one het component to the next unless it is given again
    s = _offline_scheduler()
    app = AppDef(
        "mix",
        [
            Role("a", entrypoint="x", resource=Resource(cpu=1, gpu=0, memMB=512)),
            Role("b", entrypoint="x"),
        ],
    )
    info = s.submit_dryrun(app, {})
    req = info.request
    assert req.replicas["a-0"].sbatch_opts["mem"] == "512"
    # b asks for nothing, and gets nothing: it comes first, so nothing is carried over to it
    assert "mem" not in req.replicas["b-0"].sbatch_opts
    assert list(req.replicas) == ["b-0", "a-0"]
    assert "--mem=0" not in str(info)


def test_run_opts_and_states() -> None:
    opts = create_scheduler("x").run_opts()
    assert [k for k, _ in opts] == [
        "partition",
        "time",
        "comment",
        "constraint",
        "mail-user",
        "mail-type",
        "job_dir",
        "cluster",
        "dependency",  # issue 26: what Runner.run(after=...) sets
        "result_replicas",  # issue 19: whose results Runner.result reads
        "time_limit",  # issue 27: the time limit every backend takes
        "checkpoint_signal",
        "checkpoint_grace",
        "max_requeues",  # issue 27: requeue on preemption, node failure (and the time limit)
        "requeue_on_timeout",
        "exclude_failed_nodes",  # issue 27: a requeue after a node failure kept off the node
        "container_runtime",  # issue 28: roles in their images (srun --container)
    ]
    assert SLURM_STATES["COMPLETED"] == AppState.SUCCEEDED
    assert SLURM_STATES["OUT_OF_MEMORY"] == AppState.FAILED
    assert SLURM_STATES["REQUEUED"] == AppState.PENDING
    assert all(isinstance(v, AppState) for v in SLURM_STATES.values())


@pytest.mark.parametrize(
    "good", ["10", "10:30", "1:02:03", "2-12", "2-12:30", "2-12:30:15", "UNLIMITED"]
)
def test_valid_time_formats(good: str) -> None:
    _offline_scheduler().submit_dryrun(_two_role_app(), {"time": good})


@pytest.mark.parametrize("bad", ["1h", "1:2:3:4", "-5", "1-", "ten", "1.5", "1-2-3", "1 2"])
def test_invalid_time_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match=r"cfg\.time: expected .*got"):
        _offline_scheduler().submit_dryrun(_two_role_app(), {"time": bad})


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"partition": "a b"}, r"cfg\.partition"),
        ({"partition": "$(x)"}, r"cfg\.partition"),
        ({"mail-type": "END,SOMETIMES"}, r"cfg\.mail-type"),
        ({"mail-user": "a b@c"}, r"cfg\.mail-user"),
        ({"comment": "line1\nline2"}, r"cfg\.comment: expected a string without control"),
        ({"comment": "x\n#SBATCH --wrap=id"}, r"cfg\.comment"),
        ({"constraint": "a\rb"}, r"cfg\.constraint"),
        ({"bogus": "1"}, r"cfg: unknown option"),
    ],
)
def test_bad_cfg_is_a_clear_error(cfg: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _offline_scheduler().submit_dryrun(_two_role_app(), cfg)


def test_existing_job_dir_is_rejected_before_anything_is_queued(tmp_path: Path) -> None:
    s = _offline_scheduler()
    with pytest.raises(ValueError, match=r"cfg\.job_dir: must not exist"):
        s.submit_dryrun(_two_role_app(), {"job_dir": str(tmp_path)})
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(ValueError, match=r"cfg\.job_dir: must not exist"):
        s.submit(_two_role_app(), {"job_dir": str(tmp_path)}, workspace=str(ws))


def test_unsupported_role_features_are_clear_errors() -> None:
    s = _offline_scheduler()
    app = AppDef(
        "x",
        [Role("a", entrypoint="x", max_retries=1, retry_policy=RetryPolicy.REPLICA)],
    )
    with pytest.raises(ValueError, match=r"roles\[0\]\.retry_policy: slurm supports only"):
        s.submit_dryrun(app, {})
    app = AppDef("x", [Role("a", entrypoint="x", mounts=[BindMount("/a", "/b")])])
    with pytest.raises(ValueError, match=r"roles\[0\]\.mounts"):
        s.submit_dryrun(app, {})


def test_combined_stream_is_rejected() -> None:
    with pytest.raises(ValueError, match="streams: combined is not supported"):
        create_scheduler("x").log_iter("1", "a", 0, streams=Stream.COMBINED)


def test_exit_code_parsing() -> None:
    assert jobinfo.wait_status_code("768") == 3
    assert jobinfo.wait_status_code("9") == -9
    assert jobinfo.wait_status_code("0") == 0
    assert jobinfo.wait_status_code("N/A") is None
    assert jobinfo.colon_code("3:0") == 3
    assert jobinfo.colon_code("0:15") == -15
    assert jobinfo.split_name("my-role-12") == ("my-role", 12)


# sacct -D output (JobID,JobName,State,ExitCode,NodeList,WorkDir,Comment) as recorded on the
# test cluster: an older job 21 whose id was reused, then job 21 failing once and requeued.
SACCT_REQUEUED = """\
21|old-0|COMPLETED|0:0|node3|/old|
21.batch|batch|COMPLETED|0:0|node3||
21+0|a-0|REQUEUED|0:0|node1|/tmp/slx|c
21+0.batch|batch|FAILED|5:0|node1||
21+0.0|sh|FAILED|5:0|node1||
21+1|b-0|REQUEUED|0:0|node2|/tmp/slx|c
21+1.0|sh|COMPLETED|0:0|node2||
21+0|a-0|COMPLETED|0:0|node1|/tmp/slx|c
21+0.batch|batch|COMPLETED|0:0|node1||
21+0.0|sh|COMPLETED|0:0|node1||
21+1|b-0|COMPLETED|0:0|node2|/tmp/slx|c
21+1.0|sh|CANCELLED by 0|0:15|node2||
"""


def test_parse_sacct_keeps_the_last_attempt_of_the_newest_job() -> None:
    out = SACCT_REQUEUED.replace("|", jobinfo.SEP)
    info = jobinfo.parse_sacct(out)["21"]
    assert (info.state, info.restarts, info.workdir, info.comment) == (
        "COMPLETED",
        1,
        "/tmp/slx",
        "c",
    )
    assert sorted(info.components) == [0, 1]
    d = jobinfo.to_response(info)
    assert d.state == AppState.SUCCEEDED and d.num_restarts == 1
    reps = _replicas(d)
    assert (reps[("a", 0)].state, reps[("a", 0)].exit_code) == (AppState.SUCCEEDED, 0)
    assert (reps[("b", 0)].state, reps[("b", 0)].exit_code) == (AppState.CANCELLED, -15)


def test_a_bare_colon_argument_is_not_a_het_separator() -> None:
    # srun splits its command line at every bare ":" even among the program's arguments
    role = Role("w", entrypoint="/bin/echo", args=["a", ":", "${app_id}"])
    _, srun = SlurmReplicaRequest.from_role("w-0", role, {}, nomem=False).materialize()
    assert ":" not in srun
    assert srun[-3:-1] == ["/bin/sh", "-c"]
    assert "exec /bin/echo a : " in srun[-1] and "$SHIPYARD_APP_ID" in srun[-1]
    # an entrypoint with "=" is a program name, never a variable assignment
    role = Role("w", entrypoint="X=1", args=["touch", "/tmp/x"])
    _, srun = SlurmReplicaRequest.from_role("w-0", role, {}, nomem=False).materialize()
    assert srun[-3:] == ["X=1", "touch", "/tmp/x"] and 'exec "$@"' in srun[-5]


def test_read_lines_never_splits_a_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "CHUNK", 7)  # many buffer boundaries
    lines = ["short\n", "a much longer line than the chunk\n", "cr\rinside\n", "\n", "日本語🚀\n"]
    lines += ["form\x0cfeed\n", "partial"]
    path = tmp_path / "log"
    path.write_text("".join(lines), newline="")
    assert list(logs.read_lines(LocalFiles(), str(path))) == lines
    assert list(logs.read_lines(LocalFiles(), str(tmp_path / "missing"))) == []


def test_read_lines_tails_until_ended(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text("one\ntw")
    calls = {"n": 0}

    def ended() -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            with open(path, "a") as f:
                f.write("o\nthree\n")
            return False
        return True

    assert list(logs.read_lines(LocalFiles(), str(path), ended)) == ["one\n", "two\n", "three\n"]


def test_a_read_left_half_way_closes_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "CHUNK", 4)
    path = tmp_path / "log"
    path.write_text("one\ntwo\nthree\n")
    opened: list[Any] = []

    class Recording(LocalFiles):
        def open_reader(self, p: str, offset: int = 0) -> Any:
            opened.append(super().open_reader(p, offset))
            return opened[-1]

    lines = logs.read_lines(Recording(), str(path))
    assert next(lines) == "one\n"
    assert not opened[0].closed
    del lines  # a consumer that stops early (a tail given up) lets go of the iterator
    assert opened[0].closed


# ---------------------------------------------------------------------------------------------
# the real cluster
# ---------------------------------------------------------------------------------------------


def test_two_role_app_pending_running_completed_from_elsewhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    gate = cluster.scratch / "gate"
    # a blocker that holds every node's CPUs, so the app must wait (PENDING) behind it
    blocker = AppDef(
        "blocker",
        [
            Role(
                "hold",
                entrypoint="/bin/sh",
                args=_sh(f"while [ ! -e {gate} ]; do sleep 0.2; done"),
                num_replicas=3,
                resource=Resource(cpu=2, gpu=0, memMB=-1),
            )
        ],
    )
    blocker_id = cluster.submit(blocker)
    cluster.wait_state(blocker_id, {AppState.RUNNING})

    app = _two_role_app(
        trainer=f"while [ ! -e {gate}.2 ]; do sleep 0.2; done; echo trainer $SHIPYARD_REPLICA_ID",
        ps=f"while [ ! -e {gate}.2 ]; do sleep 0.2; done; echo ps on $(hostname)",
    )
    job_id = cluster.submit(app)
    pending = cluster.sched.describe(job_id)
    assert pending is not None and pending.state == AppState.PENDING
    assert sorted(_replicas(pending)) == [("ps", 0), ("trainer", 0), ("trainer", 1)]
    assert all(
        r.state == AppState.PENDING and r.exit_code is None for r in _replicas(pending).values()
    )
    seen = _elsewhere(tmp_path, DESCRIBE_ELSEWHERE, job_id)
    assert seen["state"] == "PENDING" and len(seen["replicas"]) == 3

    gate.touch()
    cluster.wait_done(blocker_id)
    running = cluster.wait_state(job_id, {AppState.RUNNING})
    hosts = {key: r.hostname for key, r in _replicas(running).items()}
    assert len(set(hosts.values())) == 3, hosts  # one node per component
    seen = _elsewhere(tmp_path, DESCRIBE_ELSEWHERE, job_id)
    assert seen["state"] == "RUNNING"
    assert {r[2] for r in seen["replicas"]} == {"RUNNING"}

    Path(f"{gate}.2").touch()
    done = cluster.wait_done(job_id)
    assert done.state == AppState.SUCCEEDED
    assert {k: (r.state, r.exit_code) for k, r in _replicas(done).items()} == {
        ("trainer", 0): (AppState.SUCCEEDED, 0),
        ("trainer", 1): (AppState.SUCCEEDED, 0),
        ("ps", 0): (AppState.SUCCEEDED, 0),
    }
    seen = _elsewhere(tmp_path, DESCRIBE_ELSEWHERE, job_id)
    assert seen["state"] == "SUCCEEDED"
    assert sorted(r[:4] for r in seen["replicas"]) == [
        ["ps", 0, "SUCCEEDED", 0],
        ["trainer", 0, "SUCCEEDED", 0],
        ["trainer", 1, "SUCCEEDED", 0],
    ]
    # logs, read from another process in another directory (found through Slurm's WorkDir)
    assert _elsewhere(tmp_path, LOGS_ELSEWHERE, job_id, "trainer", "1", "no") == ["trainer 1\n"]
    assert _elsewhere(tmp_path, LOGS_ELSEWHERE, job_id, "ps", "0", "no")[0].startswith("ps on ")
    # accounting has the same answer (what describe uses once the controller forgets the job)
    acct = _accounted(cluster, job_id, 3)
    from_acct = jobinfo.to_response(acct)
    assert from_acct.state == AppState.SUCCEEDED
    assert {k: r.exit_code for k, r in _replicas(from_acct).items()} == {
        ("trainer", 0): 0,
        ("trainer", 1): 0,
        ("ps", 0): 0,
    }
    assert {r.hostname for r in _replicas(from_acct).values()} == set(hosts.values())
    if cluster.transport != "rest":  # (the same sacct has the usage: slurmrestd's is not read)
        assert acct.usage is not None and set(acct.usage) == {"trainer-0", "trainer-1", "ps-0"}
        assert all(u.wall_time is not None for u, _ in acct.usage.values()), acct.usage


def test_failing_replica_gives_failed_with_its_exit_code(cluster: Cluster) -> None:
    job_id = cluster.submit(_two_role_app(ps="echo failing >&2; exit 3"))
    done = cluster.wait_done(job_id)
    assert done.state == AppState.FAILED
    reps = _replicas(done)
    assert (reps[("ps", 0)].state, reps[("ps", 0)].exit_code) == (AppState.FAILED, 3)
    assert (reps[("trainer", 0)].state, reps[("trainer", 0)].exit_code) == (AppState.SUCCEEDED, 0)
    assert list(cluster.sched.log_iter(job_id, "ps", 0, streams=Stream.STDERR)) == ["failing\n"]
    assert list(cluster.sched.log_iter(job_id, "ps", 0)) == []
    acct = _accounted(cluster, job_id, 3)
    acct_reps = _replicas(jobinfo.to_response(acct))
    # (slurmrestd 22.05's accounting API reports 0 for a failed step's code: unknown, not 0)
    code = None if (cluster.transport, cluster.release) == ("rest", "22.05") else 3
    assert acct_reps[("ps", 0)].exit_code == code and acct_reps[("ps", 0)].state == AppState.FAILED
    assert acct_reps[("trainer", 1)].exit_code == 0


def test_cancel_is_idempotent(cluster: Cluster) -> None:
    job_id = cluster.submit(_two_role_app(trainer="sleep 300", ps="sleep 300"))
    cluster.wait_state(job_id, {AppState.RUNNING})
    # not this job's id: a trailing newline or a space is not read as the job (scancel is
    # synchronous in the controller: a cancelled job would read CANCELLED at once)
    for malformed in (f"{job_id}\n", f" {job_id}", f"{job_id} "):
        cluster.sched.cancel(malformed)
        assert cluster.sched.describe(malformed) is None
    running = cluster.sched.describe(job_id)
    assert running is not None and running.state == AppState.RUNNING
    cluster.sched.cancel(job_id)
    done = cluster.wait_done(job_id)
    assert done.state == AppState.CANCELLED
    assert {r.state for r in _replicas(done).values()} == {AppState.CANCELLED}
    cluster.sched.cancel(job_id)  # again: nothing happens
    unknown = job_id.replace(cluster.job_id(job_id), "999999999")
    cluster.sched.cancel(unknown)  # unknown: nothing happens
    assert cluster.sched.describe(unknown) is None
    assert cluster.sched.describe("not-a-job") is None


def test_job_dir_workspace_runs_in_its_snapshot(cluster: Cluster, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.sh").write_text("echo from workspace in $(pwd)\n")
    (ws / "data.txt").write_text("payload\n")
    job_dir_cfg, job_dir = cluster.job_dir("job")
    script = "sh hello.sh; cat data.txt; echo img=$0"
    app = AppDef("ws", [Role("main", entrypoint="/bin/sh", args=[*_sh(script), macros.img_root])])
    # a pre-flight makes no snapshot (the submit would find its job_dir there)
    runner = Runner("test", {"slurm": lambda session, **kw: cluster.sched})
    cfg = cluster.cfg({"job_dir": job_dir_cfg})
    assert [p for p in runner.preflight(app, "slurm", cfg, str(ws)) if p.is_error] == []
    in_snapshot = AppDef("ws", [Role("main", entrypoint=f"{macros.img_root}/hello.sh")])
    assert [p for p in runner.preflight(in_snapshot, "slurm", cfg, str(ws)) if p.is_error] == []
    assert not job_dir.exists()
    missing = runner.preflight(app, "slurm", cfg, str(tmp_path / "no-such-ws"))
    assert [p.field for p in missing if p.is_error] == ["workspace"]
    job_id = cluster.submit(app, {"job_dir": job_dir_cfg}, workspace=str(ws))
    (ws / "data.txt").write_text("changed after submit\n")  # the job sees the snapshot
    done = cluster.wait_done(job_id)
    assert done.state == AppState.SUCCEEDED
    assert (job_dir / "hello.sh").exists() and (job_dir / "shipyard-sbatch.sh").exists()
    # the script holds the replicas' environment: readable by its owner only
    assert (job_dir / "shipyard-sbatch.sh").stat().st_mode & 0o077 == 0
    out = job_dir / f"slurm-{cluster.job_id(job_id)}-main-0.out"
    assert out.read_text() == f"from workspace in {job_dir}\npayload\nimg={job_dir}\n"
    assert (job_dir / f"slurm-{cluster.job_id(job_id)}-main-0.err").exists()
    assert _elsewhere(
        tmp_path, LOGS_ELSEWHERE, job_id, "main", "0", "no"
    ) == out.read_text().splitlines(keepends=True)
    # the same job_dir again: refused before anything is queued
    with pytest.raises(ValueError, match=r"cfg\.job_dir: must not exist"):
        cluster.submit(app, {"job_dir": job_dir_cfg}, workspace=str(ws))
    # a job_dir without a workspace is created, and the job runs there
    job_dir2_cfg, job_dir2 = cluster.job_dir("job2")
    app2 = AppDef("nows", [Role("main", entrypoint="/bin/pwd")])
    job2 = cluster.submit(app2, {"job_dir": job_dir2_cfg})
    assert cluster.wait_done(job2).state == AppState.SUCCEEDED
    out2 = job_dir2 / f"slurm-{cluster.job_id(job2)}-main-0.out"
    assert out2.read_text() == f"{job_dir2}\n"


@pytest.mark.parametrize("cluster", SLOW_CLUSTERS, indirect=True)
def test_max_retries_requeues_the_job(cluster: Cluster, tmp_path: Path) -> None:
    job_dir_cfg, _ = cluster.job_dir("retry")
    marker = cluster.scratch / "attempted"
    app = AppDef(
        "retry",
        [
            Role(
                "flaky",
                entrypoint="/bin/sh",
                args=_sh(
                    f"echo attempt ${{SLURM_RESTART_COUNT:-0}}; "
                    f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 7"
                ),
                max_retries=2,
            ),
            Role("steady", entrypoint="/bin/echo", args=["steady"]),
        ],
    )
    job_id = cluster.submit(app, {"job_dir": job_dir_cfg})
    done = cluster.wait_done(job_id, timeout=150)
    assert done.state == AppState.SUCCEEDED
    assert done.num_restarts == 1
    assert {k: r.exit_code for k, r in _replicas(done).items()} == {
        ("flaky", 0): 0,
        ("steady", 0): 0,
    }
    # logs of both attempts are kept
    assert list(cluster.sched.log_iter(job_id, "flaky", 0)) == ["attempt 0\n", "attempt 1\n"]
    seen = _elsewhere(tmp_path, DESCRIBE_ELSEWHERE, job_id)
    assert seen["state"] == "SUCCEEDED" and seen["num_restarts"] == 1


@pytest.mark.parametrize("cluster", SLOW_CLUSTERS, indirect=True)
def test_max_retries_exhausted_fails(cluster: Cluster) -> None:
    app = AppDef(
        "retryfail", [Role("bad", entrypoint="/bin/sh", args=_sh("exit 4"), max_retries=1)]
    )
    job_id = cluster.submit(app)
    done = cluster.wait_done(job_id, timeout=150)
    assert done.state == AppState.FAILED and done.num_restarts == 1
    assert _replicas(done)[("bad", 0)].exit_code == 4


def test_log_iter_tails_until_the_job_ends(cluster: Cluster, tmp_path: Path) -> None:
    app = AppDef(
        "tail",
        [
            Role(
                "w",
                entrypoint="/bin/sh",
                args=_sh("for i in 1 2 3 4 5; do echo line $i; echo noise; sleep 0.3; done"),
            )
        ],
    )
    job_id = cluster.submit(app)
    cluster.wait_state(job_id, {AppState.RUNNING, AppState.SUCCEEDED})
    lines = list(cluster.sched.log_iter(job_id, "w", 0, regex=r"^line", should_tail=True))
    assert lines == [f"line {i}\n" for i in range(1, 6)]
    d = cluster.sched.describe(job_id)
    assert d is not None and is_terminal(d.state)


def test_tails_of_running_jobs_share_their_end_checks(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three jobs tailed at once, quiet for ~4 s then printing: the tails ask the controller
    whether their jobs ended together, about once a second (was once a second each)."""
    app = AppDef("tails", [Role("w", entrypoint="/bin/sh", args=_sh("sleep 4; echo done"))])
    ids = [cluster.submit(app) for _ in range(3)]
    for job_id in ids:
        cluster.wait_state(job_id, {AppState.RUNNING, AppState.SUCCEEDED})
    client = cluster.sched.client(cluster.name)
    asked: list[list[str]] = []
    real = client.controller_jobs

    def spy(job_ids: list[str]) -> Any:
        asked.append(list(job_ids))
        return real(job_ids)

    monkeypatch.setattr(client, "controller_jobs", spy)
    got: dict[str, list[str]] = {}

    def tail(job_id: str) -> None:
        got[job_id] = list(cluster.sched.log_iter(job_id, "w", 0, should_tail=True))

    threads = [threading.Thread(target=tail, args=(j,)) for j in ids]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    seconds = time.monotonic() - started
    assert all(got[j] == ["done\n"] for j in ids), got
    # about one round a second for all three (the first few rounds find the tails one by one)
    assert len(asked) <= seconds + 4, (len(asked), seconds, asked)
    assert max(len(a) for a in asked) == 3, asked


def test_describe_many_is_one_controller_call(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [cluster.submit(_two_role_app(trainer="sleep 30", ps="sleep 30")) for _ in range(2)]
    unknown = ids[0].replace(cluster.job_id(ids[0]), "999999998")
    client = cluster.sched.client(cluster.name)
    asked: list[tuple[str, list[str]]] = []
    for method in ("controller_jobs", "accounting_jobs"):
        real = getattr(client, method)

        def spy(job_ids: list[str], real: Any = real, method: str = method) -> Any:
            asked.append((method, list(job_ids)))
            return real(job_ids)

        monkeypatch.setattr(client, method, spy)
    out = cluster.sched.describe_many([*ids, unknown])
    # one controller call for every job; accounting only for the one it does not know
    assert asked == [
        ("controller_jobs", [cluster.job_id(i) for i in [*ids, unknown]]),
        ("accounting_jobs", ["999999998"]),
    ]
    assert out[unknown] is None
    for job_id in ids:
        d = out[job_id]
        assert d is not None and d.state in (AppState.PENDING, AppState.RUNNING)
        assert sorted(_replicas(d)) == [("ps", 0), ("trainer", 0), ("trainer", 1)]
    asked.clear()
    assert cluster.sched.describe(ids[0]) is not None
    assert [m for m, _ in asked] == ["controller_jobs"]  # an active job: one call


def test_describe_many_is_one_squeue_call(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = local_cluster
    ids = [cluster.submit(_two_role_app(trainer="sleep 30", ps="sleep 30")) for _ in range(2)]
    calls: list[list[str]] = []
    real_run = LocalShell.run

    def spy(self: LocalShell, cmd: list[str], **kwargs: Any) -> Any:
        calls.append(cmd)
        return real_run(self, cmd, **kwargs)

    monkeypatch.setattr(LocalShell, "run", spy)
    out = cluster.sched.describe_many([*ids, "999999998"])
    assert [c[0] for c in calls] == ["squeue", "sacct"]  # sacct only for the unknown one
    assert calls[1][calls[1].index("-j") + 1] == "999999998"
    assert out["999999998"] is None
    for job_id in ids:
        d = out[job_id]
        assert d is not None and d.state in (AppState.PENDING, AppState.RUNNING)
        assert sorted(_replicas(d)) == [("ps", 0), ("trainer", 0), ("trainer", 1)]
    calls.clear()
    assert cluster.sched.describe(ids[0]) is not None
    assert [c[0] for c in calls] == ["squeue"]  # an active job: one squeue call


def test_idempotency_key_found_from_another_instance(cluster: Cluster) -> None:
    key = f"dag/task/{time.time_ns()}"
    app = AppDef(
        "idem",
        [Role("w", entrypoint="/bin/true")],
    )
    job_id = cluster.submit(app, {"comment": "user comment"}, idempotency_key=key)
    other = create_scheduler("other")
    assert other.find_by_idempotency_key(key, cluster.cfg()) == job_id
    assert other.find_by_idempotency_key(key + "-other", cluster.cfg()) is None
    info = other._job_infos([job_id])[job_id]
    assert info.comment.startswith("user comment shipyard-key=")
    # through the runner: a second run with the same key re-attaches
    with get_runner("idem") as runner:
        handle = runner.run(app, "slurm", cluster.cfg(), idempotency_key=key)
        assert handle == f"slurm://idem/{job_id}"
        key2 = key + "-runner"
        h1 = runner.run(
            AppDef("idem2", [Role("w", entrypoint="/bin/true")]), "slurm", cluster.cfg(), None, key2
        )
        cluster.jobs.append(h1.rsplit("/", 1)[1])
        h2 = runner.run(
            AppDef("idem2", [Role("w", entrypoint="/bin/true")]), "slurm", cluster.cfg(), None, key2
        )
        assert h1 == h2
        status = runner.wait(h1, timeout=90)
        assert status is not None and status.state == AppState.SUCCEEDED


def test_list_includes_submitted_jobs(cluster: Cluster) -> None:
    job_id = cluster.submit(AppDef("ls", [Role("w", entrypoint="/bin/true")]))
    cluster.wait_done(job_id)
    listed = {a.app_id: a.state for a in cluster.sched.list(cluster.cfg())}
    assert listed.get(job_id) == AppState.SUCCEEDED


def test_unknown_partition_is_a_clear_error_and_queues_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    def queued() -> set[str]:
        # (the test harness asks the cluster itself: /usr/bin is not on the client's PATH)
        argv = ["squeue", "-h", "-t", "all", "-o", "%i"]
        out = subprocess.run(argv, capture_output=True, env=cluster.admin_env)
        return set(out.stdout.decode().split())

    before = queued()
    job_dir_cfg, job_dir = cluster.job_dir("never")
    with pytest.raises(ValueError, match=r"cfg\.partition: sbatch rejected 'nosuchpart'"):
        cluster.submit(_two_role_app(), {"partition": "nosuchpart", "job_dir": job_dir_cfg})
    assert not job_dir.exists()  # the directory made for it is removed again
    with pytest.raises(ValueError, match=r"cfg\.constraint: sbatch rejected 'nofeature'"):
        cluster.submit(_two_role_app(), {"constraint": "nofeature"})
    assert queued() == before


def test_describe_without_accounting_falls_back_to_the_controller(
    local_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = local_cluster
    job_id = cluster.submit(_two_role_app(ps="exit 2"))
    cluster.wait_done(job_id)
    conf = Path("/etc/slurm/slurm.conf").read_text()
    noacct = tmp_path / "slurm.conf"
    noacct.write_text(
        conf.replace(
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageType=accounting_storage/none",
        )
    )
    monkeypatch.setenv("SLURM_CONF", str(noacct))
    sched = create_scheduler("noacct")
    assert (
        sched.client(None).accounting_jobs([job_id]) is None
    )  # sacct: accounting storage is disabled
    d = sched.describe(job_id)
    assert d is not None and d.state == AppState.FAILED
    assert _replicas(d)[("ps", 0)].exit_code == 2
    assert _replicas(d)[("trainer", 1)].exit_code == 0


def test_injection_corpus_reaches_the_program_verbatim(cluster: Cluster, tmp_path: Path) -> None:
    canary = cluster.scratch / "pwned"
    corpus = [*injection_strings(str(canary)), *AWKWARD_STRINGS]
    dump = cluster.scratch / "argv.json"
    program = (
        "import json, os, sys; "
        "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items()"
        " if k.startswith('EVIL_')}}, open(os.environ['DUMP'], 'w'))"
    )
    env = {f"EVIL_{i}": s for i, s in enumerate(corpus)}
    env["DUMP"] = str(dump)
    python = PY if not cluster.remote else cluster.python
    app = AppDef("evil", [Role("w", entrypoint=python, args=["-c", program, *corpus], env=env)])
    job_id = cluster.submit(app, {"comment": "$(touch " + str(canary) + ") `id` ' \" \\"})
    done = cluster.wait_done(job_id)
    assert done.state == AppState.SUCCEEDED, list(
        cluster.sched.log_iter(job_id, "w", 0, streams=Stream.STDERR)
    )
    got = json.loads(dump.read_text())
    values = macros.Values(img_root="", app_id=cluster.job_id(job_id), replica_id="0", rank0_env="")
    assert got["argv"] == [values.substitute(s) for s in corpus]
    assert got["env"] == {k: values.substitute(v) for k, v in env.items() if k.startswith("EVIL_")}
    assert not canary.exists()
    info = cluster.sched._job_infos([job_id])[job_id]
    assert info.comment == "$(touch " + str(canary) + ") `id` ' \" \\"


@pytest.mark.parametrize(
    "comment",
    ["it's", 'say "x"', "a\\b", "end\\", "$(touch /tmp/shipyard-canary-never)", "#x"],
)
def test_awkward_comments_survive_sbatch(cluster: Cluster, comment: str) -> None:
    job_id = cluster.submit(AppDef("c", [Role("w", entrypoint="/bin/true")]), {"comment": comment})
    assert cluster.sched._job_infos([job_id])[job_id].comment == comment
    assert not Path("/tmp/shipyard-canary-never").exists()
