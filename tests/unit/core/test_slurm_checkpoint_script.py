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

from core.limits import LimitsError, limits_from_cfg
from core.schedulers.slurm.scheduler import SlurmScheduler
from core.specs import AppDef, Role

REPLICA = 'trap "echo got-usr1; exit 7" USR1; echo ready; while :; do sleep 0.05; done'


def _script(cfg: dict[str, object]) -> str:
    app = AppDef("ckpt", [Role("w", entrypoint="sh", args=["-c", REPLICA])])
    return SlurmScheduler("s").submit_dryrun(app, cfg).request.materialize()


def test_the_signal_to_the_batch_shell_reaches_the_replica(tmp_path: Path) -> None:
    script = _script({"time_limit": "10m", "checkpoint_signal": "USR1", "checkpoint_grace": 120})
    assert "#SBATCH --job-name=w-0 --ntasks=1 --time=10 --signal=B:USR1@120" in script
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
        ({"time_limit": "1h", "checkpoint_grace": -1}, "checkpoint_grace: expected a number"),
    ],
)
def test_bad_limits_name_the_option(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(LimitsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        limits_from_cfg(cfg)  # type: ignore[arg-type]


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
