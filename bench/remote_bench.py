"""Remote Slurm rows: the cluster through its SSH login node and through slurmrestd
(``scripts/start_slurm_remote.sh``), beside the raw mechanism measured in the same run:

* SSH: OpenSSH's own client over a reused connection (``ControlMaster``) running the same
  ``sbatch`` (script on stdin), ``squeue`` query or ``cat`` of the log;
* REST: one raw HTTP request (a reused ``requests`` session) of the same body or query, to
  Debian's slurmrestd 22.05 (API v0.0.38) and to Slurm 26.05's (``rest-26``: v0.0.45,
  ``scripts/start_slurm26.sh``).

Remote calls are counted inside the scheduler's transport (commands sent over SSH, HTTP
requests to slurmrestd), so "calls per poll" is what actually reached the cluster.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from bench.common import Ctx, measure_lines
from bench.harness import (
    Row,
    Section,
    Target,
    exactly,
    fill,
    interleave,
    ratio,
    repeat_timed,
    wait_for,
)

SESSION = "benchremote"
N_HANDLES = 100
REMOTE_DIR = os.environ.get("SHIPYARD_REMOTE_DIR", "/var/lib/shipyard-remote")
CLUSTERS = {"ssh": "ssh-login", "rest": "rest-api", "rest-26": "rest26"}
#: each REST row's slurmrestd: its URL, the API version spoken, the scontrol that makes tokens
SLURMRESTD = {
    "rest": ("http://127.0.0.1:6820", "v0.0.38", "scontrol"),
    "rest-26": ("http://127.0.0.1:26820", "v0.0.45", "/opt/slurm-26.05.3/bin/scontrol"),
}
USER = "hpcuser"

ROWS: list[tuple[str, Target | None, str]] = [
    (f"{t}: {what}", target, unit)
    for t in CLUSTERS
    for what, target, unit in (
        ("submit 1 replica", ratio(1.3), "ms"),
        ("describe an active job", ratio(1.3), "ms"),
        (f"describe {N_HANDLES} handles: remote calls per poll", exactly(1, "call"), "calls"),
        ("log_iter 200k lines", ratio(1.3), "ms"),
    )
]


def _problem() -> str | None:
    if not os.path.exists(os.path.join(REMOTE_DIR, "clusters.yaml")):
        return "no front doors (start them with scripts/start_slurm_remote.sh)"
    if shutil.which("ssh") is None:
        return "no OpenSSH client for the raw side"
    return None


class RawSSH:
    """OpenSSH's client over one reused connection (ControlMaster), as a user would script it."""

    def __init__(self, tmp: str) -> None:
        self.argv = [
            "ssh", "-p", "2222", "-i", os.path.join(REMOTE_DIR, "userkey"), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={os.path.join(REMOTE_DIR, 'known_hosts')}",
            "-o", "ControlMaster=auto", "-o", f"ControlPath={tmp}/cm-%C", "-o", "ControlPersist=120",
            f"{USER}@127.0.0.1",
        ]  # fmt: skip

    def run(self, command: str, stdin: str | None = None) -> str:
        data = stdin.encode() if stdin is not None else None
        p = subprocess.run([*self.argv, command], input=data, capture_output=True, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"ssh {command.split()[0]}: {p.stderr.decode().strip()}")
        return p.stdout.decode("utf-8", "replace")

    def close(self) -> None:
        subprocess.run([*self.argv[:-1], "-O", "exit", self.argv[-1]], capture_output=True,
                       check=False)  # fmt: skip


class RawREST:
    """One raw HTTP request per call, on a reused session, with the user's token."""

    def __init__(self, transport: str) -> None:
        import requests

        self.url, self.version, scontrol = SLURMRESTD[transport]
        token = subprocess.run(
            [scontrol, "token", f"username={USER}", "lifespan=3600"],
            capture_output=True, text=True, check=True,
        ).stdout.strip().partition("=")[2]  # fmt: skip
        self.session = requests.Session()
        self.session.headers.update({"X-SLURM-USER-NAME": USER, "X-SLURM-USER-TOKEN": token})

    def call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        r = self.session.request(method, f"{self.url}{path}", timeout=30, **kw)
        return r.json()  # type: ignore[no-any-return]

    def submission(self, req: Any, workdir: str) -> dict[str, Any]:
        """The body of ``POST job/submit`` for this API version (the scheduler's own mapping:
        the raw side differs only in the HTTP call)."""
        from core.schedulers.slurm.rest import API_VERSIONS

        body: dict[str, Any] = API_VERSIONS[self.version].submission(
            req, workdir, False, {"PATH": "/usr/bin:/bin"}
        )
        return body


@contextlib.contextmanager
def counting(client: Any) -> Iterator[Counter[str]]:
    """Counts the remote calls ``client`` makes inside the block (SSH commands or HTTP
    requests), by command or path."""
    calls: Counter[str] = Counter()
    if hasattr(client, "shell"):
        shell = client.shell
        real = shell.run

        def run(argv: list[str], **kw: Any) -> Any:
            calls[argv[0]] += 1
            return real(argv, **kw)

        shell.run = run
        try:
            yield calls
        finally:
            del shell.run
    else:
        real_http = client._http

        def http(method: str, path: str, refresh: bool, **kw: Any) -> Any:
            calls[f"{method} {path.split('/')[-1]}"] += 1
            return real_http(method, path, refresh, **kw)

        client._http = http
        try:
            yield calls
        finally:
            del client._http


def _app(name: str, args: list[str]) -> Any:
    from core.specs import AppDef, Role

    return AppDef(name, [Role("r", entrypoint=args[0], args=args[1:])])


def run(ctx: Ctx) -> list[Row]:
    sec = Section("remote", ctx.runs, ctx.verbose)
    problem = _problem()
    if problem:
        sec.skip_all(problem, ROWS)
        return sec.rows
    os.environ["SHIPYARD_CLUSTERS"] = os.path.join(REMOTE_DIR, "clusters.yaml")
    from core.runner import get_runner

    runner = get_runner(SESSION)
    raw_ssh = RawSSH(ctx.tmp)
    try:
        for transport, cluster in CLUSTERS.items():
            if transport == "rest-26" and not os.path.exists(SLURMRESTD[transport][2]):
                rows = [r for r in ROWS if r[0].startswith(f"{transport}:")]
                sec.skip_all("no Slurm 26.05 (scripts/start_slurm26.sh)", rows)
                continue
            _rows(ctx, sec, runner, transport, cluster, raw_ssh)
    finally:
        raw_ssh.close()
        runner.close()
    return sec.rows


def _rows(
    ctx: Ctx, sec: Section, runner: Any, transport: str, cluster: str, raw_ssh: RawSSH
) -> None:
    from core.specs import AppState, is_terminal

    # (the runner's own scheduler: the calls counted are those its status reads make)
    sched: Any = runner.scheduler("slurm")
    cfg = {"cluster": cluster}
    client = sched.client(cluster)
    raw_rest = RawREST(transport) if transport in SLURMRESTD else None
    workdir = sched.default_dir(cluster)

    def cancel(*job_ids: str) -> None:
        for j in job_ids:
            client.cancel(j)

    # -- submit --------------------------------------------------------------------------------
    app = _app("brsub", ["sleep", "600"])
    req = sched.submit_dryrun(app, cfg).request

    def ship_submit() -> float:
        t0 = time.perf_counter()
        h = runner.run(app, "slurm", cfg)
        dt = time.perf_counter() - t0
        cancel(h.rsplit(":", 1)[1])
        return dt

    def raw_submit() -> float:
        t0 = time.perf_counter()
        if raw_rest is None:
            job = raw_ssh.run(f"cd {workdir} && sbatch --parsable", req.materialize()).strip()
        else:
            body = raw_rest.submission(req, workdir)
            path = f"/slurm/{raw_rest.version}/job/submit"
            job = str(raw_rest.call("POST", path, json=body)["job_id"])
        dt = time.perf_counter() - t0
        cancel(job.split(";")[0])
        return dt

    sec.measure(
        sec.row(f"{transport}: submit 1 replica", ratio(1.3),
                raw_name="sbatch over a reused ssh" if raw_rest is None else "1 POST job/submit"),
        lambda row: fill(row, interleave({"shipyard": ship_submit, "raw": raw_submit},
                                         ctx.runs * 2, warmup=1)),
    )  # fmt: skip

    # -- describe one active job ---------------------------------------------------------------
    h = runner.run(app, "slurm", cfg)
    app_id = h.rsplit("/", 1)[1]
    job = app_id.rsplit(":", 1)[1]
    try:
        from core.schedulers.slurm.jobinfo import SQUEUE_FORMAT

        def ship_describe() -> None:
            d = sched.describe(app_id)
            assert d is not None and not is_terminal(d.state), d

        def raw_describe() -> None:
            if raw_rest is None:
                out = raw_ssh.run(f"squeue -h -t all -j {job} -O '{SQUEUE_FORMAT}'")
            else:
                out = str(raw_rest.call("GET", f"/slurm/{raw_rest.version}/jobs")["jobs"])
            assert job in out

        sec.measure(
            sec.row(f"{transport}: describe an active job", ratio(1.3),
                    raw_name="squeue over a reused ssh" if raw_rest is None else "1 GET jobs"),
            lambda row: fill(row, interleave({"shipyard": lambda: repeat_timed(ship_describe, 3),
                                              "raw": lambda: repeat_timed(raw_describe, 3)},
                                             ctx.runs * 2, warmup=1)),
        )  # fmt: skip
    finally:
        cancel(job)

    # -- 100 handles: one remote call per poll -----------------------------------------------
    held = [client.submit(req, workdir, hold=True) for _ in range(N_HANDLES)]
    try:
        handles = [f"slurm://{SESSION}/{cluster}:{j}" for j in held]

        def calls_row(row: Row) -> None:
            polls = ctx.runs
            with counting(client) as c:
                for _ in range(polls):
                    st = runner.status_many(handles)
                    assert all(s is not None and s.state == AppState.PENDING for s in st.values())
            row.shipyard = sum(c.values()) / polls
            row.raw = 1.0
            row.note = f"{polls} polls: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))

        sec.measure(
            sec.row(f"{transport}: describe {N_HANDLES} handles: remote calls per poll",
                    exactly(1, "call"), "calls",
                    raw_name="1 squeue" if raw_rest is None else "1 GET jobs"),
            calls_row,
        )  # fmt: skip
    finally:
        cancel(*held)

    # -- log_iter ------------------------------------------------------------------------------
    expected = ctx.log_lines()
    src = os.path.join(workdir, "bench-lines.txt")
    shutil.copy(ctx.log_file(), src)
    user = pwd.getpwnam(USER)
    os.chown(src, user.pw_uid, user.pw_gid)
    h = runner.run(_app("brlog", ["cat", src]), "slurm", cfg)
    app_id = h.rsplit("/", 1)[1]
    st = wait_for(lambda: (s := runner.status(h)) is not None and is_terminal(s.state) and s, 300,
                  "the log job")  # fmt: skip
    if st.state != AppState.SUCCEEDED:
        raise RuntimeError(f"log job {app_id} ended {st.state.name}: {st.msg}")
    path = os.path.join(workdir, f"slurm-{app_id.rsplit(':', 1)[1]}-r-0.out")
    list(sched.log_iter(app_id, "r", 0))  # the scheduler learns the job's directory once

    def raw_log() -> list[str]:
        text = raw_ssh.run(f"cat {path}")
        return text.splitlines(keepends=True)

    sec.measure(
        sec.row(f"{transport}: log_iter 200k lines", ratio(1.3),
                raw_name="cat over a reused ssh + splitlines"),
        lambda row: measure_lines(row, lambda: sched.log_iter(app_id, "r", 0), raw_log, expected,
                                  ctx.runs),
    )  # fmt: skip
