"""core.watch.follow: log cursors, and following a real local app's logs from a cursor."""

from __future__ import annotations

import queue
from typing import Any

import pytest

from core.runner import get_runner
from core.specs import AppDef, Role
from core.watch.follow import END, LogCursor, LogFollower, LogLine, lines_after

SCRIPT = 'for i in 1 2 3 4; do echo "line $i of ${replica_id}"; done'


def test_cursor_accepts_each_line_once_in_order() -> None:
    cursor = LogCursor({"a/0": 1})
    line = LogLine("a", 0, "x")
    assert not cursor.accept(0, line)  # delivered already
    assert cursor.accept(1, line)
    assert not cursor.accept(1, line)  # not twice
    assert cursor.accept(0, LogLine("b", 1, "y"))
    assert cursor.to_dict() == {"a/0": 2, "b/1": 1}
    assert cursor.total == 3


def test_cursor_merge_takes_the_later_position() -> None:
    merged = LogCursor({"a/0": 3, "a/1": 1}).merged({"a/1": 4, "b/0": 2})
    assert merged.to_dict() == {"a/0": 3, "a/1": 4, "b/0": 2}


@pytest.mark.parametrize("bad", [{"a/0": -1}, {"a/0": "3"}, {"a/0": True}, {3: 1}])
def test_bad_cursor_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="log cursor"):
        LogCursor(bad)


def test_follower_and_lines_after_resume_at_the_cursor() -> None:
    with get_runner() as runner:
        app = AppDef("follow", [Role("r", entrypoint="sh", args=["-c", SCRIPT], num_replicas=2)])
        handle = runner.run(app, "local_cwd")
        start = LogCursor({"r/0": 3})
        items: queue.Queue[Any] = queue.Queue()
        follower = LogFollower(runner, handle, items.put, start)
        follower.add([("r", 0), ("r", 1)])
        follower.close()
        got: list[tuple[int, LogLine]] = []
        while (item := items.get(timeout=60)) is not END:
            got.append(item)
        by_replica = {
            k: [(i, line.line.strip()) for i, line in got if line.replica == k] for k in (0, 1)
        }
        assert by_replica[0] == [(3, "line 4 of 0")]
        assert by_replica[1] == [(i - 1, f"line {i} of 1") for i in (1, 2, 3, 4)]
        runner.wait(handle, timeout=60)
        rest = lines_after(runner, handle, LogCursor({"r/0": 4, "r/1": 2}))
        assert [(i, str(line)) for i, line in rest] == [
            (2, "r/1 line 3 of 1"),
            (3, "r/1 line 4 of 1"),
        ]
