"""Time limits and the checkpoint signal on local processes (``time_limit``,
``checkpoint_signal``, ``checkpoint_grace``): enforced by whoever watches the app (its log
collector, a process of its own), as a cancel is."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.runner import Runner
from core.schedulers.api import Stream
from core.schedulers.local.appdir import AppDir, apps_root
from core.specs import AppDef, AppState, Role, parse_app_handle
from tests.helpers import TRAINING, TRAINING_STEPS, wait_until
from tests.integration import arrays


def _stamp(path: Path) -> str:
    return f"date +%s.%N > {path}"


def test_a_replica_gets_the_signal_grace_seconds_before_the_limit_then_ends(
    runner: Runner, tmp_path: Path
) -> None:
    ckpt, term = tmp_path / "ckpt", tmp_path / "term"
    script = (
        f"trap '{_stamp(ckpt)}' USR1; trap '{_stamp(term)}; exit 143' TERM;"
        " while :; do sleep 0.05; done"
    )
    app = AppDef("limited", [Role("w", entrypoint="sh", args=["-c", script], num_replicas=2)])
    cfg = {"time_limit": "4s", "checkpoint_signal": "USR1", "checkpoint_grace": 2}
    handle = runner.run(app, "local_cwd", cfg)
    status = arrays.final(runner, handle, timeout=60)
    assert status.state == AppState.FAILED and status.reason == "timeout", status
    assert "time limit of 4s reached" in status.msg
    replicas = [r for rs in status.roles for r in rs.replicas]
    assert [r.reason for r in replicas] == ["timeout", "timeout"]
    assert all(r.exit_code in (143, -15) for r in replicas), replicas  # (its trap's exit)
    # the checkpoint signal came first, about the grace before the limit
    gap = float(term.read_text()) - float(ckpt.read_text())
    assert 1.0 < gap < 3.0, gap


def test_the_collector_alone_keeps_the_signal_and_the_limit_on_time(
    runner: Runner, tmp_path: Path
) -> None:
    """Nobody describes the app: its collector, asleep between looks at an idle app, wakes
    itself for the checkpoint signal and for the limit."""
    ckpt, term = tmp_path / "ckpt", tmp_path / "term"
    script = (
        f"trap '{_stamp(ckpt)}' USR1; trap '{_stamp(term)}; exit 143' TERM;"
        " while :; do sleep 0.05; done"
    )
    app = AppDef("alone", [Role("w", entrypoint="sh", args=["-c", script])])
    cfg = {"time_limit": "5s", "checkpoint_signal": "USR1", "checkpoint_grace": 2}
    handle = runner.run(app, "local_cwd", cfg)
    app_dir = AppDir(apps_root(), parse_app_handle(handle).app_id)
    record = app_dir.read_record()
    assert record is not None
    wait_until(lambda: term.exists() and term.read_text(), 60, "the limit's SIGTERM")
    at_ckpt = float(ckpt.read_text()) - record.submit_time
    at_term = float(term.read_text()) - record.submit_time
    assert 2.7 < at_ckpt < 3.9, at_ckpt  # (3 s: the limit less the grace)
    assert 4.7 < at_term < 5.9, at_term


def test_without_a_checkpoint_signal_the_limit_ends_a_replica_ignoring_sigterm(
    runner: Runner, tmp_path: Path
) -> None:
    app = AppDef("stubborn", [Role("w", entrypoint="sh", args=["-c", "trap '' TERM; sleep 300"])])
    handle = runner.run(app, "local_cwd", {"time_limit": "1s"})
    status = arrays.final(runner, handle, timeout=60)
    assert status.state == AppState.FAILED and status.reason == "timeout", status
    # (the shell ignored SIGTERM: SIGKILL after the grace)
    assert [r.exit_code for rs in status.roles for r in rs.replicas] == [-9]


def test_an_app_that_ends_in_time_is_not_touched(runner: Runner) -> None:
    app = AppDef("quick", [Role("w", entrypoint="true")])
    handle = runner.run(app, "local_cwd", {"time_limit": "1m", "checkpoint_signal": "USR1"})
    status = arrays.final(runner, handle, timeout=60)
    assert status.state == AppState.SUCCEEDED and status.reason == "exit_code"


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"time_limit": "forever"}, "time_limit: expected a positive duration"),
        ({"time_limit": "1m", "checkpoint_signal": "NOPE"}, "checkpoint_signal: expected a"),
        ({"checkpoint_signal": "USR1"}, "checkpoint_signal: needs a time_limit"),
    ],
)
def test_bad_limits_are_refused_before_anything_starts(
    runner: Runner, cfg: dict[str, object], message: str
) -> None:
    app = AppDef("bad", [Role("w", entrypoint="true")])
    with pytest.raises(ValueError, match=message):
        runner.run(app, "local_cwd", cfg)


def test_each_replica_sees_its_attempt_and_a_checkpoint_directory_kept_after_the_end(
    runner: Runner,
) -> None:
    script = 'echo "$SHIPYARD_ATTEMPT" > "$SHIPYARD_CHECKPOINT_DIR/step.$SHIPYARD_REPLICA_ID"'
    app = AppDef("ckptdir", [Role("w", entrypoint="sh", args=["-c", script], num_replicas=2)])
    handle = runner.run(app, "local_cwd")
    assert arrays.final(runner, handle, timeout=60).state == AppState.SUCCEEDED
    checkpoint = Path(AppDir(apps_root(), parse_app_handle(handle).app_id).checkpoint_dir)
    assert sorted(p.name for p in checkpoint.iterdir()) == ["step.0", "step.1"]
    assert (checkpoint / "step.1").read_text() == "0\n"


def test_requeued_at_its_time_limit_it_resumes_and_does_every_step_once(runner: Runner) -> None:
    """With ``requeue_on_timeout`` each replica's limit script keeps the limit and starts the
    command again (at most 25 steps an attempt: 60 steps take three, however loaded)."""
    app = AppDef("train", [Role("train", entrypoint="sh", args=["-c", TRAINING])])
    cfg = {"time_limit": "6s", "checkpoint_signal": "USR1", "checkpoint_grace": 3,
           "max_requeues": 2, "requeue_on_timeout": True}  # fmt: skip
    handle = runner.run(app, "local_cwd", cfg)
    status = arrays.final(runner, handle, timeout=90)
    assert status.state == AppState.SUCCEEDED, status
    assert [(a.number, a.reason) for a in status.attempts] == [(0, "timeout"), (1, "timeout")]
    lines = [x.rstrip("\n") for x in runner.log_lines(handle, "train", 0)]
    assert [int(x.split()[1]) for x in lines if x.startswith("step ")] == list(
        range(TRAINING_STEPS)
    )
    assert [x.split()[1:] for x in lines if x.startswith("start ")] == [
        ["0", "0"], ["1", "25"], ["2", "50"]
    ], lines  # fmt: skip
    usr1 = [int(x.split()[2]) for x in lines if x.startswith("usr1 ")]
    term = [int(x.split()[2]) for x in lines if x.startswith("term ")]
    assert len(usr1) == len(term) == 2, lines
    assert all(2 <= t - u <= 4 for u, t in zip(usr1, term, strict=True)), lines
    stderr = runner.log_lines(handle, "train", 0, streams=Stream.STDERR)
    assert sum("shipyard: attempt" in x for x in stderr) == 2


def test_past_its_last_requeue_it_ends_timeout(runner: Runner) -> None:
    app = AppDef("over", [Role("w", entrypoint="sh", args=["-c", "sleep 300"])])
    cfg = {"time_limit": "2s", "max_requeues": 1, "requeue_on_timeout": True}
    status = arrays.final(runner, runner.run(app, "local_cwd", cfg), timeout=60)
    assert status.state == AppState.FAILED and status.reason == "timeout", status
    assert [(a.number, a.reason) for a in status.attempts] == [(0, "timeout")]
    assert [r.exit_code for rs in status.roles for r in rs.replicas] == [124]
