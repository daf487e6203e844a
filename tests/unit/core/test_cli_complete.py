"""The `shipyard` command's completers (core.cli_complete), called as argcomplete calls them,
on a runner that answers from memory."""

from __future__ import annotations

import argparse
import builtins
from pathlib import Path
from typing import Any

import pytest

from core import cli_complete as complete
from core.cli import build_parser
from core.options import runopts
from core.schedulers.api import ListAppResponse
from core.specs import AppState


class FakeRunner:
    """What the completers ask of a runner; ``down``: schedulers that cannot be reached."""

    def __init__(self, down: tuple[str, ...] = ()) -> None:
        self.down = down
        self.listed: list[str] = []

    def __enter__(self) -> FakeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        if scheduler in self.down:
            raise ConnectionError(scheduler)
        opts = runopts()
        opts.add(f"{scheduler}_only", type_=str, help="x")
        opts.add("time", type_=str, help="t")
        opts.add("time_limit", type_=str, help="t")
        opts.add("exclusive", type_=bool, help="b", default=False)
        return opts

    def list(self, scheduler: str) -> list[ListAppResponse]:
        self.listed.append(scheduler)
        if scheduler in self.down:
            raise ConnectionError(scheduler)
        return [
            ListAppResponse(app_id=a, state=AppState.RUNNING, app_handle=f"{scheduler}://s/{a}")
            for a in ("train-1", "train-2", "eval-1")
        ]

    def replicas(self, handle: str) -> builtins.list[tuple[str, int]]:
        return [("trainer", 0), ("trainer", 1), ("ps", 0)] if handle.endswith("train-1") else []


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeRunner:
    fake = FakeRunner(down=("slurm",))
    monkeypatch.setattr(complete, "_runner", lambda: fake)
    monkeypatch.chdir(tmp_path)  # (no defaults file but the tests' own)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for var in ("SHIPYARD_SCHEDULER", "SHIPYARD_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return fake


def ns(**kwargs: Any) -> argparse.Namespace:
    return argparse.Namespace(**kwargs)


def test_scheduler_names() -> None:
    assert complete.schedulers("local_d") == ["local_dir", "local_docker"]
    assert "slurm" in complete.schedulers("")
    assert complete.schedulers("nope") == []


def test_cfg_keys_of_the_chosen_scheduler(runner: FakeRunner) -> None:
    assert complete.cfg_keys("ti", parsed_args=ns(scheduler="local_docker")) == [
        "time=",
        "time_limit=",
    ]
    assert (
        complete.cfg_keys("", parsed_args=ns(scheduler="local_docker"))[0] == "local_docker_only="
    )
    # after a given option: the others, the first kept as typed
    assert complete.cfg_keys("time=1h,ti", parsed_args=ns(scheduler=None)) == [
        "time=1h,time_limit="
    ]
    assert complete.cfg_keys("exclusive=", parsed_args=ns(scheduler=None)) == [
        "exclusive=true",
        "exclusive=false",
    ]
    assert complete.cfg_keys("exclusive=f", parsed_args=ns(scheduler=None)) == ["exclusive=false"]
    assert complete.cfg_keys("time=", parsed_args=ns(scheduler=None)) == []
    # no scheduler given: the default one (local_cwd), or the defaults file's
    assert complete.cfg_keys("local", parsed_args=ns()) == ["local_cwd_only="]
    Path(".shipyardconfig").write_text("scheduler: local_dir\n")
    assert complete.cfg_keys("local", parsed_args=ns()) == ["local_dir_only="]
    Path(".shipyardconfig").write_text("scheduler: [bad\n")  # (a bad file: the first)
    assert complete.cfg_keys("local", parsed_args=ns()) == ["local_cwd_only="]
    # a scheduler that cannot answer: nothing, and no error
    assert complete.cfg_keys("", parsed_args=ns(scheduler="slurm")) == []


def test_handles_of_the_session(runner: FakeRunner) -> None:
    assert complete.handles("local_cwd://s/tr") == [
        "local_cwd://s/train-1",
        "local_cwd://s/train-2",
    ]
    # without a scheduler: the default one's handles, and the schedulers to type
    everything = complete.handles("")
    assert everything[:3] == [
        "local_cwd://s/train-1",
        "local_cwd://s/train-2",
        "local_cwd://s/eval-1",
    ]
    assert "slurm://" in everything and "local_docker://" in everything
    assert complete.handles("local_do") == ["local_docker://"]
    assert complete.handles("local_docker://s/e") == ["local_docker://s/eval-1"]
    assert runner.listed == ["local_cwd", "local_cwd", "local_cwd", "local_docker"]  # one each
    assert complete.handles("slurm://") == []  # (down)
    assert complete.handles("nope://") == []


def test_log_targets_go_down_to_replicas(runner: FakeRunner) -> None:
    assert complete.log_targets("local_cwd://s/e") == ["local_cwd://s/eval-1"]
    assert complete.log_targets("local_cwd://s/train-1/") == [
        "local_cwd://s/train-1/ps",
        "local_cwd://s/train-1/trainer",
        "local_cwd://s/train-1/trainer/0",
        "local_cwd://s/train-1/trainer/1",
        "local_cwd://s/train-1/ps/0",
    ]
    assert complete.log_targets("local_cwd://s/train-1/trainer/") == [
        "local_cwd://s/train-1/trainer/0",
        "local_cwd://s/train-1/trainer/1",
    ]
    assert complete.log_targets("local_cwd://s/eval-1/x") == []


def test_the_parser_wires_each_completer() -> None:
    def completer(cmd: str, dest: str) -> object:
        sub = next(
            a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
        ).choices[cmd]
        return next(getattr(a, "completer", None) for a in sub._actions if a.dest == dest)

    assert completer("run", "scheduler") is complete.schedulers
    assert completer("run", "cfg") is complete.cfg_keys
    assert completer("run", "after") is complete.handles
    assert completer("list", "scheduler") is complete.schedulers
    assert completer("list", "cfg") is complete.cfg_keys
    assert completer("runopts", "scheduler") is complete.schedulers
    for cmd in ("status", "cancel"):
        assert completer(cmd, "handle") is complete.handles
    assert completer("log", "target") is complete.log_targets
