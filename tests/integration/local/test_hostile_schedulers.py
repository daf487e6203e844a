"""Hostile input through every path that reaches a process or a shell, on the real backends.

* local: the injection corpus in args, env values and the entrypoint; path tricks in ``log_dir``
* slurm: the generated batch script executed by bash with ``srun`` replaced by a recorder
  (hypothesis over any text), ``sbatch --test-only`` on a fixed corpus, and real jobs whose
  entrypoint and ``job_dir`` are hostile
* docker: the injection corpus in args and env values of a real container
* every scheduler: an absurd replica count is a clear ``ValueError`` from the dry run

"Nothing executes" is checked with a canary file every payload tries to create; "exactly" by
having the program record the argv and environment it received.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.runner import Runner, get_runner
from core.schedulers.api import Stream
from core.schedulers.slurm_scheduler import SlurmScheduler
from core.specs import AppDef, AppState, BindMount, Role, is_terminal, macros
from tests.helpers import ROOT, wait_until
from tests.unit.core.hostile_inputs import (
    AWKWARD_STRINGS,
    HOSTILE_SETTINGS,
    TRAVERSAL_STRINGS,
    env_names,
    injection_strings,
)

PY = sys.executable
BUSYBOX = os.environ.get("SHIPYARD_TEST_IMAGE", "shipyard-test/busybox:latest")
# records argv[1:] and the EVIL_* variables as JSON into $DUMP
RECORDER = (
    "import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in"
    " os.environ.items() if k.startswith('EVIL_')}}, open(os.environ['DUMP'], 'w'))"
)


def wait_final(runner: Runner, handle: str, timeout: float = 120.0) -> Any:
    def done() -> Any:
        st = runner.status(handle)
        return st if st is not None and is_terminal(st.state) else None

    return wait_until(done, timeout, f"{handle} to end")


def corpus_for(canary: Path) -> list[str]:
    return [*injection_strings(str(canary)), *AWKWARD_STRINGS, *TRAVERSAL_STRINGS, "\udcff"]


def substituted(values: list[str], app_id: str) -> list[str]:
    v = macros.Values(img_root="", app_id=app_id, replica_id="0", rank0_env="")
    return [v.substitute(s) for s in values]


# --------------------------------------------------------------------------------------------
# local
# --------------------------------------------------------------------------------------------


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner("hostile") as r:
        yield r


def test_local_injection_corpus_reaches_the_program_verbatim(
    tmp_path: Path, runner: Runner
) -> None:
    canary = tmp_path / "pwned"
    corpus = corpus_for(canary)
    dump = tmp_path / "dump.json"
    env = {f"EVIL_{i}": s for i, s in enumerate(corpus)}
    app = AppDef(
        "evil", [Role("w", entrypoint=PY, args=["-c", RECORDER, *corpus], env={**env, "DUMP": str(dump)})]
    )  # fmt: skip
    handle = runner.run(app, "local_cwd")
    st = wait_final(runner, handle)
    assert st.state == AppState.SUCCEEDED, list(runner.log_lines(handle, "w", 0))
    got = json.loads(dump.read_text())
    app_id = handle.rsplit("/", 1)[1]
    assert got["argv"] == substituted(corpus, app_id)
    assert got["env"] == dict(zip(env, substituted(list(env.values()), app_id), strict=True))
    assert not canary.exists()


@pytest.mark.parametrize("entrypoint", injection_strings("/tmp/shipyard-canary-local-ep"))
def test_local_hostile_entrypoint_is_rejected_and_nothing_runs(
    runner: Runner, entrypoint: str
) -> None:
    with pytest.raises(ValueError, match=r"^roles\[0\]\.entrypoint: "):
        runner.run(AppDef("ep", [Role("w", entrypoint=entrypoint)]), "local_cwd")
    assert not Path("/tmp/shipyard-canary-local-ep").exists()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(
    "log_dir",
    ["logs/../elsewhere", "a/b/../../c", "./x/./y", "sp ace/$(touch pwned)/`id`", "~nobody-x"],
)
def test_local_log_dir_path_tricks_write_only_inside_the_resolved_log_dir(
    tmp_path: Path, runner: Runner, monkeypatch: pytest.MonkeyPatch, log_dir: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    try:
        handle = runner.run(
            AppDef("paths", [Role("w", entrypoint="echo", args=["hi"], num_replicas=2)]),
            "local_cwd",
            {"log_dir": log_dir},
        )
    except ValueError as e:  # rejecting is fine too, if nothing was written
        assert str(e).startswith("cfg.log_dir"), str(e)
        assert _tree(tmp_path) == before
        return
    assert wait_final(runner, handle).state == AppState.SUCCEEDED
    assert list(runner.log_lines(handle, "w", 1)) == ["hi\n"]
    resolved = Path(os.path.abspath(os.path.expanduser(log_dir)))
    new = {tmp_path / p for p in _tree(tmp_path) - before}
    outside = [p for p in new if resolved not in (p, *p.parents) and p not in resolved.parents]
    assert not outside, f"written outside {resolved}: {sorted(map(str, outside))}"
    assert not (work / "pwned").exists() and not (tmp_path / "pwned").exists()
    if log_dir.startswith("~"):
        shutil.rmtree(resolved, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# slurm: the batch script, executed by bash with srun recorded
# --------------------------------------------------------------------------------------------

_FAKE_SRUN = textwrap.dedent(
    """\
    srun() { printf '%s\\0' "$@" > "$SRUN_DUMP"; env -0 > "$SRUN_DUMP.env"; }
    scontrol() { :; }
    """
)


def run_script_with_fake_srun(script: str, tmp_path: Path) -> list[str]:
    """Runs the batch script in bash with ``srun`` recording its argv (SLURM_JOB_ID=4242) and
    its environment (``srun.argv.env``)."""
    dump = tmp_path / "srun.argv"
    dump.unlink(missing_ok=True)
    body = script.split("\n", 1)[1]  # after the shebang
    p = subprocess.run(
        ["bash", "-c", _FAKE_SRUN + body],
        env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4242", "SRUN_DUMP": str(dump)},
        cwd=tmp_path, capture_output=True, timeout=30,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return _nul_split(dump.read_bytes())


def _nul_split(data: bytes) -> list[str]:
    return [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")[:-1]]


def _components(argv: list[str]) -> list[list[str]]:
    comps: list[list[str]] = [[]]
    for a in argv:
        if a == ":" and comps[-1] and comps[-1][0].startswith("--output="):
            comps.append([])
        else:
            comps[-1].append(a)
    return comps


_REC = 'rec() { for a; do printf \'%s\\0\' "$a"; done > "$REC"; env -0 > "$REC.env"; }; '


def _run_component(
    cmd: list[str], srun_env: dict[str, str], tmp_path: Path
) -> tuple[list[str], dict[str, str]]:
    """What the program of one component gets: its argv and environment. The component's
    ``/bin/sh -c PRELUDE; exec ...`` is run by sh with its ``exec`` recording instead."""
    assert cmd[:2] == ["/bin/sh", "-c"], cmd
    head, _, tail = cmd[2].rpartition("exec ")
    rec = tmp_path / "exec.argv"
    p = subprocess.run(["/bin/sh", "-c", _REC + head + "rec " + tail, *cmd[3:]],
                       env={**srun_env, "REC": str(rec)}, capture_output=True, timeout=30)  # fmt: skip
    assert p.returncode == 0, p.stderr
    env = dict(kv.partition("=")[::2] for kv in _nul_split(Path(f"{rec}.env").read_bytes()))
    return _nul_split(rec.read_bytes()), env


def _check_component(
    comp: list[str], srun_env: dict[str, str], role: Role, replica: int, tmp_path: Path
) -> None:
    i = comp.index("/bin/sh")
    assert all(t.startswith("--") for t in comp[:i])  # srun's own options, then the command
    argv, env = _run_component(comp[i:], srun_env, tmp_path)
    v = macros.Values(img_root="", app_id="4242", replica_id=str(replica), rank0_env="")
    assert {k: env.get(k) for k in role.env} == {k: v.substitute(x) for k, x in role.env.items()}
    assert not any(k.startswith("SHIPYARD_ENV_") for k in env)  # the private names are gone
    # args get every macro; the entrypoint none, except that slurm resolves ${app_id} in it
    want = [role.entrypoint.replace(macros.app_id, "4242"), *(v.substitute(a) for a in role.args)]
    assert argv == want
    # no value of the environment is on the command line (values long enough not to occur in
    # the command's own words by chance; tests/integration/slurm/test_slurm_remote.py scrapes ps for it)
    for value in role.env.values():
        if len(value) >= 16 and all(value not in a for a in want):
            assert all(value not in token for token in comp), value


no_nul_text = st.text().map(lambda s: s.replace("\x00", ""))
hostile_values = st.one_of(st.sampled_from(corpus_for(Path("/tmp/sy-canary"))[:-1]), no_nul_text)


@settings(HOSTILE_SETTINGS, max_examples=min(HOSTILE_SETTINGS.max_examples, 150))
@given(
    entrypoint=hostile_values.filter(bool),
    args=st.lists(hostile_values, max_size=4),
    env=st.dictionaries(env_names.map(lambda k: "EVIL_" + k), hostile_values, max_size=3),
    comment=st.one_of(st.none(), hostile_values.filter(lambda s: not any(c < " " or c == "\x7f" for c in s))),
    replicas=st.integers(1, 2),
)  # fmt: skip
def test_slurm_script_passes_every_value_to_srun_verbatim(
    tmp_path_factory: pytest.TempPathFactory,
    entrypoint: str,
    args: list[str],
    env: dict[str, str],
    comment: str | None,
    replicas: int,
) -> None:
    tmp_path = tmp_path_factory.mktemp("script")
    role = Role("w", entrypoint=entrypoint, args=args, env=env, num_replicas=replicas)
    cfg = {"comment": comment} if comment else {}
    info = SlurmScheduler("hostile").submit_dryrun(AppDef("evil", [role]), cfg)
    argv = run_script_with_fake_srun(str(info), tmp_path)
    srun_env = dict(
        kv.partition("=")[::2] for kv in _nul_split((tmp_path / "srun.argv.env").read_bytes())
    )
    comps = _components(argv)
    assert len(comps) == replicas
    for k, comp in enumerate(comps):
        _check_component(comp, srun_env, role, k, tmp_path)
    assert not Path("/tmp/sy-canary").exists()
    # (and the job's result and checkpoint directories and its replicas' logs, which the
    # script makes)
    made = {"srun.argv", "srun.argv.env", "exec.argv", "exec.argv.env", "shipyard-results-4242",
            "shipyard-checkpoint-4242"}  # fmt: skip
    made |= {f"slurm-4242-w-{k}.{ext}" for k in range(replicas) for ext in ("out", "err")}
    assert {p.name for p in tmp_path.iterdir()} <= made, "files created"


@pytest.mark.parametrize("entrypoint", ["X=1", "A=B=C", "PATH=/nonexistent"])
def test_slurm_entrypoint_with_equals_is_not_taken_for_an_env_assignment(
    tmp_path: Path, entrypoint: str
) -> None:
    """``env K=V ENTRYPOINT ARGS`` would read ``X=1`` as one more assignment and run the first
    argument as the program: the entrypoint must either be run as given or be rejected."""
    canary = tmp_path / "pwned"
    role = Role("w", entrypoint=entrypoint, args=["touch", str(canary)])
    try:
        info = SlurmScheduler("hostile").submit_dryrun(AppDef("eq", [role]), {})
    except ValueError as e:
        assert str(e).startswith("roles[0].entrypoint"), str(e)
        return
    body = 'srun() { shift 3; "$@"; }\n' + str(info).split("\n", 1)[1]
    subprocess.run(["bash", "-c", body], env={**os.environ, "SLURM_JOB_ID": "1"}, cwd=tmp_path,
                   capture_output=True, timeout=30)  # fmt: skip
    assert not canary.exists(), f"entrypoint {entrypoint!r} ran its first argument as a program"


@pytest.fixture
def slurm_dir(slurm_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "submit"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


SBATCH_CORPUS = [
    "it's",
    'say "hi"',
    "back\\slash",
    "end\\",
    "$(touch /tmp/shipyard-canary-sbatch)",
    "`touch /tmp/shipyard-canary-sbatch`",
    "#SBATCH --wrap=touch /tmp/shipyard-canary-sbatch",
    "--wrap=touch /tmp/shipyard-canary-sbatch",
    "a --partition=nope b",
    "héllo 日本",
    "; touch /tmp/shipyard-canary-sbatch",
]


@pytest.mark.parametrize("comment", SBATCH_CORPUS)
def test_sbatch_test_only_accepts_hostile_comments_and_runs_nothing(
    slurm_dir: Path, comment: str
) -> None:
    role = Role("w", entrypoint="/bin/true", args=[comment], env={"EVIL": comment})
    info = SlurmScheduler("hostile").submit_dryrun(AppDef("c", [role]), {"comment": comment})
    p = subprocess.run(["sbatch", "--test-only"], input=str(info), capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "to start at" in p.stderr, p.stderr  # sbatch --test-only reports when it would start
    assert not Path("/tmp/shipyard-canary-sbatch").exists()


def test_slurm_real_job_with_hostile_entrypoint_job_dir_and_env(
    slurm_dir: Path, tmp_path: Path
) -> None:
    """Covers what tests/integration/slurm/test_slurm_scheduler.py does not: a hostile entrypoint (a real
    job that fails to find it) and a hostile job_dir, with nothing executed."""
    canary = tmp_path / "pwned"
    job_dir = tmp_path / f"jd $(touch {canary}) `touch {canary}` 'q\" ; x"
    dump = job_dir / "dump.json"
    sched = SlurmScheduler("hostile")
    jobs = []
    try:
        env = {"EVIL_A": f"$(touch {canary})", "DUMP": str(dump)}
        ok = AppDef("jd", [Role("w", entrypoint=PY, args=["-c", RECORDER, "${img_root}"], env=env)])
        jobs.append(sched.submit(ok, {"job_dir": str(job_dir)}))
        bad = AppDef("ep", [Role("w", entrypoint=f"$(touch {canary})", args=[f"`touch {canary}`"])])
        jobs.append(sched.submit(bad, {}))

        def ended(j: str) -> Any:
            d = sched.describe(j)
            return d if d is not None and is_terminal(d.state) else None

        d_ok = wait_until(lambda: ended(jobs[0]), what="job_dir job")
        d_bad = wait_until(lambda: ended(jobs[1]), what="hostile entrypoint job")
        assert d_ok.state == AppState.SUCCEEDED, list(
            sched.log_iter(jobs[0], "w", 0, streams=Stream.STDERR)
        )
        got = json.loads(dump.read_text())
        assert got["argv"] == [str(job_dir)] and got["env"] == {"EVIL_A": env["EVIL_A"]}
        assert d_bad.state == AppState.FAILED
        assert not canary.exists()
    finally:
        for j in jobs:
            subprocess.run(["scancel", j], capture_output=True)


# --------------------------------------------------------------------------------------------
# docker
# --------------------------------------------------------------------------------------------


def test_docker_injection_corpus_reaches_the_container_verbatim(
    docker_client: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    corpus = [s for s in corpus_for(Path("/out/pwned")) if s != "\udcff"]
    env = {f"EVIL_{i}": s for i, s in enumerate(corpus)}
    # busybox sh: every argument and every EVIL_ value, NUL-separated, into the bind mount
    script = (
        'for a; do printf "%s\\0" "$a"; done > /out/argv; { '
        + " ".join(f'printf "%s\\0" "${k}";' for k in env)
        + " } > /out/env"
    )
    role = Role(
        "w", image=BUSYBOX, entrypoint="sh", args=["-c", script, "sh", *corpus], env=env,
        mounts=[BindMount(str(out), "/out")],
    )  # fmt: skip
    from core.schedulers.docker_scheduler import create_scheduler

    with get_runner("hostile") as runner:
        handle = runner.run(AppDef("evil", [role]), "local_docker")
        try:
            st = wait_final(runner, handle)
            logs = list(runner.log_lines(handle, "w", 0))
        finally:
            create_scheduler("hostile").purge(handle.rsplit("/", 1)[1])
    assert st.state == AppState.SUCCEEDED, logs
    app_id = handle.rsplit("/", 1)[1]
    argv = [a.decode() for a in (out / "argv").read_bytes().split(b"\0")[:-1]]
    envs = [a.decode() for a in (out / "env").read_bytes().split(b"\0")[:-1]]
    assert argv == substituted(corpus, app_id)
    assert envs == substituted(list(env.values()), app_id)
    assert not (out / "pwned").exists()


# --------------------------------------------------------------------------------------------
# absurd replica counts
# --------------------------------------------------------------------------------------------

_DRYRUN_HUGE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a runaway dry run fails, not the host
from core.runner import get_runner
from core.specs import AppDef, Role
role = Role("w", image=sys.argv[2], entrypoint="echo", num_replicas=int(sys.argv[3]))
with get_runner("hostile") as runner:
    try:
        runner.dryrun(AppDef("huge", [role]), sys.argv[1])
    except ValueError as e:
        print("ValueError:", e)
        sys.exit(0)
    except MemoryError:
        print("MemoryError")
        sys.exit(3)
print("accepted")
sys.exit(4)
"""


@pytest.mark.parametrize("scheduler", ["local_cwd", "local_docker", "slurm"])
def test_absurd_replica_count_is_a_clear_error_from_the_dry_run(scheduler: str) -> None:
    """A billion replicas cannot be "run exactly": the dry run must say so, quickly and without
    building a request for each (it runs in a child limited to 2 GiB of address space)."""
    image = BUSYBOX if scheduler == "local_docker" else ""
    try:
        p = subprocess.run(
            [PY, "-c", _DRYRUN_HUGE, scheduler, image, str(10**9)],
            cwd=ROOT, capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{scheduler}: a dry run of 10**9 replicas did not finish in 20s")
    assert p.returncode == 0, (p.stdout, p.stderr[-2000:])
    assert "num_replicas" in p.stdout, p.stdout
