"""slurmctld restarted while jobs are queued and running: describe never lies during the outage
and reports the right states afterwards.

The test runs a private two-node Slurm cluster of its own (its own slurm.conf, ports, state and
spool directories; ``SLURM_CONF`` points the CLI at it; no accounting), started and stopped by
the test by pid, so the cluster the other tests use is never touched. Slurm keeps the jobs in
its state save location, so a restarted controller knows them again; the running job's steps
keep running under their slurmd meanwhile.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core.runner import Runner, get_runner
from core.schedulers.api import Stream
from core.schedulers.slurm_scheduler import SlurmScheduler
from core.specs import AppDef, AppState, Role, is_terminal, make_app_handle
from core.transient import BackendUnavailableError
from tests.helpers import ROOT, wait_until
from tests.services import REMOTE_DIR


def _free_ports(n: int) -> list[int]:
    """``n`` consecutive free TCP ports."""
    for base in range(17200, 17900, 10):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no free ports")


class PrivateSlurm:
    """A controller and two slurmd of the test's own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        ctld, n1, n2 = _free_ports(3)
        host = socket.gethostname()
        self.conf = root / "slurm.conf"
        (root / "state").mkdir()
        for n in ("fnode1", "fnode2"):
            (root / "spool" / n).mkdir(parents=True)
        self.conf.write_text(
            f"""\
ClusterName=syfault{os.getpid()}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=600
NodeName=fnode[1-2] NodeHostname={host} NodeAddr=127.0.0.1 Port={n1}-{n2} CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=fault Nodes=fnode[1-2] Default=YES MaxTime=INFINITE State=UP
"""
        )
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.ctld: subprocess.Popen[bytes] | None = None
        self.slurmds: list[subprocess.Popen[bytes]] = []

    def _daemon(self, *cmd: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*cmd, "-D", "-f", str(self.conf)], env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        states = p.stdout.split()
        return (
            p.returncode == 0
            and len(states) > 0
            and all(s.rstrip("*").startswith(("idle", "alloc", "mix")) for s in states)
        )

    def start_controller(self) -> None:
        self.ctld = self._daemon("slurmctld")
        wait_until(
            lambda: (
                subprocess.run(
                    ["scontrol", "ping"], env=self.env, capture_output=True, timeout=30
                ).returncode
                == 0
            ),  # fmt: skip
            60,
            "the private slurmctld to answer",
        )

    def stop_controller(self) -> None:
        assert self.ctld is not None
        self.ctld.send_signal(signal.SIGTERM)
        self.ctld.wait(timeout=60)
        self.ctld = None

    def start(self) -> None:
        self.start_controller()
        self.slurmds = [self._daemon("slurmd", "-N", n) for n in ("fnode1", "fnode2")]
        wait_until(self._idle, 90, "the private nodes to be idle")

    def stop(self) -> None:
        """Cancels every job (with a controller, started again if needed), then stops the
        daemons; job processes that outlived them (slurmstepd does) are killed by pid."""
        try:
            if self.ctld is None:
                self.start_controller()
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
            wait_until(lambda: not self._jobs_running(), 60, "the private jobs to end")
        except (AssertionError, OSError, subprocess.SubprocessError):
            pass
        daemons = [*self.slurmds, *([self.ctld] if self.ctld else [])]
        for p in daemons:
            p.send_signal(signal.SIGTERM)
        for p in daemons:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for pid in self._our_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _jobs_running(self) -> bool:
        p = subprocess.run(["squeue", "-h", "-t", "R,CG,PD"], env=self.env, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        return p.returncode != 0 or bool(p.stdout.strip())

    def _our_processes(self) -> list[int]:
        """Live processes whose environment points at this cluster's slurm.conf."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(int(d))
            except OSError:
                continue
        return found


@pytest.fixture
def cluster(slurm_cluster: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateSlurm]:
    if os.geteuid() != 0 or not shutil.which("slurmctld"):
        pytest.skip("a private Slurm cluster needs root and slurmctld/slurmd")
    root = Path(tempfile.mkdtemp(prefix="sy-slurm-", dir="/tmp"))
    c = PrivateSlurm(root)
    c.start()
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def runner(
    cluster: PrivateSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Runner]:
    monkeypatch.chdir(tmp_path)  # job logs land here
    with get_runner("sfault") as r:
        yield r


def _job_id(handle: str) -> str:
    return handle.rsplit("/", 1)[1]


def test_slurmctld_restart_with_jobs_queued_running_and_done(
    cluster: PrivateSlurm, runner: Runner, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    wait_go = f'echo "up $SHIPYARD_REPLICA_ID"; while [ ! -e {go} ]; do sleep 0.1; done; echo bye'
    done = runner.run(AppDef("done", [Role("w", entrypoint="/bin/echo", args=["hi"])]), "slurm")
    running = runner.run(
        AppDef("running", [Role("w", entrypoint="/bin/sh", args=["-c", wait_go], num_replicas=2)]),
        "slurm",
    )
    queued = runner.run(
        AppDef("queued", [Role("w", entrypoint="/bin/sh", args=["-c", "exit 4"])]), "slurm"
    )
    # the queued job is held: it stays PENDING through the restart
    subprocess.run(["scontrol", "hold", _job_id(queued)], env=cluster.env, check=True,
                   capture_output=True)  # fmt: skip

    def state(h: str) -> AppState | None:
        st = runner.status(h)
        return None if st is None else st.state

    wait_until(lambda: state(done) == AppState.SUCCEEDED, what="done to succeed")
    wait_until(lambda: state(running) == AppState.RUNNING, what="running to run")
    wait_until(
        lambda: all(list(runner.log_lines(running, "w", k)) for k in (0, 1)), what="running up"
    )
    assert state(queued) == AppState.PENDING

    cluster.stop_controller()
    # controller down: each describe errs or tells the truth; never "no such job", never a
    # final state the job did not reach
    # (checked at the end, so that the recovery is checked too)
    outage: list[str] = []
    truth = {done: {AppState.SUCCEEDED}, running: {AppState.RUNNING}, queued: {AppState.PENDING}}
    try:  # (one squeue for all three: it takes ~20s to give up on the controller)
        during = runner.status_many(list(truth))
    except Exception:
        during = {}  # an error is an honest answer while the controller is away
    for h, allowed in truth.items():
        if h not in during:
            continue
        st = during[h]
        if st is None:
            outage.append(f"{h}: described as unknown (no such job) while slurmctld was down")
        elif st.state not in allowed:
            outage.append(f"{h}: described {st.state.name} while slurmctld was down")
    cluster.start_controller()

    # afterwards: every job as it really is
    assert state(done) == AppState.SUCCEEDED
    assert wait_until(lambda: state(running), what="running to be known") == AppState.RUNNING
    assert state(queued) == AppState.PENDING
    go.touch()
    subprocess.run(["scontrol", "release", _job_id(queued)], env=cluster.env, check=True,
                   capture_output=True)  # fmt: skip

    def final(h: str) -> Any:
        st = runner.status(h)
        return st if st is not None and is_terminal(st.state) else None

    st_run = wait_until(lambda: final(running), what="running to end")
    st_q = wait_until(lambda: final(queued), what="queued to end")
    assert st_run.state == AppState.SUCCEEDED and st_run.exit_codes() == {"w": [0, 0]}
    assert st_q.state == AppState.FAILED and st_q.exit_codes() == {"w": [4]}
    for k in (0, 1):
        out = list(runner.log_lines(running, "w", k, streams=Stream.STDOUT))
        assert out == [f"up {k}\n", "bye\n"], out
    assert not outage, outage


def test_outage_a_wait_resumes_and_a_keyed_cli_submit_makes_one_job(
    cluster: PrivateSlurm, runner: Runner, tmp_path: Path
) -> None:
    """slurmctld down while a job runs, a wait follows it and a user submits with a key: the
    wait treats the outage as transient and returns the job's real end; the submit either
    succeeds or exits 75 (try again), and its rerun gets the same job: one job per key."""
    go, up = tmp_path / "go", tmp_path / "up"
    job = f"touch {up}; while [ ! -e {go} ]; do sleep 0.1; done; echo done"
    running = runner.run(
        AppDef("run", [Role("w", entrypoint="/bin/sh", args=["-c", job])]), "slurm"
    )
    # the replica's own process runs (RUNNING is the batch script: a step that srun starts
    # while the controller is down fails, "Unable to confirm allocation")
    wait_until(up.exists, what="the replica to start")
    waited: dict[str, Any] = {}

    def follow() -> None:
        try:
            waited["status"] = runner.wait(running, wait_interval=0.5, timeout=600)
        except BaseException as e:  # (the test reports it)
            waited["error"] = e

    follower = threading.Thread(target=follow)
    follower.start()
    # an Airflow trigger (as the triggerer runs it) and a Prefect wait poll the same job
    waiters = {"trigger": _trigger_waits, "prefect": _prefect_waits}
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=fn, args=(running, results)) for fn in waiters.values()]
    for t in threads:
        t.start()
    key = f"outage-{os.getpid()}"
    argv = [sys.executable, "-m", "core.cli", "run", "-s", "slurm", "--idempotency-key", key,
            "--", "/bin/echo", "keyed"]  # fmt: skip
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}

    cluster.stop_controller()
    during = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert during.returncode in (0, 75), during.stderr
    cluster.start_controller()
    go.touch()

    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    handle = again.stdout.strip().splitlines()[-1]
    if during.returncode == 0:
        assert during.stdout.strip().splitlines()[-1] == handle
    jobs = subprocess.run(["squeue", "-h", "-o", "%i %k", "-t", "all"], env=cluster.env,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert sum(key in line for line in jobs.splitlines()) == 1, jobs
    follower.join(timeout=600)
    assert "error" not in waited, waited
    status = waited["status"]
    assert status is not None and status.state == AppState.SUCCEEDED
    for t in threads:
        t.join(timeout=600)
    trigger_event = results["trigger"]
    assert trigger_event.payload["status"] == "success", trigger_event.payload
    assert trigger_event.payload["log_lines"] == 1  # ("done": read once, after the outage)
    prefect_status = results["prefect"]
    assert not isinstance(prefect_status, BaseException), prefect_status
    assert prefect_status.state == AppState.SUCCEEDED
    assert runner.wait(handle, timeout=120) is not None
    final = runner.status(handle)
    assert final is not None and final.state == AppState.SUCCEEDED


def _dbd_pid() -> int | None:
    try:
        pid = int(Path("/run/slurmdbd.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


@pytest.fixture
def accounting_down(slurm_cluster: None) -> Iterator[Callable[[], None]]:
    """The test rig's slurmdbd (22.05) stopped for the test, and started again after it (or when
    the test calls what this yields) as scripts/start_slurm.sh starts it; the cluster is left
    as it was found."""
    pid = _dbd_pid()
    if pid is None:
        pytest.fail("slurmdbd does not run (scripts/start_slurm.sh starts it)")
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: _dbd_pid() is None, 30, "slurmdbd to stop")

    def start() -> None:
        if _dbd_pid() is not None:
            return
        subprocess.run(["slurmdbd"], stdin=subprocess.DEVNULL, capture_output=True, check=True)

        def answers() -> bool:
            p = subprocess.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                               capture_output=True, timeout=30)  # fmt: skip
            return p.returncode == 0

        wait_until(answers, 60, "slurmdbd to answer again")

    try:
        yield start
    finally:
        start()


def test_accounting_down_describe_and_waits_answer_from_the_controller(
    accounting_down: Callable[[], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmdbd down (maintenance) while jobs run and end: describe answers from the
    controller, and waits get each job's real end and exit codes."""
    monkeypatch.chdir(tmp_path)
    go = tmp_path / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.1; done; exit $SHIPYARD_REPLICA_ID"
    app = AppDef("dbd", [Role("w", entrypoint="/bin/sh", args=["-c", script], num_replicas=2)])
    with get_runner("sfault-dbd") as runner:
        handle = runner.run(app, "slurm")
        try:
            wait_until(lambda: (s := runner.status(handle)) is not None
                       and s.state == AppState.RUNNING, what="the job to run")  # fmt: skip
            go.touch()
            final = runner.wait(handle, wait_interval=0.2, timeout=120)
            assert final is not None and final.state == AppState.FAILED, final
            assert final.exit_codes() == {"w": [0, 1]}
        finally:
            runner.cancel(handle)


class _Warnings(logging.Handler):
    """The warnings of a logger, as they come."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_accounting_down_a_job_only_accounting_holds_is_not_known_yet(
    accounting_down: Callable[[], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ended past the controller's MinJobAge is known to accounting only: while
    slurmdbd is down, describe says it cannot tell (a transient error, never "no such job")
    and a waiter keeps waiting; once accounting answers, the waiter gets its answer. (The
    controller says of a purged job what it says of one it never had: the test asks for one
    it never had, accounting's answer is then "no such job".)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHIPYARD_CLUSTERS", os.path.join(REMOTE_DIR, "clusters.yaml"))
    purged = "999999997"
    sched = SlurmScheduler("t")
    for where in ("", "ssh-login:", "rest-api:"):  # (sacct here and over ssh; slurmrestd)
        with pytest.raises(BackendUnavailableError, match="no longer holds .* did not answer"):
            sched.describe(where + purged)
    sched.close()
    warnings = _Warnings()
    with get_runner("sfault-purged") as runner:
        handle = make_app_handle("slurm", "sfault-purged", purged)
        waited: dict[str, Any] = {}
        waiter = threading.Thread(target=_wait_into, args=(runner, handle, waited, warnings))
        waiter.start()
        wait_until(lambda: len(warnings.messages) >= 2, 60, "the waiter to retry twice")
        assert waiter.is_alive() and not waited, waited
        accounting_down()  # slurmdbd back
        waiter.join(120)
    assert not waiter.is_alive()
    assert "error" not in waited, waited
    assert waited["status"] is None  # (accounting's answer: no such job)
    assert all("accounting did not answer" in m for m in warnings.messages), warnings.messages


def _wait_into(runner: Runner, handle: str, out: dict[str, Any], warnings: _Warnings) -> None:
    logger = logging.getLogger("core.watch.job")  # (where a waiter's retries are told)
    logger.addHandler(warnings)
    try:
        out["status"] = runner.wait(handle, wait_interval=0.2, timeout=120)
    except Exception as e:  # noqa: BLE001 - looked at by the test
        out["error"] = e
    finally:
        logger.removeHandler(warnings)


def _trigger_waits(handle: str, out: dict[str, Any]) -> None:
    """The first event of the Airflow provider's trigger on ``handle``, as a triggerer runs it."""
    import asyncio

    from airflow_provider.triggers import ShipyardJobTrigger

    async def first_event() -> Any:
        trigger = ShipyardJobTrigger(handle, poll_interval=0.5, stream_logs=True)
        return await anext(trigger.run())

    try:
        out["trigger"] = asyncio.run(first_event())
    except BaseException as e:  # noqa: BLE001 - looked at by the test
        out["trigger"] = e


def _prefect_waits(handle: str, out: dict[str, Any]) -> None:
    """The Prefect task ``wait_for_job``'s answer on ``handle`` (its function, as a worker's
    flow run calls it)."""
    from prefect_tasks.tasks import wait_for_job

    try:
        out["prefect"] = wait_for_job.fn(handle, poll_interval=0.5, cancel_check_interval=None)
    except BaseException as e:  # noqa: BLE001 - looked at by the test
        out["prefect"] = e
