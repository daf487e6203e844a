"""The tasks one by one: bad input is refused before anything starts, stream_job_logs filters,
cancel_job, errors that survive pickling, idempotency keys."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from core.runner import AppFailedError
from core.specs import AppState
from prefect_tasks import (
    JobCancelledError,
    cancel_job,
    stream_job_logs,
    submit_job,
    wait_for_job,
)
from prefect_tasks.jobs import derive_idempotency_key, resolve_app
from tests.helpers import wait_until
from tests.integration.prefect.helpers import (
    DEADLINE,
    apps_named,
    assert_no_running_job,
    flow_run_logs,
    sh_app,
    sleeper_app,
    started_pids,
)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"app": 42}, r"^app: expected an AppDef, a dict or the path of a YAML app file, got int"),
        ({"app": {"name": "x", "roles": [{"name": "r"}]}}, r"entrypoint"),
        (
            {
                "app": {
                    "name": "x",
                    "roles": [{"name": "r", "entrypoint": "true", "num_replicas": -2}],
                }
            },
            r"roles\[0\]\.num_replicas",
        ),
        ({"app": "/nonexistent/app.yaml"}, r"cannot read '/nonexistent/app.yaml'"),
        ({"scheduler": ""}, r"^scheduler: expected a scheduler name"),
        ({"scheduler": "nope"}, r"^scheduler: unknown scheduler 'nope'"),
        ({"cfg": ["a"]}, r"^cfg: expected a mapping"),
        ({"cfg": {"bogus": 1}}, r"cfg: unknown option"),
        ({"workspace": 3}, r"^workspace: expected a path"),
        ({"idempotency_key": ""}, r"^idempotency_key: expected a non-empty string"),
    ],
)
def test_submit_job_refuses_bad_input_before_submitting(
    name: str, kwargs: dict[str, Any], match: str
) -> None:
    args: dict[str, Any] = {"app": sh_app(name, {"main": (1, "true")})} | kwargs
    with pytest.raises(ValueError, match=match):
        submit_job.fn(**args)
    assert apps_named(name) == []


@pytest.mark.parametrize(
    "task, kwargs, match",
    [
        (wait_for_job, {"handle": 3}, r"^handle: expected an app handle string, got int"),
        (wait_for_job, {"handle": "not-a-handle"}, r"not-a-handle"),
        (wait_for_job, {"handle": "nosuch://s/a"}, r"^handle: unknown scheduler 'nosuch'"),
        (wait_for_job, {"timeout": -1}, r"^timeout: expected a positive number of seconds"),
        (wait_for_job, {"poll_interval": 0}, r"^poll_interval: expected a positive number"),
        (wait_for_job, {"cancel_check_interval": True}, r"^cancel_check_interval: expected"),
        (stream_job_logs, {"role": ""}, r"^role: expected a role name"),
        (stream_job_logs, {"replica": -1}, r"^replica: expected a replica index"),
        (stream_job_logs, {"regex": "("}, r"^regex: not a valid regular expression"),
        (stream_job_logs, {"max_lines": -5}, r"^max_lines: expected a non-negative integer"),
        (cancel_job, {"handle": None}, r"^handle: expected an app handle string, got NoneType"),
        (cancel_job, {"timeout": 0}, r"^timeout: expected a positive number of seconds"),
    ],
)
def test_tasks_refuse_bad_arguments(task: Any, kwargs: dict[str, Any], match: str) -> None:
    args = {"handle": "local_cwd://shipyard/nothing-here"} | kwargs
    with pytest.raises(ValueError, match=match):
        task.fn(**args)


def test_stream_job_logs_filters_by_role_replica_and_regex(name: str) -> None:
    app = sh_app(
        name,
        {
            "a": (1, "echo 'a one'; echo 'a two'"),
            "b": (2, 'echo "b $0 keep"; echo "b $0 drop"'),
        },
    )
    app.roles[1].args.append("${replica_id}")

    @flow
    def follow() -> dict[str, Any]:
        handle = submit_job(app)
        everything = stream_job_logs.submit(handle)
        wait_for_job(handle, stream_logs=False)
        return {
            "all": sorted(everything.result()),
            "role": stream_job_logs(handle, role="a", should_tail=False),
            "replica": stream_job_logs(handle, role="b", replica=1, should_tail=False),
            "regex": sorted(stream_job_logs(handle, regex="keep", should_tail=False)),
            "last": stream_job_logs(handle, role="a", should_tail=False, max_lines=1),
            "bad_role": stream_job_logs(handle, role="zzz", return_state=True),
            "bad_replica": stream_job_logs(handle, role="a", replica=5, return_state=True),
        }

    state = follow(return_state=True)
    out = state.result()

    assert out["all"] == sorted(
        ["a/0 a one", "a/0 a two"] + [f"b/{k} b {k} {w}" for k in (0, 1) for w in ("keep", "drop")]
    )
    assert out["role"] == ["a/0 a one", "a/0 a two"]
    assert out["replica"] == ["b/1 b 1 keep", "b/1 b 1 drop"]
    assert out["regex"] == ["b/0 b 0 keep", "b/1 b 1 keep"]
    assert out["last"] == ["a/0 a two"]
    with pytest.raises(ValueError, match=r"^role: .* has no role 'zzz'; roles: \['a', 'b'\]"):
        out["bad_role"].result()
    with pytest.raises(ValueError, match=r"^replica: a of .* has no replica 5"):
        out["bad_replica"].result()
    # the follower, the replica and the regex call (records reach the API a moment later)
    wait_until(
        lambda: flow_run_logs(state.state_details.flow_run_id).count("b/1 b 1 keep") == 3,
        DEADLINE,
        "the three records of 'b/1 b 1 keep' in the API",
    )
    assert flow_run_logs(state.state_details.flow_run_id).count("b/1 b 1 keep") == 3


def test_stream_job_logs_timeout_leaves_the_job_running(name: str, tmp_path: Path) -> None:
    @flow
    def peek() -> Any:
        handle = submit_job(sleeper_app(name, tmp_path))
        lines = stream_job_logs(handle, role="a", timeout=3)
        status = cancel_job(handle)
        return lines, status

    lines, status = peek()

    assert lines == ["a/0 started"]
    assert status.state == AppState.CANCELLED
    assert_no_running_job(name, started_pids(tmp_path))


def test_cancel_job_is_idempotent_and_knows_unknown_apps(name: str) -> None:
    @flow
    def done_then_cancel() -> Any:
        handle = submit_job(sh_app(name, {"main": (1, "true")}))
        wait_for_job(handle)
        return (
            cancel_job(handle),
            cancel_job(handle, wait=False),
            cancel_job("local_cwd://shipyard/x-nothing"),
        )

    first, second, unknown = done_then_cancel()

    assert first.state == AppState.SUCCEEDED
    assert second.state == AppState.SUCCEEDED
    assert unknown is None


def test_errors_survive_pickling(name: str) -> None:
    """Prefect may persist or ship a failed task's exception; ours keep their fields."""

    @flow
    def fails() -> Any:
        return wait_for_job(submit_job(sh_app(name, {"main": (1, "exit 5")})))

    state = fails(return_state=True)
    with pytest.raises(AppFailedError) as info:
        state.result()
    err = pickle.loads(pickle.dumps(info.value))
    assert err.exit_codes == {"main": [5]} and "main/0=5" in str(err)
    cancelled = pickle.loads(pickle.dumps(JobCancelledError("local_cwd://s/a", "why")))
    assert (cancelled.handle, cancelled.reason) == ("local_cwd://s/a", "why")


def test_idempotency_keys(name: str) -> None:
    app = resolve_app({"name": name, "roles": [{"name": "r", "entrypoint": "true"}]})
    assert derive_idempotency_key(app, "local_cwd", None, None) is None  # outside a task run

    @flow
    def keys() -> list[str]:
        from prefect import task

        @task
        def key_of(app: Any, scheduler: str) -> str:
            first = derive_idempotency_key(app, scheduler, None, None)
            assert derive_idempotency_key(app, scheduler, None, None) == first  # same task run
            return first  # type: ignore[return-value]

        other = resolve_app({"name": name, "roles": [{"name": "r", "entrypoint": "false"}]})
        return [
            key_of(app, "local_cwd"),
            key_of(app, "local_cwd"),
            key_of(other, "local_cwd"),
            key_of(app, "slurm"),
        ]

    first, again, other_app, other_sched = keys()
    assert first.startswith("prefect-")
    assert len({first, again, other_app, other_sched}) == 4


def test_one_failing_poll_does_not_fail_the_other_waiters(name: str, monkeypatch: Any) -> None:
    """A handle whose status cannot be read (faked: a backend that errors for one job, not a
    transient error) fails only its own wait, at once; the job waited on at the same time
    finishes normally."""
    from core.runner import Runner

    real_status, real_status_many = Runner.status, Runner.status_many
    broken = "local_cwd://shipyard/broken-job"

    def status(self: Runner, handle: str) -> Any:
        if handle == broken:
            raise OSError("this job's state cannot be read")
        return real_status(self, handle)

    def status_many(self: Runner, handles: Any) -> Any:
        handles = list(handles)
        if broken in handles:
            raise OSError("this job's state cannot be read")
        return real_status_many(self, handles)

    monkeypatch.setattr(Runner, "status", status)
    monkeypatch.setattr(Runner, "status_many", status_many)

    @flow
    def both() -> Any:
        good = submit_job(sh_app(name, {"main": (1, "sleep 1; echo fine")}))
        waits = [wait_for_job.submit(h, poll_interval=0.2) for h in (good, broken)]
        return [w.wait() or w.state for w in waits]

    good_state, broken_state = both()

    assert good_state.is_completed(), good_state
    assert good_state.result().state == AppState.SUCCEEDED
    assert broken_state.is_failed()
    with pytest.raises(OSError, match="cannot be read"):
        broken_state.result()
