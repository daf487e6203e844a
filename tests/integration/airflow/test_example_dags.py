"""Every example DAG parses and runs to success with ``dag.test()`` on the real backends."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow.airflow_env import EXAMPLE_DAGS, REPO

pytestmark = pytest.mark.airflow

EXPECTED = {
    "shipyard_local_job.py": "shipyard_local_job",
    "shipyard_docker_job.py": "shipyard_docker_job",
    "shipyard_slurm_job.py": "shipyard_slurm_job",
    "shipyard_deferrable_job.py": "shipyard_deferrable_job",
}


def test_every_dag_file_parses_without_import_errors(airflow_db: None) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLE_DAGS))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == set(EXPECTED.values())
    files = {p.name for p in EXAMPLE_DAGS.glob("*.py")}
    assert files == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_dag_file_runs_itself_with_dag_test(name: str) -> None:
    tree = ast.parse((EXAMPLE_DAGS / name).read_text())
    mains = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
    ]
    assert len(mains) == 1 and "dag.test()" in ast.unparse(mains[0])


def test_local_job_dag(run_dag: Any) -> None:
    result = run_dag("shipyard_local_job")
    assert result.states == {
        "train": "success",
        "sweep": "success",
        "evaluate": "success",
        "wait_for_evaluate": "success",
    }
    assert result.xcom("sweep", "array_states") == ["SUCCEEDED"] * 3
    assert result.xcom("sweep", "result") == [
        {"point": {"0": {"lr": lr}}} for lr in (0.1, 0.01, 0.001)
    ]
    # the templated app file: params and run_id rendered, lines in order per replica
    for k in (0, 1):
        assert result.job_lines(f"trainer/{k} ") == [
            f"trainer/{k} trainer {k}: run {result.dag_run.run_id}, 3 epochs",
            *(f"trainer/{k} trainer {k}: epoch {i}" for i in (1, 2, 3)),
            f"trainer/{k} trainer {k}: done",
        ]
    logical_date = result.dag_run.logical_date.strftime("%Y-%m-%d")
    assert result.job_lines("reporter/0 ") == [f"reporter/0 reporter: summary for {logical_date}"]
    assert result.xcom("train", "state") == "SUCCEEDED"
    assert result.xcom("train").startswith("local_cwd://")
    assert result.xcom("wait_for_evaluate") == "SUCCEEDED"
    assert result.xcom("evaluate") != result.xcom("train")


def test_deferrable_job_dag(run_dag: Any) -> None:
    result = run_dag("shipyard_deferrable_job")
    assert result.states == {"train": "success", "submit": "success", "wait": "success"}
    # the task deferred (freeing the worker) and the trigger ran, streaming the job's lines
    assert "deferring to ShipyardJobTrigger" in result.log
    assert "[DAG TEST] running trigger in line" in result.log
    for k in (0, 1):
        assert result.job_lines(f"trainer/{k} ") == [
            f"trainer/{k} trainer {k}: step {i}" for i in (1, 2, 3)
        ]
    assert result.xcom("train", "state") == "SUCCEEDED"
    assert result.xcom("wait") == "SUCCEEDED"


def test_docker_job_dag(run_dag: Any, docker_client: Any) -> None:
    result = run_dag("shipyard_docker_job")
    assert result.states == {"greet": "success", "check": "success"}
    for k in range(3):
        assert result.lines(f"greeter/{k} hello from container {k} of shipyard_docker_job")
    assert result.xcom("greet").startswith("local_docker://")
    assert result.xcom("greet", "result") == {"greeter": {"0": {"greeted": 0}}}


def test_slurm_job_dag(
    run_dag: Any, slurm_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # (the job's logs and results land in the submitting directory)
    result = run_dag("shipyard_slurm_job")
    assert result.states == {"simulate": "success"}
    assert result.lines("coordinator/0 coordinator on")
    for k in (0, 1):
        assert result.lines(f"worker/{k} worker {k}: done")
    assert result.xcom("simulate").startswith("slurm://")
    assert result.xcom("simulate", "result") == {
        "coordinator": {"0": {"run": result.dag_run.run_id}}
    }


@pytest.mark.parametrize("transport", ["ssh", "rest", "ssh-26", "rest-26"])
def test_slurm_job_dag_through_a_connection(
    run_dag: Any, transport: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example DAG on a cluster reached through an Airflow connection only: no Slurm
    command on the worker, no clusters file; the key and token stay out of logs and XCom.
    ``-26``: the Slurm 26.05 cluster, whose commands are off the login PATH (``slurm_bin``)."""
    import json as _json
    import uuid

    from tests.integration.slurm.slurm_clusters import (
        no_local_slurm,
        slurm_release,
        use_remote_clusters,
    )
    from tests.services import REMOTE_DIR

    use_remote_clusters(monkeypatch, tmp_path)
    release = slurm_release(transport)
    monkeypatch.delenv("SHIPYARD_CLUSTERS")
    no_local_slurm(monkeypatch, tmp_path)
    key = open(os.path.join(REMOTE_DIR, "userkey")).read()
    transport = transport.removesuffix("-26")
    extra = {
        "scheduler": "slurm",
        "transport": transport,
        **({"slurm_bin": release.bin} if release.bin != "/usr/bin" else {}),
        "private_key": key,
        "known_hosts": os.path.join(REMOTE_DIR, "known_hosts"),
        "remote_dir": "/home/hpcuser/shipyard",
    }
    conn: dict[str, Any] = {"conn_type": "shipyard", "host": "127.0.0.1", "port": 2222,
                            "login": "hpcuser", "extra": extra}  # fmt: skip
    token = ""
    if transport == "rest":
        token = release.token()
        extra["rest_url"] = release.rest_url
        conn["password"] = token
    conn_id = f"slurm_{transport}_{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", _json.dumps(conn))
    result = run_dag("shipyard_slurm_job", run_conf={"shipyard_conn_id": conn_id})
    assert result.states == {"simulate": "success"}, result.log[-3000:]
    assert result.lines("coordinator/0 coordinator on")
    for k in (0, 1):
        assert result.lines(f"worker/{k} worker {k}: done")
    handle = result.xcom("simulate")
    assert handle.startswith("slurm://") and f"/{conn_id}:" in handle  # names the connection
    # the coordinator's result, read back over the connection's transport
    run_id = result.dag_run.run_id
    assert result.xcom("simulate", "result") == {"coordinator": {"0": {"run": run_id}}}
    key_body = key.strip().splitlines()[1]
    for secret in filter(None, [key_body, token]):
        assert secret not in result.log
        assert secret not in str(result.xcom("simulate")) + str(result.xcom("simulate", "app_id"))


def test_local_dag_runs_as_a_script(airflow_db: None) -> None:
    """``python dags/shipyard_local_job.py`` (the README demo) runs the DAG and exits 0."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLE_DAGS / "shipyard_local_job.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "reporter/0 reporter: summary for" in out.stdout + out.stderr
