"""local_docker on an engine reached by URL: the test engine's TCP listener with --tlsverify
(tcp://127.0.0.1:2376, started by ``scripts/start_docker.sh``), through a
:class:`DockerEngine` (certificates as files or as PEM text) and through Docker's own
``DOCKER_HOST``/``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``; and the settings' checks.

The environment's CA bundle variables (``REQUESTS_CA_BUNDLE``...) are set to the system's in
these tests: ``requests`` would prefer them to the engine's own CA, and the client must not.
"""

from __future__ import annotations

import gc
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.clusters import Secret
from core.runner import get_runner
from core.schedulers.docker.engine import connect
from core.schedulers.docker_scheduler import LABEL_SESSION, DockerEngine, DockerScheduler
from core.specs import AppDef, AppState, Role
from tests.integration import functions
from tests.integration.docker.test_docker_scheduler import IMAGE, wait_terminal
from tests.services import DOCKER_TLS_CLIENT_DIR, docker_secure_problem, python_image, require

pytestmark = pytest.mark.docker

TLS_HOST = "tcp://127.0.0.1:2376"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture
def certs(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The client certificates of the TLS listener (fails in CI, skips elsewhere, without it)."""
    require("docker", docker_secure_problem())
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.setenv(name, SYSTEM_CA)
    return Path(DOCKER_TLS_CLIENT_DIR)


def _tls(certs: Path, pem: bool = False, **over: Any) -> DockerEngine:
    def value(name: str) -> str:
        return (certs / name).read_text() if pem else str(certs / name)

    settings: dict[str, Any] = {
        "host": TLS_HOST,
        "tls_ca_cert": value("ca.pem"),
        "tls_client_cert": value("cert.pem"),
        "tls_private_key": value("key.pem"),
        "origin": "test engine",
    }
    return DockerEngine(**{**settings, **over})


@pytest.fixture
def cleanup(docker_client: Any) -> Iterator[list[DockerScheduler]]:
    """Schedulers a test makes: their apps are purged and they are closed afterwards."""
    made: list[DockerScheduler] = []
    yield made
    for sched in made:
        for app in sched.list():
            sched.purge(app.app_id)
        flt = {"label": f"{LABEL_SESSION}={sched.session_name}"}
        sched.close()
        assert docker_client.api.containers(all=True, filters=flt) == []


def _run_on(sched: DockerScheduler) -> None:
    app = AppDef("remote", [Role("r", image=IMAGE, entrypoint="echo", args=["over tls"])])
    app_id = sched.submit(app, {"pull": "never"})
    assert wait_terminal(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r")) == ["over tls\n"]
    sched.cancel(app_id)


# -- the TLS listener -------------------------------------------------------------------------


@pytest.mark.parametrize("pem", [False, True], ids=["files", "pem"])
def test_a_job_runs_on_an_engine_reached_over_tls(
    certs: Path, pem: bool, cleanup: list[DockerScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # (not the environment's)
    sched = DockerScheduler(f"pytest-tls-{uuid.uuid4().hex[:8]}", docker_engine=_tls(certs, pem))
    cleanup.append(sched)
    _run_on(sched)
    client = connect(_tls(certs, pem))
    assert client.api.base_url == "https://127.0.0.1:2376"
    client.close()


def test_pem_settings_live_in_a_private_directory_removed_with_the_client(certs: Path) -> None:
    client = connect(_tls(certs, pem=True))
    cert, key = client.api.cert
    folder = Path(key).parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(Path(key).stat().st_mode) == 0o600
    assert Path(cert).read_text() == (certs / "cert.pem").read_text()
    assert client.ping()
    client.close()
    del client
    gc.collect()
    assert not folder.exists()


def test_docker_host_from_the_environment_over_tls(
    certs: Path, cleanup: list[DockerScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", TLS_HOST)
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(certs))
    with get_runner(f"pytest-tlsenv-{uuid.uuid4().hex[:8]}") as runner:
        app = AppDef("envtls", [Role("r", image=IMAGE, entrypoint="echo", args=["env"])])
        handle = runner.run(app, "local_docker", {"pull": "never"})
        status = runner.wait(handle, wait_interval=0.2, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED
        runner.cancel(handle)
    cleanup.append(DockerScheduler(handle.split("/")[2]))
    client = connect()
    assert client.api.base_url == "https://127.0.0.1:2376"
    client.close()


def test_a_function_jobs_image_is_checked_on_the_runners_engine(
    certs: Path, docker_client: Any, cleanup: list[DockerScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    image = python_image(docker_client)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # (not the environment's)
    session = f"pytest-tlsfn-{uuid.uuid4().hex[:8]}"
    with get_runner(session) as plain:  # no engine of its own: the environment's answers not
        with pytest.raises(ValueError, match=r"^image: cannot check .*: no Docker engine answers"):
            plain.run_function(functions.square, 3, scheduler="local_docker", image=image)
    with get_runner(session, docker_engine=_tls(certs)) as runner:
        handle = runner.run_function(functions.square, 3, scheduler="local_docker", image=image)
        assert runner.wait_function(handle, timeout=120) == 9
    cleanup.append(DockerScheduler(session, docker_engine=_tls(certs)))


@pytest.mark.parametrize(
    "over, reason",
    [
        ({"tls_client_cert": None, "tls_private_key": None}, ("bad certificate", "required")),
        ({"tls_ca_cert": SYSTEM_CA}, ("certificate verify failed",)),
    ],
    ids=["no-client-cert", "wrong-ca"],
)
def test_a_refused_tls_connection_fails_clearly(
    certs: Path, over: dict[str, Any], reason: tuple[str, ...], cleanup: list[DockerScheduler]
) -> None:
    sched = DockerScheduler(f"pytest-tls-{uuid.uuid4().hex[:8]}", docker_engine=_tls(certs, **over))
    app = AppDef("refused", [Role("r", image=IMAGE, entrypoint="true")])
    with pytest.raises(ValueError) as info:
        sched.submit(app, {})
    msg = str(info.value)
    assert msg.startswith(
        f"test engine: the TLS connection to the Docker engine at {TLS_HOST} failed (check"
        " tls_ca_cert, tls_client_cert and tls_private_key): "
    )
    assert any(r in msg.lower() for r in reason), msg
    assert (certs / "key.pem").read_text() not in msg
    sched.close()


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"host": "builder:2376"}, r"docker_host: expected a URL such as tcp://host:2376"),
        ({"host": "ftp://builder"}, r"docker_host: expected a URL"),
        (
            {"host": "unix:///var/run/docker.sock", "tls_ca_cert": "-----BEGIN X"},
            r"docker_host: TLS settings need the engine's tcp:// URL",
        ),
        ({"tls_ca_cert": "-----BEGIN X"}, r"docker_host: TLS settings need"),
        (
            {"host": "tcp://h:2376", "tls_client_cert": "-----BEGIN X"},
            r"tls_client_cert and tls_private_key: give both or neither",
        ),
        ({"registry_username": "u"}, r"registry_username and registry_password: give both"),
        ({"host": "tcp://h:2376", "tls_ca_cert": "/no/such/ca.pem"}, r"tls_ca_cert: expected a"),
    ],
)
def test_unusable_settings_are_named(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"^engine X: {match}"):
        DockerEngine(**settings, origin="engine X").check()


def test_secrets_never_show() -> None:
    engine = DockerEngine(
        host="tcp://h:2376",
        tls_private_key="-----BEGIN PRIVATE KEY----- s3cr3t-key",
        registry_username="ci",
        registry_password="s3cr3t-password",
    )
    assert isinstance(engine.tls_private_key, Secret)
    assert isinstance(engine.registry_password, Secret)
    for text in (repr(engine), str(engine)):
        assert "s3cr3t" not in text
    assert engine.uses_tls and not DockerEngine(host="tcp://h:2375").uses_tls
