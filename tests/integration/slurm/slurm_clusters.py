"""The Slurm clusters as the tests reach them: through this host's commands (``local``), or as
a client elsewhere would, through the SSH login node (``ssh``) or slurmrestd (``rest``) that
``scripts/start_slurm_remote.sh`` puts in front of it. Each transport reaches two clusters:
Debian's Slurm 22.05 (``local``, ``ssh``, ``rest``) and Slurm 26.05 (``local-26``, ``ssh-26``,
``rest-26``: ``scripts/start_slurm26.sh``, whose commands are not on ``PATH``).

For the remote transports the test process has no Slurm command on ``PATH`` and no
``SLURM_CONF``: only the transport can reach the cluster. Jobs then run as ``hpcuser``; the
test's :attr:`Cluster.scratch` directory is one both the test and the job can use.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.schedulers.slurm_scheduler import SlurmScheduler
from core.specs import AppDef, AppState
from tests.services import (
    REMOTE_DIR,
    SLURM26_PREFIX,
    require,
    slurm26_problem,
    slurm_problem,
    slurm_remote_problem,
)

TRANSPORTS = ["local", "ssh", "rest"]
#: every transport to both releases (the remote-transport tests, test_slurm_remote.py)
ALL_CLUSTERS = [*TRANSPORTS, "local-26", "ssh-26", "rest-26"]
#: what the rest of the Slurm suite is parametrized over: every transport to 22.05, and 26.05
#: through its own commands and slurmrestd (over SSH the same commands' output is parsed as
#: through local-26: ssh-26 runs the remote-transport tests, the containers and the
#: integrations' connection tests)
CLUSTERS = [*TRANSPORTS, "local-26", "rest-26"]
#: for the slowest tests (a minute each: requeues, time limits): every transport to 22.05, and
#: slurmrestd to 26.05 (its CLI transports run the same batch script, which the other tests
#: cover on both releases)
SLOW_CLUSTERS = [*TRANSPORTS, "rest-26"]
#: the names of the clusters in the clusters file (start_slurm_remote.sh, start_slurm26.sh)
CLUSTER_NAMES = {
    "local": None,
    "ssh": "ssh-login",
    "rest": "rest-api",
    "local-26": "local26",
    "ssh-26": "ssh26",
    "rest-26": "rest26",
}
REMOTE_USER = "hpcuser"
_SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun")
#: this host's environment as the tests start: its Slurm commands, before a test hides them
ADMIN_ENV = dict(os.environ)


def wait(pred: Callable[[], Any], timeout: float = 90, what: str = "condition") -> Any:
    """Polls ``pred`` until it returns something truthy; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


#: the administrator's environment on the 26.05 cluster (its commands first on PATH)
ADMIN_ENV_26 = {**ADMIN_ENV, "PATH": f"{SLURM26_PREFIX}/bin:{ADMIN_ENV.get('PATH', '')}"}


def preempt_node(node: str, env: dict[str, str] | None = None) -> None:
    """Preempts what runs on ``node``: a short job of the high-priority partition ``urgent``
    that needs the whole node, submitted as the cluster's administrator (``env``: the
    administrator environment of the node's cluster, default 22.05's)."""
    argv = ["sbatch", "--parsable", "-p", "urgent", "-w", node, "-c", "2", "-o", "/dev/null"]
    p = subprocess.run(
        [*argv, "--wrap", "sleep 1"], env=env or ADMIN_ENV, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr  # (it ends by itself within seconds)


class Cluster:
    """A scheduler for the test, the cluster it goes to, and clean-up of every job it
    submitted."""

    def __init__(self, param: str, scratch: Path) -> None:
        #: ``local``, ``ssh`` or ``rest``
        self.transport = param.partition("-")[0]
        #: ``22.05`` or ``26.05``
        self.release = "26.05" if param.endswith("-26") else "22.05"
        self.name = CLUSTER_NAMES[param]
        #: the administrator's environment on this cluster (its Slurm commands on PATH)
        self.admin_env = ADMIN_ENV_26 if self.release == "26.05" else ADMIN_ENV
        self.sched = SlurmScheduler("test")
        self.scratch = scratch
        #: a Python the job can run (the venv's lives under /root where hpcuser cannot go)
        self.python = "/usr/bin/python3" if self.remote else os.environ.get("PYTHON", "python3")
        self.jobs: list[str] = []

    @property
    def remote(self) -> bool:
        """True if the test reaches the cluster as a client elsewhere would (ssh, rest)."""
        return self.transport != "local"

    def preempt(self, node: str) -> None:
        """Preempts what runs on ``node`` of this cluster (see :func:`preempt_node`)."""
        preempt_node(node, self.admin_env)

    def cfg(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """``extra`` plus the run option that picks this cluster."""
        return {**({"cluster": self.name} if self.name else {}), **(extra or {})}

    def job_dir(self, name: str) -> tuple[str, Path]:
        """A fresh ``job_dir`` value and the directory it becomes."""
        if not self.remote:
            path = self.scratch / name
            return str(path), path
        rel = f"tests/{uuid.uuid4().hex[:12]}/{name}"
        return rel, Path(self.remote_dir) / rel

    @property
    def remote_dir(self) -> str:
        """The cluster's ``remote_dir`` (each release its own: their job ids overlap)."""
        name = "shipyard26" if self.release == "26.05" else "shipyard"
        return os.path.join(pwd.getpwnam(REMOTE_USER).pw_dir, name)

    def submit(self, app: AppDef, cfg: dict[str, Any] | None = None, **kw: Any) -> str:
        app_id = self.sched.submit(app, self.cfg(cfg), **kw)
        self.jobs.append(app_id)
        return app_id

    def job_id(self, app_id: str) -> str:
        """The Slurm job id of an app id (``cluster:123`` -> ``123``)."""
        return app_id.rpartition(":")[2]

    def wait_state(self, app_id: str, states: set[AppState], timeout: float = 90) -> Any:
        def check() -> Any:
            d = self.sched.describe(app_id)
            return d if d is not None and d.state in states else None

        return wait(check, timeout, f"job {app_id} to reach {sorted(s.name for s in states)}")

    def wait_done(self, app_id: str, timeout: float = 90) -> Any:
        ended = {AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED}
        return self.wait_state(app_id, ended, timeout)


@dataclass(frozen=True)
class SlurmRelease:
    """Where the tests find one of the two clusters' own parts."""

    #: the directory of its Slurm commands
    bin: str
    #: its slurmrestd
    rest_url: str

    def token(self, user: str = REMOTE_USER, lifespan: int = 600) -> str:
        """A JWT of ``user`` for its slurmrestd, made by its ``scontrol token``."""
        argv = [f"{self.bin}/scontrol", "token", f"username={user}", f"lifespan={lifespan}"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env=ADMIN_ENV)
        return out.stdout.strip().partition("=")[2]


def slurm_release(param: str) -> SlurmRelease:
    """The release a test parameter (``rest``, ``ssh-26``...) reaches; checks that it runs."""
    if param.endswith("-26"):
        require("slurm26", slurm26_problem())
        return SlurmRelease(f"{SLURM26_PREFIX}/bin", "http://127.0.0.1:26820")
    return SlurmRelease("/usr/bin", "http://127.0.0.1:6820")


def no_local_slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Leaves the test process without any Slurm command on ``PATH`` and without
    ``SLURM_CONF``: only a remote transport can reach the cluster."""
    shims = tmp_path / "no-slurm-bin"
    shims.mkdir(exist_ok=True)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.listdir(d):
            target = os.path.join(d, entry)
            if entry in _SLURM_COMMANDS or (shims / entry).exists():
                continue
            if os.access(target, os.X_OK) and not os.path.isdir(target):
                (shims / entry).symlink_to(target)
    monkeypatch.setenv("PATH", str(shims))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert shutil.which("sbatch") is None and shutil.which("squeue") is None


def remote_scratch() -> Path:
    """A new directory in the login user's shipyard directory, usable by the test and by jobs
    that run as that user."""
    user = pwd.getpwnam(REMOTE_USER)
    base = Path(user.pw_dir) / "shipyard" / "tests"
    base.mkdir(parents=True, exist_ok=True)
    os.chown(base, user.pw_uid, user.pw_gid)
    path = base / uuid.uuid4().hex[:12]
    path.mkdir(mode=0o755)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def use_remote_clusters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The clusters file of scripts/start_slurm_remote.sh, and no local Slurm."""
    require("slurm_remote", slurm_remote_problem())
    monkeypatch.setenv("SHIPYARD_CLUSTERS", os.path.join(REMOTE_DIR, "clusters.yaml"))
    no_local_slurm(monkeypatch, tmp_path)


def make_cluster(param: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The body of the ``cluster`` fixtures: a :class:`Cluster` on ``param`` (one of
    :data:`CLUSTERS`)."""
    require("slurm", slurm_problem())
    if param.endswith("-26"):
        require("slurm26", slurm26_problem())
    if param == "local-26":
        monkeypatch.setenv("SHIPYARD_CLUSTERS", os.path.join(REMOTE_DIR, "clusters.yaml"))
    if param.startswith("local"):
        # jobs without a job_dir run (and write their logs) in the submitting directory
        scratch = tmp_path / "submitdir"
        scratch.mkdir()
        monkeypatch.chdir(scratch)
    else:
        use_remote_clusters(monkeypatch, tmp_path)
        scratch = remote_scratch()
    c = Cluster(param, scratch)
    yield c
    for app_id in c.jobs:
        try:
            c.sched.cancel(app_id)
        except Exception:  # clean-up must not hide the test's own failure
            pass
    c.sched.close()
    if c.remote:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def remote_clusters(
    params: Sequence[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[Cluster]]:
    """A :class:`Cluster` on each of ``params`` (ssh and rest ones: a local one needs this
    host's Slurm commands, which the remote ones take away), for one test to run a scenario
    bound to Slurm's clock (a time limit) on all of them at once."""
    assert not any(p.startswith("local") for p in params), params
    with ExitStack() as stack:
        out = []
        for p in params:
            gen = make_cluster(p, tmp_path, monkeypatch)
            out.append(next(gen))
            stack.callback(next, gen, None)
        yield out
