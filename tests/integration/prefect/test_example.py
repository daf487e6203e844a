"""The example flow runs with ``python -m prefect_tasks.examples``, against a configured server
and on Prefect's temporary local server (what the README demo does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.integration.prefect.helpers import job_env

EXPECTED = [
    "coordinator/0 coordinating 2 workers",
    "worker/0 worker 0: step 3 of 3",
    "worker/1 worker 1: step 3 of 3",
    "coordinator/0 all workers reported",
]


def _run_example(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_tasks.examples"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def test_example_flow_against_a_server(prefect_server: str) -> None:
    output = _run_example(job_env(prefect_server))
    for line in EXPECTED:
        assert line in output, output
    assert "SUCCEEDED (exit codes: coordinator=[0], worker=[0, 0])" in output
    assert "example flow: job local_cwd://" in output


def test_example_flow_on_the_temporary_server(tmp_path: Path, prefect_server: str) -> None:
    """No PREFECT_API_URL and a fresh PREFECT_HOME: the demo's path on a new machine."""
    env = job_env(prefect_server)
    del env["PREFECT_API_URL"]
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    output = _run_example(env)
    assert "Starting temporary server" in output
    for line in EXPECTED:
        assert line in output, output
    assert "ERROR" not in output, output
    assert "Traceback" not in output, output
