"""A Slurm controller that does not answer for a while (squeue times out twice, then answers):
the wait retries with backoff and ends with the job's real state; it is never reported as a
job state."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from core.runner import get_runner
from core.specs import AppDef, AppState, Role


def test_a_wait_outlasts_two_timed_out_squeue_calls(
    slurm_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.which("squeue")
    assert real, "squeue is not installed"
    shim = tmp_path / "shim"
    shim.mkdir()
    calls = tmp_path / "calls"
    # what squeue says when slurmctld does not answer in time, for the 2nd and 3rd calls
    (shim / "squeue").write_text(
        f"""#!/bin/sh
echo x >> "{calls}"
n=$(wc -l < "{calls}")
if [ "$n" -ge 2 ] && [ "$n" -le 3 ]; then
    echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2
    exit 1
fi
exec {real} "$@"
"""
    )
    (shim / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)  # the job's logs land here
    app = AppDef("hiccup", [Role("w", entrypoint="/bin/sh", args=["-c", "sleep 3; exit 3"])])
    with get_runner("transient") as runner:
        handle = runner.run(app, "slurm")
        status = runner.wait(handle, wait_interval=0.2, timeout=120)
    assert status is not None and status.state == AppState.FAILED, status
    assert status.exit_codes() == {"w": [3]}
    assert len(calls.read_text().splitlines()) >= 4  # the two that timed out were asked again
