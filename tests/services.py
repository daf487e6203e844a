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
from typing import Any

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


#: where scripts/start_slurm_remote.sh keeps the clients' key, known_hosts and clusters file
REMOTE_DIR = os.environ.get("SHIPYARD_REMOTE_DIR", "/var/lib/shipyard-remote")


@cache
def slurm_remote_problem() -> str | None:
    """None if the SSH login node (127.0.0.1:2222) and slurmrestd (127.0.0.1:6820) in front of
    the Slurm cluster answer, else why not."""
    import socket

    problem = slurm_problem()
    if problem:
        return problem
    clusters = os.path.join(REMOTE_DIR, "clusters.yaml")
    if not os.path.exists(clusters):
        return f"{clusters} does not exist"
    for what, port in (("the SSH login node", 2222), ("slurmrestd", 6820)):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
        except OSError as e:
            return f"{what} does not answer on 127.0.0.1:{port} ({e})"
    return None


#: where scripts/build_slurm.sh installs the current Slurm release of the second cluster
SLURM26_PREFIX = "/opt/slurm-26.05.3"


@cache
def slurm26_problem() -> str | None:
    """None if the Slurm 26.05 cluster of scripts/start_slurm26.sh answers, and the clients'
    clusters file names it (``local26``, ``ssh26``, ``rest26``), else why not."""
    import socket

    problem = slurm_remote_problem()
    if problem:
        return problem
    sinfo = os.path.join(SLURM26_PREFIX, "bin", "sinfo")
    if not os.path.exists(sinfo):
        return f"{sinfo} does not exist (scripts/build_slurm.sh builds it)"
    try:
        out = subprocess.run([sinfo, "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo of Slurm 26.05 failed ({e})"
    if not any(s.startswith(("idle", "alloc", "mix")) for s in out.stdout.split()):
        return f"Slurm 26.05 has no usable nodes: {out.stdout.split()} {out.stderr.strip()}"
    with open(os.path.join(REMOTE_DIR, "clusters.yaml"), encoding="utf-8") as f:
        if "\nrest26:" not in f.read():
            return "the clusters file does not name rest26 (scripts/start_slurm26.sh adds it)"
    try:
        socket.create_connection(("127.0.0.1", 26820), timeout=3).close()
    except OSError as e:
        return f"slurmrestd 26.05 does not answer on 127.0.0.1:26820 ({e})"
    return None


#: where scripts/start_docker.sh keeps the TLS engine's client certificates (DOCKER_CERT_PATH
#: layout) and the password of the registry that wants a login (user ``shipyard``)
DOCKER_TLS_CLIENT_DIR = os.path.join(
    os.environ.get("SHIPYARD_DOCKER_TLS_DIR", "/var/lib/shipyard-docker-tls"), "client"
)
REGISTRY_PASSWORD_FILE = os.path.join(
    os.environ.get("SHIPYARD_REGISTRY_AUTH_DIR", "/var/lib/shipyard-registry-auth"), "password"
)


@cache
def docker_secure_problem() -> str | None:
    """None if the Docker engine answers, and so do its TLS listener (tcp://127.0.0.1:2376, with
    the client certificates readable here) and the registry that wants a login
    (127.0.0.1:5001, its password readable here); else why not."""
    import socket
    import urllib.error
    import urllib.request

    problem = docker_problem()
    if problem:
        return problem
    for path in (REGISTRY_PASSWORD_FILE, *(
        os.path.join(DOCKER_TLS_CLIENT_DIR, f) for f in ("ca.pem", "cert.pem", "key.pem")
    )):  # fmt: skip
        if not os.access(path, os.R_OK):
            return f"{path} is missing or not readable"
    try:
        socket.create_connection(("127.0.0.1", 2376), timeout=3).close()
    except OSError as e:
        return f"the engine's TLS listener does not answer on 127.0.0.1:2376 ({e})"
    try:
        urllib.request.urlopen("http://127.0.0.1:5001/v2/", timeout=3).close()
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return None
        return f"the registry on 127.0.0.1:5001 answers {e.code}, not 401 (no authentication?)"
    except OSError as e:
        return f"no registry on 127.0.0.1:5001 ({e})"
    return "the registry on 127.0.0.1:5001 does not ask for a login"


def python_image(docker_client: Any) -> str:
    """The local image with this Python (and Prefect, cloudpickle) in it; fails or skips the
    test when it is missing (scripts/build_prefect_image.sh builds it)."""
    from importlib.metadata import version

    from docker.errors import ImageNotFound

    image = f"shipyard-test/prefect:{version('prefect')}"
    try:
        docker_client.images.get(image)
    except ImageNotFound:
        require("prefect", f"no image {image} (scripts/build_prefect_image.sh builds it)")
    return image
