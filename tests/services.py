"""Checks for the real services the tests use (Docker engine, Slurm cluster).

Under CI (``CI=true``) a test that needs a missing service fails; on a developer's machine it is
skipped with the reason. Start the services with ``scripts/start_docker.sh`` and
``scripts/start_slurm.sh`` (``make services``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache

import pytest


def in_ci() -> bool:
    """True when running under CI (``CI`` set to a true value)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(service: str, problem: str | None) -> None:
    """Fails (CI) or skips (developer machine) the calling test when ``problem`` is set."""
    if problem is None:
        return
    msg = f"{service} is not available: {problem} (start it with scripts/start_{service}.sh)"
    if in_ci():
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@cache
def docker_problem() -> str | None:
    """None if a Docker engine answers, else why not."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install -e '.[docker]')"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as e:
        return f"the engine does not answer ({e})"
    return None


@cache
def slurm_problem() -> str | None:
    """None if a Slurm cluster answers with idle or allocated nodes, else why not."""
    if not shutil.which("sinfo"):
        return "sinfo is not installed"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed ({e})"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()}"
    states = out.stdout.split()
    if not any(s.rstrip("*").startswith(("idle", "alloc", "mix")) for s in states):
        return f"no usable nodes (states: {states})"
    return None
