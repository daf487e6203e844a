"""The Docker request of a time-limited app (no engine): its script as the entrypoint, the
retries and requeues it is given (the engine's restart policy left off), the checkpoint
volume; bad limits refused naming the option; the attempts record read back."""

from __future__ import annotations

from typing import Any

import pytest

from core.limits import parse_attempts
from core.schedulers.docker import request
from core.schedulers.docker.timelimit import CHECKPOINT_PATH
from core.specs import AppDef, Attempt, Role

IMAGE = "shipyard-test/busybox:latest"


def _cfg(**extra: Any) -> dict[str, Any]:
    cfg = request.run_opts().resolve({})
    cfg.update(extra)
    return cfg


def _app(max_retries: int = 0) -> AppDef:
    return AppDef(
        "t", [Role("w", image=IMAGE, entrypoint="sleep", args=["9"], max_retries=max_retries)]
    )


def test_a_time_limit_runs_the_command_under_its_script_which_retries_and_requeues() -> None:
    cfg = _cfg(time_limit="10m", checkpoint_signal="USR1", checkpoint_grace=30, max_requeues=2,
               requeue_on_timeout=True, stop_timeout=5)  # fmt: skip
    request.validate(_app(3), cfg)
    job = request.build_job(_app(3), cfg, "s")
    c = job.containers[0]
    entry = c.kwargs["entrypoint"]
    assert isinstance(entry, list) and entry[:2] == ["/bin/sh", "-c"]
    # signal, seconds to it, from it to the limit, SIGKILL after, retries, requeues, record
    assert entry[4:] == ["USR1", "570", "30", "5", "3", "2", "/tmp/.shipyard-attempts"]
    assert c.command == ["sleep", "9"] and "restart_policy" not in c.kwargs
    labels = c.kwargs["labels"]
    assert isinstance(labels, dict)
    assert labels["shipyard.time_limit"] == "600" and labels["shipyard.requeues"] == "2"
    assert job.checkpoint_volume == f"{job.app_id}-checkpoint"
    assert {"Type": "volume", "Source": job.checkpoint_volume, "Target": CHECKPOINT_PATH,
            "ReadOnly": False} in c.kwargs["mounts"]  # type: ignore[operator]  # fmt: skip
    env = c.kwargs["environment"]
    assert isinstance(env, dict)
    assert env["SHIPYARD_CHECKPOINT_DIR"] == CHECKPOINT_PATH and env["SHIPYARD_ATTEMPT"] == "0"


def test_without_a_time_limit_nothing_changes() -> None:
    job = request.build_job(_app(2), _cfg(), "s")
    c = job.containers[0]
    assert "entrypoint" not in c.kwargs and "mounts" not in c.kwargs
    assert c.kwargs["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 2}
    assert job.checkpoint_volume is None


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"time_limit": "soon"}, "time_limit: expected a positive duration"),
        ({"time_limit": "1m", "checkpoint_grace": 60, "checkpoint_signal": "USR1"},
         "checkpoint_grace: expected fewer seconds than time_limit"),
        ({"time_limit": "1m", "checkpoint_signal": "KILL"}, "checkpoint_signal: expected a signal"),
        ({"max_requeues": -1}, "max_requeues: expected a whole number >= 0"),
        ({"requeue_on_timeout": True, "max_requeues": 1}, "requeue_on_timeout: needs a time_limit"),
    ],
)  # fmt: skip
def test_bad_limits_are_refused_naming_the_option(extra: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        request.validate(_app(), _cfg(**extra))


def test_the_attempts_record_is_read_back_skipping_what_it_cannot_read() -> None:
    text = "0 timeout 143\n1 exit_code 3\ngarbage\n"
    assert parse_attempts(text, "w-0") == [
        Attempt(0, "TIMEOUT", "timeout", "w-0"),
        Attempt(1, "FAILED", "exit_code", "w-0"),
    ]
