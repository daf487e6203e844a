"""The same scripted backend failures (``memory_scheduler.Scenario``: a hiccup, an outage past the
retry budget, silent replicas) through every face of the watch that lives in core: ``Runner.wait``
and the ``shipyard`` command. The Airflow faces (operator, trigger) and the Prefect ones (task,
worker) have the same tests in their packages' ``test_watch_faces.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core import cli
from core.errors import BackendUnavailableError
from core.runner import get_runner
from core.specs import AppDef, AppState, Role
from tests.unit.core.memory_scheduler import OUTAGE_BUDGET, SILENCE, Scenario, use_memory_scheduler


@pytest.fixture(autouse=True)
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_memory_scheduler(monkeypatch)
    monkeypatch.setenv("SHIPYARD_RETRY_BUDGET", OUTAGE_BUDGET)
    yield


APP = AppDef("face", [Role("w", entrypoint="echo", num_replicas=2)])


def test_runner_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    with get_runner() as runner:
        with Scenario("hiccup") as s:
            status = runner.wait(runner.run(APP, "memory"), wait_interval=0.1)
            assert status is not None and status.state == AppState.SUCCEEDED == s.state
        with Scenario("outage"):
            handle = runner.run(APP, "memory")
            with pytest.raises(BackendUnavailableError, match="kept failing"):
                runner.wait(handle, wait_interval=0.1)


def shipyard(*args: str) -> int:
    return cli.main(["run", "--scheduler", "memory", "--progress", "none", *args, "--", "echo"])


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with Scenario("hiccup") as s:
        assert shipyard("--wait") == cli.EXIT_OK
        assert s.state == AppState.SUCCEEDED
    with Scenario("outage"):
        assert shipyard("--wait") == cli.EXIT_BACKEND_UNAVAILABLE
    assert "backend unavailable (try again later)" in capsys.readouterr().err
    with Scenario("silent") as s:
        assert shipyard("--max-silence", str(SILENCE)) == cli.EXIT_APP_FAILED
        assert s.state == AppState.CANCELLED
    err = capsys.readouterr().err
    assert "no log line for 0.5s from echo/0 (max_silence)" in err
