"""core.watch.silence: which running replicas are silent for too long, with their last lines."""

from __future__ import annotations

import pytest

from core.specs import AppDef, AppState, AppStatus, ReplicaStatus, Role, RoleStatus
from core.watch.follow import LogLine
from core.watch.silence import SilenceWatch, check_max_silence, effective_max_silence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def status(*states: AppState, app: AppState = AppState.RUNNING) -> AppStatus:
    replicas = [ReplicaStatus(k, s, "w", "host") for k, s in enumerate(states)]
    return AppStatus(app, roles=[RoleStatus("w", replicas)])


def test_a_replica_is_silent_once_its_last_line_is_older_than_the_limit() -> None:
    clock = Clock()
    watch = SilenceWatch(10, clock)
    running = status(AppState.RUNNING, AppState.RUNNING)
    assert watch.silent(running) == []  # first seen running: the clock starts
    for i in range(5):
        watch.saw(LogLine("w", 0, f"step {i}\n"))
    clock.now += 6
    watch.saw(LogLine("w", 1, "tick\n"))
    clock.now += 4  # w/0: 10 s without a line; w/1: 4 s
    assert watch.silent(running) == ["w/0"]
    clock.now += 6
    assert watch.silent(running) == ["w/0", "w/1"]
    message = watch.message("local_cwd://s/app", ["w/0", "w/1"])
    assert message.startswith(
        "local_cwd://s/app: cancelled (reason silent): no log line for 10s from w/0, w/1"
    )
    # the last three lines of each
    assert "w/0: 'step 2' | 'step 3' | 'step 4'" in message and "w/1: 'tick'" in message


def test_only_running_replicas_of_a_running_app_count() -> None:
    clock = Clock()
    watch = SilenceWatch(5, clock)
    watch.silent(status(AppState.RUNNING, AppState.RUNNING))
    clock.now += 60
    assert watch.silent(status(AppState.SUCCEEDED, AppState.RUNNING)) == ["w/1"]
    assert watch.silent(status(AppState.RUNNING, app=AppState.PENDING)) == []
    assert watch.silent(None) == []


def test_a_replica_that_never_printed_is_silent_from_when_it_was_seen_running() -> None:
    clock = Clock()
    watch = SilenceWatch(5, clock)
    assert watch.silent(status(AppState.PENDING, app=AppState.PENDING)) == []
    clock.now += 60  # queued for a minute: not silent
    assert watch.silent(status(AppState.RUNNING)) == []
    clock.now += 5
    assert watch.silent(status(AppState.RUNNING)) == ["w/0"]
    assert "w/0: no line" in watch.message("h", ["w/0"])


@pytest.mark.parametrize("bad", [0, -1, "0s", "ten", "10x", True, float("inf"), float("nan")])
def test_max_silence_must_be_a_positive_duration(bad: object) -> None:
    with pytest.raises(ValueError, match="^max_silence: expected a positive duration such as 90s"):
        check_max_silence(bad)
    assert check_max_silence(None) is None and check_max_silence(3) == 3.0
    assert check_max_silence("10") == 10.0 and check_max_silence("10m") == 600.0


def test_a_waiters_own_max_silence_wins_over_the_apps() -> None:
    app = AppDef("a", [Role("r", entrypoint="true")], metadata={"max_silence": "30"})
    assert effective_max_silence(5, app) == 5.0
    assert effective_max_silence(None, app) == 30.0
    assert effective_max_silence(None, AppDef("b", app.roles)) is None
    app.metadata["max_silence"] = "2h"
    assert effective_max_silence(None, app) == 7200.0
    app.metadata["max_silence"] = "0"
    with pytest.raises(ValueError, match=r"^metadata.max_silence: expected a positive duration"):
        effective_max_silence(None, app)
