"""``ShipyardHook.test_connection``: what the connection form's Test button and ``airflow
connections test`` run, against the real services: the Slurm clusters (22.05 and 26.05) through
the login node and slurmrestd, the TLS Docker engine; and connections that cannot work, which
answer False with the setting to fix and no secret."""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider.hooks.shipyard import ShipyardHook
from tests.integration.slurm.slurm_clusters import slurm_release, use_remote_clusters
from tests.services import DOCKER_TLS_CLIENT_DIR, REMOTE_DIR, docker_problem, require

pytestmark = [pytest.mark.airflow]


def _conn(monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any]) -> str:
    conn_id = f"t_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


def _cluster_conn(transport: str, **extra: Any) -> dict[str, Any]:
    """A connection to a cluster through its login node or slurmrestd (``-26``: Slurm 26.05)."""
    release = slurm_release(transport)
    kind = transport.removesuffix("-26")
    extras: dict[str, Any] = {
        "scheduler": "slurm",
        "transport": kind,
        "private_key": Path(REMOTE_DIR, "userkey").read_text(),
        "known_hosts": os.path.join(REMOTE_DIR, "known_hosts"),
        "remote_dir": "/home/hpcuser/shipyard",
        **({"slurm_bin": release.bin} if release.bin != "/usr/bin" else {}),
    }
    conn: dict[str, Any] = {"conn_type": "shipyard", "host": "127.0.0.1", "port": 2222,
                            "login": "hpcuser", "extra": extras}  # fmt: skip
    if kind == "rest":
        extras["rest_url"] = release.rest_url
        conn["password"] = release.token()
    extras.update(extra)
    return conn


@pytest.mark.parametrize(
    ("transport", "answer"),
    [
        ("ssh", r"over ssh: slurm(-wlm)? 22\.05"),
        ("rest", r"over rest: slurm 22\.05\.\d+, slurmrestd API v0\.0\.38"),
        ("ssh-26", r"over ssh: slurm 26\.05\.3"),
        ("rest-26", r"over rest: slurm 26\.05\.3, slurmrestd API v0\.0\.45"),
    ],
)
def test_a_cluster_answers_with_its_release(
    transport: str, answer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    use_remote_clusters(monkeypatch, tmp_path)
    conn = _cluster_conn(transport)
    ok, message = ShipyardHook(_conn(monkeypatch, conn)).test_connection()
    assert ok, message
    assert re.search(answer, message), message


def test_the_tls_docker_engine_answers_with_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    require("docker", docker_problem())
    certs = Path(DOCKER_TLS_CLIENT_DIR)
    extras = {
        "scheduler": "local_docker",
        "docker_host": "tcp://127.0.0.1:2376",
        **{k: (certs / f).read_text() for k, f in
           (("tls_ca_cert", "ca.pem"), ("tls_client_cert", "cert.pem"), ("tls_private_key", "key.pem"))},
    }  # fmt: skip
    ok, message = ShipyardHook(_conn(monkeypatch, {"conn_type": "shipyard", "extra": extras}))\
        .test_connection()  # fmt: skip
    assert ok and message.startswith("Docker engine ") and "tcp://127.0.0.1:2376" in message


@pytest.mark.parametrize("case", ["closed port", "forged token", "wrong key"])
def test_a_connection_that_cannot_work_answers_false_naming_the_setting(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_remote_clusters(monkeypatch, tmp_path)
    if case == "closed port":
        conn = _cluster_conn("ssh")
        conn["port"], setting = 1, "host"
    elif case == "forged token":
        conn = _cluster_conn("rest-26")
        head, payload, sig = conn["password"].split(".")
        conn["password"], setting = ".".join([head, payload, sig[::-1]]), "token"
    else:
        conn = _cluster_conn("ssh")
        key = tmp_path / "otherkey"
        os.system(f"ssh-keygen -q -t ed25519 -N '' -f {key}")
        conn["extra"]["private_key"], setting = key.read_text(), "identity_file"
    ok, message = ShipyardHook(_conn(monkeypatch, conn)).test_connection()
    assert not ok and f"{setting}:" in message, message
    secret = conn.get("password") or conn["extra"]["private_key"]
    assert secret.strip().splitlines()[-1][-12:] not in message


def test_the_connection_form_has_every_cluster_setting() -> None:
    from airflow_provider import get_provider_info
    from airflow_provider.hooks.shipyard import CLUSTER_EXTRAS

    (conn_type,) = get_provider_info()["connection-types"]
    assert set(CLUSTER_EXTRAS) <= set(conn_type["conn-fields"])


def test_airflow_connections_test_runs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``airflow connections test`` command, as an operator types it (the feature enabled
    in the configuration), on a good connection and on one whose port is closed."""
    import subprocess
    import sys

    use_remote_clusters(monkeypatch, tmp_path)
    good = _cluster_conn("ssh")
    bad = {**_cluster_conn("ssh"), "port": 1}
    env = {
        **os.environ,
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        "AIRFLOW_CONN_SY_GOOD": json.dumps(good),
        "AIRFLOW_CONN_SY_BAD": json.dumps(bad),
    }
    airflow = [sys.executable, "-m", "airflow", "connections", "test"]
    ok = subprocess.run([*airflow, "sy_good"], env=env, capture_output=True, text=True)
    assert "Connection success!" in ok.stdout, ok.stdout + ok.stderr
    no = subprocess.run([*airflow, "sy_bad"], env=env, capture_output=True, text=True)
    assert "Connection failed!" in no.stdout and "host:" in no.stdout, no.stdout + no.stderr
    assert good["extra"]["private_key"].strip().splitlines()[-1][-12:] not in no.stdout + no.stderr
