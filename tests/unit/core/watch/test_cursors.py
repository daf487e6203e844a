"""The file cursor store: what a watch that restarts elsewhere reads back (the Prefect worker's)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from core.watch import FileCursorStore, LogCursor

HANDLE = "local_cwd://s/app-1"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_saved_cursor_is_read_back_from_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "run.json"
    FileCursorStore(path, HANDLE).save(LogCursor({"w/0": 3, "w/1": 1}))
    assert FileCursorStore(str(path), HANDLE).load().to_dict() == {"w/0": 3, "w/1": 1}
    assert _mode(path) == 0o600
    assert _mode(tmp_path / "a") == _mode(tmp_path / "a" / "b") == 0o700
    assert os.listdir(path.parent) == ["run.json"]  # (no temporary file left)


def test_another_apps_cursor_or_a_bad_file_reads_as_none_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "run.json"
    FileCursorStore(path, "local_cwd://s/other").save(LogCursor({"w/0": 5}))
    assert FileCursorStore(path, HANDLE).load().to_dict() == {}
    path.write_text("{not json")
    assert FileCursorStore(path, HANDLE).load().to_dict() == {}
    assert "ignoring the log cursor" in caplog.text
    assert FileCursorStore(tmp_path / "missing.json", HANDLE).load().to_dict() == {}


def test_clear_removes_the_file_and_a_relative_path_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = FileCursorStore("run.json", HANDLE)
    store.save(LogCursor({"w/0": 1}))
    assert json.loads((tmp_path / "run.json").read_text())["app_handle"] == HANDLE
    store.clear()
    store.clear()  # (idempotent)
    assert not (tmp_path / "run.json").exists()
