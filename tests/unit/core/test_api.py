from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from core import schedulers
from core.schedulers import api, get_default_scheduler_name, get_scheduler_factories
from core.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Stream,
    check_stream,
    filter_regex,
    split_lines,
    split_lines_iterator,
)
from core.specs import AppDef, AppState, Role
from tests.unit.core.memory_scheduler import MemoryScheduler


def _app() -> AppDef:
    return AppDef("demo", [Role("worker", entrypoint="echo", num_replicas=2)])


def test_every_public_name_exists() -> None:
    for name in api.__all__:
        assert hasattr(api, name), name


def test_defaults_of_responses() -> None:
    d = DescribeAppResponse()
    assert (d.app_id, d.state, d.num_restarts, d.msg) == (
        "<NOT_SET>",
        AppState.UNSUBMITTED,
        -1,
        "<NONE>",
    )
    assert d.roles == [] and d.roles_statuses == []
    assert ListAppResponse("a", AppState.RUNNING).app_handle == "<NOT_SET>"
    assert Stream("stderr") is Stream.STDERR


def test_submit_validates_cfg_and_app_before_anything_starts() -> None:
    s = MemoryScheduler("t")
    before = dict(s.apps)
    with pytest.raises(ValueError, match="cfg: unknown option"):
        s.submit(_app(), {"colour": "red"})
    with pytest.raises(ValueError, match="roles: expected at least one role"):
        s.submit(AppDef("x", []), {})
    assert s.apps == before


def test_submit_dryrun_carries_app_cfg_and_scheduler() -> None:
    s = MemoryScheduler("t")
    info = s.submit_dryrun(_app(), {"greeting": "hi"})
    assert str(info) == "memory request for demo"
    assert info._scheduler == "memory" and info._cfg == {"greeting": "hi"}
    app_id = s.schedule(info)
    assert s.exists(app_id) and not s.exists("nope")
    assert list(s.log_iter(app_id, "worker", 1)) == ["hi from worker/1\n", "second line\n"]


def test_cancel_is_idempotent_and_close_never_raises() -> None:
    s = MemoryScheduler("t")
    app_id = s.submit(_app(), None)
    s.cancel(app_id)
    s.cancel(app_id)
    s.cancel("does-not-exist")
    desc = s.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    s.close()
    s.close()
    with MemoryScheduler("t") as s2:
        assert s2.session_name == "t"


def test_workspace_on_a_scheduler_without_workspaces_is_rejected() -> None:
    with pytest.raises(ValueError, match="workspace: scheduler memory does not support workspaces"):
        MemoryScheduler("t").submit(_app(), None, workspace="/tmp")


def test_base_log_iter_is_not_implemented() -> None:
    class NoLogs(MemoryScheduler):
        log_iter = api.Scheduler.log_iter  # type: ignore[assignment]

    with pytest.raises(NotImplementedError):
        NoLogs("t").log_iter("a", "r")


def test_split_lines_keeps_whitespace_and_carriage_returns() -> None:
    assert split_lines("a\n  b \r\nprogress\r50%\rdone\nlast") == [
        "a\n",
        "  b \r\n",
        "progress\r50%\rdone\n",
        "last",
    ]
    assert list(split_lines_iterator(["ab", "c\nd", "e\n", "\n", "tail"])) == [
        "abc\n",
        "de\n",
        "\n",
        "tail",
    ]
    assert list(filter_regex("^b", ["a\n", "b\n", "cb\n"])) == ["b\n"]
    assert list(filter_regex(None, ["a\n"])) == ["a\n"]


def test_check_stream() -> None:
    assert check_stream(None, [Stream.STDOUT, Stream.COMBINED]) == Stream.COMBINED
    assert check_stream("stdout", list(Stream)) == Stream.STDOUT
    with pytest.raises(ValueError, match="streams: stderr is not supported"):
        check_stream(Stream.STDERR, [Stream.COMBINED])
    with pytest.raises(ValueError, match="streams: expected one of"):
        check_stream("both", list(Stream))


def test_builtin_schedulers_registered_with_local_cwd_first() -> None:
    factories = get_scheduler_factories()
    assert list(factories)[0] == "local_cwd" == get_default_scheduler_name()
    assert {"local_cwd", "local_dir", "local_docker", "slurm"} <= set(factories)


def test_third_party_scheduler_is_discovered_through_entry_points(tmp_path: Path) -> None:
    dist = tmp_path / "memsched-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memsched\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[shipyard.schedulers]\nmemory = tests.unit.core.memory_scheduler:create_scheduler\n"
    )
    sys.path.insert(0, str(tmp_path))
    schedulers._discover.cache_clear()
    try:
        factories = get_scheduler_factories()
        assert "memory" in factories and list(factories)[0] == "local_cwd"
        sched = factories["memory"]("sess", extra=1)
        assert isinstance(sched, MemoryScheduler) and sched.kwargs == {"extra": 1}
    finally:
        sys.path.remove(str(tmp_path))
        schedulers._discover.cache_clear()


def test_installed_changed_and_removed_schedulers_are_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def discovered() -> set[str]:
        schedulers._discover.cache_clear()
        try:
            return set(get_scheduler_factories())
        finally:
            schedulers._discover.cache_clear()

    assert "memory" not in discovered()

    dist = site / "memsched-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memsched\nVersion: 1.0\n")
    eps = dist / "entry_points.txt"
    eps.write_text(
        "[shipyard.schedulers]\nmemory = tests.unit.core.memory_scheduler:create_scheduler\n"
    )
    assert "memory" in discovered()  # installed

    eps.write_text(
        "[shipyard.schedulers]\nmemory2 = tests.unit.core.memory_scheduler:create_scheduler\n"
    )
    found = discovered()
    assert "memory2" in found and "memory" not in found  # changed in place
    schedulers._discover.cache_clear()
    sched = get_scheduler_factories()["memory2"]("sess")
    schedulers._discover.cache_clear()
    assert isinstance(sched, MemoryScheduler)

    shutil.rmtree(dist)
    assert "memory2" not in discovered()  # removed
