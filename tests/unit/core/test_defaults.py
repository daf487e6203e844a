"""The defaults files of the `shipyard` command (core.defaults): where they are, what wins,
and one line naming the file and the key for whatever is wrong in them."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.defaults import (
    DefaultsError,
    cfg_env_name,
    config_paths,
    load_defaults,
    scheduler_and_cfg,
)
from core.options import CfgVal, runopts

SCHEDULERS = ["local_cwd", "local_docker", "slurm"]


def _opts(scheduler: str) -> runopts:
    opts = runopts()
    opts.add("partition", type_=str, help="p")
    opts.add("stop_timeout", type_=int, help="s", default=10)
    opts.add("copy_env", type_=list[str], help="c")
    opts.add("flag", type_=bool, help="f", default=False)
    opts.add("env", type_=dict[str, str], help="e")
    return opts


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose XDG_CONFIG_HOME is empty; cwd is tmp_path / "project"."""
    (tmp_path / "project").mkdir()
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def _user_file(env: dict[str, str], text: str) -> Path:
    path = Path(env["XDG_CONFIG_HOME"]) / "shipyard" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _choose(
    tmp_path: Path, env: dict[str, str], scheduler: str | None = None, cfg: str | None = None
) -> tuple[str, dict[str, CfgVal]]:
    return scheduler_and_cfg(scheduler, cfg, SCHEDULERS, _opts, tmp_path / "project", env)


def test_no_file_no_defaults(tmp_path: Path, home: dict[str, str]) -> None:
    assert config_paths(tmp_path / "project", home) == []
    assert _choose(tmp_path, home) == ("local_cwd", {})


def test_the_project_file_wins_key_by_key_over_the_users(
    tmp_path: Path, home: dict[str, str]
) -> None:
    user = _user_file(home, "scheduler: slurm\nslurm: {partition: long, stop_timeout: 5}\n")
    project = tmp_path / "project" / ".shipyardconfig"
    project.write_text("slurm:\n  partition: debug\n")
    assert config_paths(tmp_path / "project", home) == [str(user), str(project)]
    assert _choose(tmp_path, home) == ("slurm", {"partition": "debug", "stop_timeout": 5})
    # ~/.config when XDG_CONFIG_HOME is not set
    assert config_paths(tmp_path / "project", {"HOME": str(tmp_path / "h")}) == [str(project)]
    dotconfig = tmp_path / "h" / ".config" / "shipyard" / "config.yaml"
    dotconfig.parent.mkdir(parents=True)
    dotconfig.write_text("scheduler: slurm\n")
    assert config_paths(tmp_path / "project", {"HOME": str(tmp_path / "h")}) == [
        str(dotconfig),
        str(project),
    ]


def test_flags_over_environment_over_files(tmp_path: Path, home: dict[str, str]) -> None:
    _user_file(home, "scheduler: local_docker\nslurm: {partition: a, stop_timeout: 1}\n")
    env = {**home, "SHIPYARD_SCHEDULER": "slurm", "SHIPYARD_CFG_SLURM": "partition=b,flag=yes"}
    assert _choose(tmp_path, env) == ("slurm", {"partition": "b", "stop_timeout": 1, "flag": True})
    assert _choose(tmp_path, env, "slurm", "partition=c") == (
        "slurm",
        {"partition": "c", "stop_timeout": 1, "flag": True},
    )
    # a flag's scheduler gets its own defaults, none of another's
    assert _choose(tmp_path, env, "local_cwd") == ("local_cwd", {})
    assert _choose(tmp_path, home) == ("local_docker", {})


def test_yaml_values_read_as_the_options_types(tmp_path: Path, home: dict[str, str]) -> None:
    _user_file(
        home,
        "local_docker:\n  partition: 42\n  copy_env: [A*, 1]\n  flag: true\n"
        "  env: {A: 1, B: x}\n  stop_timeout: '30'\n",
    )
    assert _choose(tmp_path, home, "local_docker")[1] == {
        "partition": "42",
        "copy_env": ["A*", "1"],
        "flag": True,
        "env": {"A": "1", "B": "x"},
        "stop_timeout": 30,
    }


def test_an_explicit_file_replaces_both(tmp_path: Path, home: dict[str, str]) -> None:
    _user_file(home, "scheduler: slurm\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text("scheduler: local_docker\n")
    assert load_defaults(
        SCHEDULERS, tmp_path, {**home, "SHIPYARD_CONFIG": str(mine)}
    ).scheduler == ("local_docker")
    with pytest.raises(DefaultsError, match=r"^SHIPYARD_CONFIG: no such file '/nonexistent'$"):
        load_defaults(SCHEDULERS, tmp_path, {"SHIPYARD_CONFIG": "/nonexistent"})


@pytest.mark.parametrize(
    "text, message",
    [
        ("scheduler: slrum\n", "scheduler: unknown scheduler 'slrum'; expected one of local_cwd,"),
        ("slrum: {partition: x}\n", "slrum: not a scheduler; expected scheduler or one of"),
        ("slurm: debug\n", "slurm: expected a mapping of run options, got 'debug'"),
        ("slurm: {partitio: x}\n", "slurm.partitio: unknown option; valid options are: partition,"),
        ("slurm: {stop_timeout: soon}\n", "slurm.stop_timeout: expected int, got 'soon'"),
        ("slurm: {flag: maybe}\n", "slurm.flag: expected a bool (true/false), got 'maybe'"),
        ("- slurm\n", "expected a mapping of scheduler and schedulers, got list"),
        ("slurm: {partition: [a\n", ":2:1: not valid YAML (expected ',' or ']'"),
    ],
)
def test_bad_content_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, home: dict[str, str], text: str, message: str
) -> None:
    path = tmp_path / "project" / ".shipyardconfig"
    path.write_text(text)
    with pytest.raises(DefaultsError) as err:
        _choose(tmp_path, home, "slurm")
    assert str(err.value).startswith(str(path)), str(err.value)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)  # (the CLI: exit 2)


def test_bad_variables_are_named(tmp_path: Path, home: dict[str, str]) -> None:
    with pytest.raises(DefaultsError, match=r"^SHIPYARD_SCHEDULER: unknown scheduler 'x'"):
        _choose(tmp_path, {**home, "SHIPYARD_SCHEDULER": "x"})
    env = {**home, "SHIPYARD_CFG_LOCAL_DOCKER": "stop_timeout=soon"}
    with pytest.raises(DefaultsError, match=r"^SHIPYARD_CFG_LOCAL_DOCKER: cfg.stop_timeout: exp"):
        _choose(tmp_path, env, "local_docker")
    assert cfg_env_name("local_docker") == "SHIPYARD_CFG_LOCAL_DOCKER"
    assert cfg_env_name("my-sched.v2") == "SHIPYARD_CFG_MY_SCHED_V2"


def test_an_empty_file_or_section_is_no_default(tmp_path: Path, home: dict[str, str]) -> None:
    _user_file(home, "")
    (tmp_path / "project" / ".shipyardconfig").write_text("slurm:\n")
    assert _choose(tmp_path, home, "slurm") == ("slurm", {})
