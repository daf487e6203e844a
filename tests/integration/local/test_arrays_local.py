"""Arrays on local processes (``Runner.run_array``, the driver, the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.runner import Runner
from core.specs import AppDef, AppState, Role
from tests.integration import arrays


def role(script: str) -> Role:
    return Role("w", entrypoint="sh", args=["-c", script])


def test_fifty_elements_at_most_four_at_once_each_once(runner: Runner, tmp_path: Path) -> None:
    status = arrays.check_cap_and_once(runner, "local_cwd", {}, role, str(tmp_path), 50)
    assert status.elements is not None
    handle = status.elements[0].handle or ""
    assert runner.status(handle) is not None  # each element is an app of the backend


def test_results_per_element(runner: Runner, tmp_path: Path) -> None:
    script = 'echo "{\\"square\\": $((SHIPYARD_ARRAY_INDEX * SHIPYARD_ARRAY_INDEX))}" > "$SHIPYARD_RESULT_FILE"'
    handle = runner.run_array(AppDef("sq", [role(script)]), "local_cwd", size=5, max_parallel=2)
    assert arrays.final(runner, handle).state == AppState.SUCCEEDED
    results = runner.results(handle)
    assert [r.get("w")["square"] if r else None for r in results] == [0, 1, 4, 9, 16]
    assert runner.result(f"{handle}[3]").get("w") == {"square": 9}


def test_cancel_mid_array(runner: Runner, tmp_path: Path) -> None:
    arrays.check_cancel(runner, "local_cwd", {}, role, str(tmp_path))


def test_retry_failed_reruns_only_the_failed(runner: Runner, tmp_path: Path) -> None:
    arrays.check_retry_failed(runner, "local_cwd", {}, role, str(tmp_path))


def test_submitter_killed_after_submit_changes_nothing(runner: Runner, tmp_path: Path) -> None:
    arrays.check_submitter_killed(runner, "local_cwd", {}, role, str(tmp_path), 8)


def test_a_keyed_submit_again_gets_the_same_array(runner: Runner, tmp_path: Path) -> None:
    app = AppDef("keyed", [role(arrays.recording(str(tmp_path), "true"))])
    first = runner.run_array(app, "local_cwd", size=3, idempotency_key="sweep-7")
    again = runner.run_array(app, "local_cwd", size=3, idempotency_key="sweep-7")
    assert again == first
    assert arrays.final(runner, first).state == AppState.SUCCEEDED
    assert arrays.runs(str(tmp_path)) == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 0}, "size: expected a positive integer, got 0"),
        ({"size": 2, "params": [{}]}, "size, params: expected one of them, got both"),
        ({"params": "abc"}, "params: expected a list of mappings"),
        ({"size": 2, "max_parallel": 0}, "max_parallel: expected a positive integer, got 0"),
        (
            {"params": [{"x": 1}, {"y": 2}]},
            "params: args of role 'w' uses ${params.x}, but element 1",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_starts(
    runner: Runner, kwargs: dict, message: str
) -> None:
    app = AppDef("bad", [role("echo ${params.x}")])
    before = set(runner_arrays(runner))
    with pytest.raises(ValueError) as err:
        runner.run_array(app, "local_cwd", **kwargs)
    assert message in str(err.value)
    assert set(runner_arrays(runner)) == before


def runner_arrays(runner: Runner) -> list[str]:
    from core.arrays.store import arrays_root

    root = Path(arrays_root("local_cwd", runner.session_name))
    return [p.name for p in root.iterdir()] if root.exists() else []


def test_element_handles_and_an_unknown_array(runner: Runner) -> None:
    handle = runner.run_array(AppDef("two", [role("echo hi")]), "local_cwd", size=2)
    assert arrays.final(runner, handle).state == AppState.SUCCEEDED
    with pytest.raises(ValueError, match=r"is an array; name one of its elements"):
        list(runner.log_lines(handle, "w", 0))
    with pytest.raises(ValueError, match=r"has elements 0..1, not 2"):
        runner.status(f"{handle}[2]") or runner.result(f"{handle}[2]")
    unknown = handle.replace("@", "@0")
    assert runner.status(unknown) is None


def test_the_cli_runs_follows_and_reads_an_array(tmp_path: Path) -> None:
    from tests.integration.local.test_cli import sh as shipyard

    params = tmp_path / "p.jsonl"
    params.write_text('{"lr": 0.1}\n\n{"lr": 0.01}\n{"lr": 1}\n')
    script = 'echo "lr=${params.lr}"; test "${params.lr}" != 1'
    run = shipyard(
        "run", "--array-params", str(params), "--max-parallel", "2", "--wait", "--progress",
        "plain", "--", "sh", "-c", script, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    handle = run.stdout.split("\n")[0]
    assert "elements: 1 FAILED, 2 SUCCEEDED" in run.stderr
    assert "Msg: 1 of 3 elements failed: [2] exit 1" in run.stdout
    status = json.loads(shipyard("status", "--json", handle).stdout)
    assert status["counts"] == {"FAILED": 1, "SUCCEEDED": 2}
    assert [e["exit_code"] for e in status["elements"]] == [0, 0, 1]
    assert shipyard("log", f"{handle}[1]").stdout == "lr=0.01\n"
    after = shipyard("run", "--after", handle, "--wait", "--", "true")
    assert after.returncode == 1, after.stderr
    assert "State: CANCELLED" in after.stdout
    assert f"dependency {handle} ended FAILED (after_condition ok)" in after.stdout
    after = shipyard("run", "--after", handle, "--after-condition", "any", "--wait", "--", "true")
    assert after.returncode == 0, after.stdout + after.stderr
    logged = shipyard(
        "run",
        "--array",
        "0-2%2",
        "--log",
        "--",
        "sh",
        "-c",
        "echo hi $SHIPYARD_ARRAY_INDEX; echo two",
    )
    assert logged.returncode == 0, logged.stderr
    lines = logged.stdout.split("\n")
    for i in range(3):  # (each element's lines together, in their order)
        at = lines.index(f"[{i}] hi {i}")
        assert lines[at + 1] == f"[{i}] two", lines
    bad = shipyard("run", "--array", "3-9", "--", "true")
    assert bad.returncode == 2 and "--array: expected 0-N[%K]" in bad.stderr
    bad = shipyard("run", "--array", "0-3%0", "--", "true")
    assert bad.returncode == 2 and "max_parallel: expected a positive integer, got 0" in bad.stderr


def test_a_chain_runs_in_order_and_a_failure_cancels_what_waits(
    runner: Runner, tmp_path: Path
) -> None:
    arrays.check_chain(runner, "local_cwd", {}, role, str(tmp_path))


@pytest.mark.parametrize(
    "first, condition, then",
    [
        ("exit 0", "any", AppState.SUCCEEDED),
        ("exit 1", "any", AppState.SUCCEEDED),
        ("exit 1", "notok", AppState.SUCCEEDED),
        ("exit 0", "notok", AppState.CANCELLED),
    ],
)
def test_after_conditions(runner: Runner, first: str, condition: str, then: AppState) -> None:
    a = runner.run(AppDef("a", [role(first)]), "local_cwd")
    b = runner.run(AppDef("b", [role("true")]), "local_cwd", after=[a], after_condition=condition)
    assert arrays.final(runner, b).state == then


def test_an_array_after_an_array_waits_for_all_its_elements(runner: Runner, tmp_path: Path) -> None:
    log = tmp_path / "order"
    first = runner.run_array(
        AppDef("one", [role(f"sleep 0.2; echo one >> {log}")]), "local_cwd", size=3
    )
    second = runner.run_array(
        AppDef("two", [role(f"echo two >> {log}")]), "local_cwd", size=2, after=[first]
    )
    assert arrays.final(runner, second).state == AppState.SUCCEEDED
    assert log.read_text().split() == ["one"] * 3 + ["two"] * 2


def test_bad_dependencies_are_refused_before_anything_starts(runner: Runner) -> None:
    app = AppDef("x", [role("true")])
    with pytest.raises(ValueError, match=r"after: no app local_cwd://shipyard/nope-1 \(unknown"):
        runner.run(app, "local_cwd", after=["local_cwd://shipyard/nope-1"])
    with pytest.raises(ValueError, match=r"after: app handle: expected"):
        runner.run(app, "local_cwd", after=["not a handle"])
    with pytest.raises(ValueError, match=r"after_condition: expected one of ok, any, notok"):
        runner.run(app, "local_cwd", after=["local_cwd://shipyard/x"], after_condition="done")
    with pytest.raises(ValueError, match=r"after: expected a list of app handles"):
        runner.run(app, "local_cwd", after="local_cwd://shipyard/x")  # type: ignore[arg-type]


def test_a_killed_driver_is_replaced_and_every_element_runs_once(
    runner: Runner, tmp_path: Path
) -> None:
    import os
    import signal

    from core.arrays import open_array
    from core.specs import parse_app_handle
    from tests.helpers import wait_until

    app = AppDef("orphan", [role(arrays.recording(str(tmp_path), "sleep 0.3"))])
    handle = runner.run_array(app, "local_cwd", size=8, max_parallel=2)
    p = parse_app_handle(handle)
    adir = open_array(p.scheduler_backend, p.session_name, p.app_id)
    assert adir is not None

    def driver_pid() -> int | None:
        state = adir.state()
        started = state is not None and any(e["handle"] for e in state["elements"])
        return int(state["pid"]) if started else None

    pid = wait_until(driver_pid, 60, "the driver to start elements")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not adir.driver_alive(), 30, "the killed driver's lock to go")
    status = arrays.final(runner, handle)  # (a status read starts a new driver)
    assert status.state == AppState.SUCCEEDED, status
    assert arrays.runs(str(tmp_path)) == dict.fromkeys(range(8), 1)
    assert arrays.most_at_once(str(tmp_path)) <= 2
    assert driver_pid() != pid


def test_ended_arrays_past_their_retention_are_removed(runner: Runner) -> None:
    import os
    import time

    from core.arrays import open_array
    from core.specs import parse_app_handle

    old = runner.run_array(AppDef("old", [role("true")]), "local_cwd", size=2)
    assert arrays.final(runner, old).state == AppState.SUCCEEDED
    p = parse_app_handle(old)
    adir = open_array(p.scheduler_backend, p.session_name, p.app_id)
    assert adir is not None
    from tests.helpers import wait_until

    wait_until(lambda: not adir.driver_alive(), 30, "the driver to exit")
    eight_days_ago = time.time() - 8 * 86400
    os.utime(os.path.join(adir.path, "state.json"), (eight_days_ago, eight_days_ago))
    new = runner.run_array(AppDef("new", [role("true")]), "local_cwd", size=1)
    assert not os.path.exists(adir.path)
    assert runner.status(old) is None  # (gone, as an app past its retention)
    assert arrays.final(runner, new).state == AppState.SUCCEEDED


def test_elements_a_look_starts_are_polled_at_once_and_their_end_wakes_the_driver(
    runner: Runner, tmp_path: Path
) -> None:
    # A driver that watched new elements only at its next look slept out its whole look
    # interval after each batch: a capped array of short elements ran a batch per 0.5 s.
    from core.appfile import app_to_dict
    from core.arrays import ArraySpec
    from core.arrays.driver import Driver
    from core.arrays.store import ArrayDir

    adir = ArrayDir("local_cwd", runner.session_name, "wake@0")
    assert adir.create()
    app = AppDef("wake", [Role("w", entrypoint="true")])
    spec = ArraySpec(4, None, 2)
    adir.write_request({"app": app_to_dict(app), "cfg": {}, "spec": spec.to_json(),
                        "after": [], "cwd": str(tmp_path)})  # fmt: skip
    driver = Driver(adir)
    try:
        driver.step()
        started = [e.handle for e in driver.elements if e.handle]
        assert len(started) == 2  # the cap
        assert set(driver.statuses.watches) == set(started)
        # a poll round of them wakes the driver, with no further look
        assert driver.wake.wait(30)
        while True:
            driver.wake.clear()
            driver.step()
            if driver.done():
                break
            assert driver.wake.wait(30)  # (every look leaves a running element watched)
        assert [e.state for e in driver.elements] == [AppState.SUCCEEDED] * 4
    finally:
        driver.statuses.close()
        driver.runner.close()
        adir.remove()
