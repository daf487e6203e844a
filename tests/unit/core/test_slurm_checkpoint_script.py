"""The batch script of a Slurm app with a checkpoint signal, run by bash with ``srun`` standing
in as a function that execs the replica's command in the background (as the real ``srun``
forwards a signal to its tasks): the signal Slurm sends the batch shell (``--signal=B:...``)
reaches the replica, and the job's exit code is the replica's, not the interrupted wait's. The
real cluster runs the same script in tests/integration/slurm."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from core.limits import LimitsError, limits_from_cfg, requeue_from_cfg
from core.schedulers.slurm.scheduler import SlurmScheduler
from core.specs import AppDef, RetryPolicy, Role

REPLICA = 'trap "echo got-usr1; exit 7" USR1; echo ready; while :; do sleep 0.05; done'


def _script(cfg: dict[str, object], replica: str = REPLICA, retries: int = 0) -> str:
    role = Role("w", entrypoint="sh", args=["-c", replica], max_retries=retries)
    role.retry_policy = RetryPolicy.APPLICATION
    return SlurmScheduler("s").submit_dryrun(AppDef("ckpt", [role]), cfg).request.materialize()


# stand-ins: srun runs the replica (in place when in the background, as a signal to it must
# reach the replica); scontrol notes its call, and a requeue ends the job as
# Slurm's does (SIGTERM to the steps and the batch shell)
STAND_INS = (
    'srun() { while [ "${1#--}" != "$1" ]; do shift; done\n'
    '  if [ "$BASHPID" = "$$" ]; then "$@"; else exec "$@"; fi; }\n'
    'scontrol() { echo "$*" >>calls; [ "$1" != requeue ] || kill -TERM "$srun_pid" $$; }\n'
)


def _run(script: str, cwd: Path, restarts: int, signal_after_ready: bool) -> tuple[int, str]:
    """Runs ``script`` as attempt ``restarts`` of job 5; returns its exit code and stderr."""
    body = STAND_INS + script
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": str(restarts)}
    with subprocess.Popen(
        ["bash", "-c", body], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    ) as p:  # fmt: skip
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        if signal_after_ready:
            p.send_signal(signal.SIGUSR1)
        _, err = p.communicate(timeout=30)
    return p.returncode, err


def _calls(cwd: Path) -> list[str]:
    calls = cwd / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


# the replica saves on the checkpoint signal, then waits for the end (a requeue or the limit)
SAVER = 'trap "echo saved >ckpt" USR1; echo ready; while :; do sleep 0.05; done'
TIMEOUT_REQUEUE = {
    "time_limit": "10m",
    "checkpoint_signal": "USR1",
    "checkpoint_grace": 4,
    "max_requeues": 2,
    "requeue_on_timeout": True,
}


def test_requeue_on_timeout_requeues_after_the_checkpoint_signal(tmp_path: Path) -> None:
    script = _script(TIMEOUT_REQUEUE, SAVER)
    assert "--requeue --open-mode=append --signal=B:USR1@4" in script
    code, err = _run(script, tmp_path, restarts=1, signal_after_ready=True)
    assert (tmp_path / "ckpt").read_text() == "saved\n"
    assert _calls(tmp_path) == ["requeue 5"]  # (attempt 1 of 3: requeue stays on)
    assert "requeueing job 5 in 2 s" in err and code != 0


def test_the_last_attempt_turns_requeue_off_and_is_not_requeued_at_the_limit(
    tmp_path: Path,
) -> None:
    replica = 'trap "exit 7" USR1; echo ready; while :; do sleep 0.05; done'
    code, err = _run(_script(TIMEOUT_REQUEUE, replica), tmp_path, 2, signal_after_ready=True)
    assert _calls(tmp_path) == ["update JobId=5 Requeue=0"]
    assert code == 7 and "requeueing" not in err


def test_without_a_checkpoint_signal_the_batch_shell_alone_is_warned(tmp_path: Path) -> None:
    cfg = {k: v for k, v in TIMEOUT_REQUEUE.items() if k != "checkpoint_signal"}
    script = _script(cfg, SAVER)
    assert "--signal=B:USR2@4" in script and "kill -USR2" not in script


def test_a_retry_is_counted_apart_from_requeues(tmp_path: Path) -> None:
    # attempt 3: one retry and two requeues before it; max_requeues=1 is spent, retries are not
    (tmp_path / "shipyard-retries-5").write_text("retry\n")
    script = _script({"max_requeues": 1}, "echo ready; exit 3", retries=2)
    code, err = _run(script, tmp_path, restarts=3, signal_after_ready=False)
    assert _calls(tmp_path) == [
        "update JobId=5 Requeue=0",
        "update JobId=5 Requeue=1",
        "requeue 5",
    ]
    assert (tmp_path / "shipyard-retries-5").read_text() == "retry\nretry\n"
    assert "attempt 3 failed with exit code 3" in err


def test_no_requeue_asked_is_no_requeue() -> None:
    script = _script({"time_limit": "1h"})
    assert "--no-requeue" in script and "scontrol" not in script


def test_the_signal_to_the_batch_shell_reaches_the_replica(tmp_path: Path) -> None:
    script = _script({"time_limit": "10m", "checkpoint_signal": "USR1", "checkpoint_grace": 120})
    assert "#SBATCH --job-name=w-0 --ntasks=1 --time=10 --no-requeue --signal=B:USR1@120" in script
    stand_in = 'srun() { while [ "${1#--}" != "$1" ]; do shift; done; exec "$@"; }\n'
    body = script.replace("\nsrun \\", "\n" + stand_in + "srun \\", 1)
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5"}
    with subprocess.Popen(
        ["bash", "-c", body], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    ) as p:  # fmt: skip
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=30)
    assert out == "got-usr1\n"
    assert "shipyard: checkpoint signal USR1" in err
    assert p.returncode == 7


def test_no_checkpoint_signal_no_trap() -> None:
    script = _script({"time_limit": "90s"})
    assert "--time=2" in script and "--signal" not in script
    assert "checkpoint signal" not in script and "srun_pid" not in script


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"time_limit": "soon"}, "time_limit: expected a positive duration"),
        ({"time_limit": "0s"}, "time_limit: expected a positive duration"),
        ({"time_limit": "1h", "checkpoint_signal": "USR9"}, "checkpoint_signal: expected a signal"),
        ({"time_limit": "1h", "checkpoint_signal": "KILL"}, "checkpoint_signal: expected a signal"),
        ({"checkpoint_signal": "USR1"}, "checkpoint_signal: needs a time_limit"),
        (
            {"time_limit": "60s", "checkpoint_signal": "USR1", "checkpoint_grace": 60},
            "checkpoint_grace: expected fewer seconds than time_limit (60), got 60",
        ),
        ({"time_limit": "1h", "checkpoint_grace": -1}, "checkpoint_grace: expected a duration >="),
        ({"max_requeues": -1}, "max_requeues: expected a whole number >= 0, got -1"),
        ({"max_requeues": "two"}, "max_requeues: expected a whole number >= 0"),
        ({"requeue_on_timeout": True, "time_limit": "1h"}, "requeue_on_timeout: needs max_req"),
        ({"requeue_on_timeout": True, "max_requeues": 1}, "requeue_on_timeout: needs a time_li"),
        ({"requeue_on_timeout": "maybe"}, "requeue_on_timeout: expected true or false"),
    ],
)
def test_bad_limits_name_the_option(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(LimitsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        requeue_from_cfg(cfg, limits_from_cfg(cfg))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, seconds",
    [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("01:30", 90),
     ("01:30:00", 5400), ("1-00:00:00", 86400), ("2-3", 2 * 86400 + 3 * 3600), ("1d", 86400)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert limits_from_cfg({"time_limit": text}).time_limit == seconds


def test_time_and_time_limit_together_are_refused() -> None:
    app = AppDef("ckpt", [Role("w", entrypoint="true")])
    with pytest.raises(ValueError, match="cfg.time_limit, cfg.time: expected one of them"):
        SlurmScheduler("s").submit_dryrun(app, {"time": "10", "time_limit": "10m"})


def test_over_slurmrestd_the_job_turns_its_own_requeue_off() -> None:
    # (slurmrestd's v0.0.38 API ignores requeue: false; the CLI's --no-requeue is enough)
    from core.schedulers.slurm import rest_v0038

    plain = SlurmScheduler("s").submit_dryrun(AppDef("a", [Role("w", entrypoint="true")]), {})
    body = rest_v0038.submission(plain.request, "/w", hold=False, env={})
    assert body["job"]["requeue"] is False
    assert 'scontrol update JobId="$SLURM_JOB_ID" Requeue=0' in body["script"]
    assert "Requeue=0" not in plain.request.materialize()  # (sbatch --no-requeue: no call)
    asked = SlurmScheduler("s").submit_dryrun(
        AppDef("a", [Role("w", entrypoint="true")]), {"max_requeues": 2}
    )
    body = rest_v0038.submission(asked.request, "/w", hold=False, env={})
    assert body["job"]["requeue"] is True and "-ge 2 ]" in body["script"]


def test_exclude_failed_nodes_marks_the_comment_and_is_refused_over_slurmrestd() -> None:
    from core.schedulers.slurm import rest_v0038

    app = AppDef("a", [Role("w", entrypoint="true")])
    cfg = {"max_requeues": 1, "exclude_failed_nodes": True, "comment": "mine"}
    info = SlurmScheduler("s").submit_dryrun(app, cfg)
    assert '--comment="mine shipyard-exclude-failed"' in info.request.materialize()
    with pytest.raises(ValueError, match="cfg.exclude_failed_nodes: slurmrestd's v0.0.38 API"):
        rest_v0038.submission(info.request, "/w", hold=False, env={})
    with pytest.raises(ValueError, match="cfg.exclude_failed_nodes: needs max_requeues > 0"):
        SlurmScheduler("s").submit_dryrun(app, {"exclude_failed_nodes": True})
