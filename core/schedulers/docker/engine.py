"""How ``local_docker`` reaches its Docker engine and logs in to registries.

Without settings the engine is the one Docker's own tools use: ``DOCKER_HOST``,
``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH`` from the environment, else the local socket; the
registry credentials are those of ``docker login`` (``~/.docker/config.json``, or
``$DOCKER_CONFIG``), which the docker SDK reads. A :class:`DockerEngine` names another engine
(a URL, with TLS) and a registry login; an Airflow connection or a Prefect block holds one and
hands it to the scheduler (``create_scheduler(session, docker_engine=...)``).

Pulls (the ``pull`` run option) and ``image_repo`` pushes go through the client made here, so
they use its login: the engine receives the credentials in a request header, never on a
command line, in a log or in an app's records.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any

from core.clusters import Secret

log = logging.getLogger(__name__)

__all__ = ["DockerEngine", "connect"]

#: URL schemes of an engine's address, as in ``DOCKER_HOST``
HOST_SCHEMES = ("unix", "tcp", "http", "https", "ssh", "npipe")
_PEM_PREFIX = "-----BEGIN"


@dataclass(frozen=True)
class DockerEngine:
    """A Docker engine to use instead of the environment's, and a registry login.

    Attributes:
        host: the engine's URL as in ``DOCKER_HOST`` (``tcp://builder:2376``,
            ``unix:///var/run/docker.sock``, ``ssh://user@builder``); None: the environment's
        tls_ca_cert: the CA that signed the engine's certificate (a file or the PEM itself):
            the engine's certificate is checked against it (without it, against the system's)
        tls_client_cert: this client's certificate (a file or the PEM), for ``--tlsverify``
        tls_private_key: its private key (a file or the PEM; kept as a :class:`Secret`)
        registry: the registry to log in to (``host:port``; None: Docker's default one)
        registry_username: the registry user (with ``registry_password``)
        registry_password: the password or token (a :class:`Secret`)
        origin: where the settings come from, for error messages (``connection 'dk1'``)

    Any TLS setting makes the connection TLS, with the engine's certificate verified. A plain
    string given for ``tls_private_key`` or ``registry_password`` is wrapped in a
    :class:`Secret`, so neither shows in ``repr``.
    """

    host: str | None = None
    tls_ca_cert: str | None = None
    tls_client_cert: str | None = None
    tls_private_key: Secret | None = None
    registry: str | None = None
    registry_username: str | None = None
    registry_password: Secret | None = None
    origin: str = "docker engine"

    def __post_init__(self) -> None:
        for name in ("tls_private_key", "registry_password"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Secret(value))

    @property
    def uses_tls(self) -> bool:
        """Whether the engine is reached over TLS."""
        return bool(self.tls_ca_cert or self.tls_client_cert or self.tls_private_key) or (
            self.host or ""
        ).startswith("https://")

    def check(self) -> None:
        """Raises a ValueError naming :attr:`origin` and the setting that is not usable."""
        where = f"{self.origin}: "
        scheme = (self.host or "").partition("://")[0]
        if self.host is not None and ("://" not in self.host or scheme not in HOST_SCHEMES):
            raise ValueError(
                f"{where}docker_host: expected a URL such as tcp://host:2376 or"
                f" unix:///var/run/docker.sock, got {self.host!r}"
            )
        if self.uses_tls and scheme not in ("tcp", "https"):
            raise ValueError(
                f"{where}docker_host: TLS settings need the engine's tcp:// URL, got {self.host!r}"
            )
        if bool(self.tls_client_cert) != bool(self.tls_private_key):
            raise ValueError(f"{where}tls_client_cert and tls_private_key: give both or neither")
        if bool(self.registry_username) != (self.registry_password is not None):
            raise ValueError(
                f"{where}registry_username and registry_password: give both or neither"
            )
        for name in ("tls_ca_cert", "tls_client_cert"):
            _check_material(getattr(self, name), name, where)
        key = self.tls_private_key
        _check_material(key.get_secret_value() if key else None, "tls_private_key", where)


def connect(engine: DockerEngine | None = None, **kwargs: Any) -> Any:
    """A ``docker.DockerClient`` for ``engine`` (None: the environment's), logged in to its
    registry; ``kwargs`` go to the client (``max_pool_size``, ``timeout``).

    Where the engine's certificate is checked against a CA of its own, the environment's CA
    bundles (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``), which would otherwise replace it in
    ``requests``, are ignored, and so are its proxy variables. An engine on a local socket
    (unix, npipe, ssh) ignores the proxy variables and netrc too; one over TCP takes them.

    Raises:
        ValueError: a setting is not usable, the TLS handshake failed, or the registry refused
            the login; naming the setting, never a secret.
    """
    import docker

    if engine is not None:
        engine.check()
    files: list[str] = []
    try:
        client = _open(_client_args(engine, files), kwargs, engine)
    except BaseException:
        _remove(files)
        raise
    if files:
        weakref.finalize(client, _remove, files)
    if engine is not None and engine.registry_username and engine.registry_password:
        _login(client, engine)
    assert isinstance(client, docker.DockerClient)
    return client


def _client_args(engine: DockerEngine | None, files: list[str]) -> dict[str, Any]:
    """``base_url`` and ``tls`` of the client: the engine's settings, else the environment's."""
    import docker
    from docker.tls import TLSConfig

    if engine is None or (engine.host is None and not engine.uses_tls):
        return dict(docker.utils.kwargs_from_env())
    if not engine.uses_tls:
        return {"base_url": engine.host, "tls": False}
    ca = _material(engine.tls_ca_cert, "ca.pem", files)
    cert = _material(engine.tls_client_cert, "cert.pem", files)
    key = engine.tls_private_key
    key_file = _material(key.get_secret_value() if key else None, "key.pem", files)
    client_cert = (cert, key_file) if cert and key_file else None
    return {"base_url": engine.host, "tls": TLSConfig(client_cert, ca_cert=ca, verify=True)}


def _open(args: dict[str, Any], kwargs: dict[str, Any], engine: DockerEngine | None) -> Any:
    """The client; over TLS with a CA of its own, the API version is asked with the
    environment's CA bundles ignored (``requests`` would prefer them to the engine's CA)."""
    import docker
    import requests
    from docker.errors import DockerException

    tls = args.get("tls")
    pinned = bool(tls and getattr(tls, "verify", None) and getattr(tls, "ca_cert", None))
    try:
        if pinned and "version" not in kwargs:
            kwargs = {**kwargs, "version": _api_version(args)}
        client = docker.DockerClient(**args, **kwargs)
    except (DockerException, requests.exceptions.RequestException) as e:
        from core.schedulers.docker.unreachable import unreachable_error  # (issue 29)

        tls_error = _tls_error(e, args, engine) or unreachable_error(e, args, engine)
        if tls_error is None:
            raise
        raise tls_error from e
    # A local socket (unix, npipe, ssh: the SDK's "http+docker" scheme) takes no proxy or
    # netrc, and reading them from the environment was a sixth of every engine call
    # (bench row "docker list (session)").
    if pinned or client.api.base_url.startswith("http+docker://"):
        client.api.trust_env = False
    return client


def _api_version(args: dict[str, Any]) -> str:
    import docker
    from docker.constants import MINIMUM_DOCKER_API_VERSION

    probe = docker.APIClient(**args, version=MINIMUM_DOCKER_API_VERSION)
    probe.trust_env = False
    try:
        return str(probe.version(api_version=False)["ApiVersion"])
    finally:
        probe.close()


def _tls_error(e: Exception, args: dict[str, Any], engine: DockerEngine | None) -> Exception | None:
    """A TLS failure as a ValueError that says which settings to check; None for others."""
    import requests

    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, requests.exceptions.SSLError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    if engine is None:
        origin, check = "DOCKER_HOST", "DOCKER_CERT_PATH's ca.pem, cert.pem and key.pem"
    else:
        origin, check = engine.origin, "tls_ca_cert, tls_client_cert and tls_private_key"
    return ValueError(
        f"{origin}: the TLS connection to the Docker engine at {args.get('base_url')} failed"
        f" (check {check}): {_reason(cause)}"
    )


def _reason(e: BaseException) -> str:
    """The innermost message of a ``requests``/``urllib3`` error chain."""
    text = str(e)
    for arg in getattr(e, "args", ()):
        if isinstance(arg, BaseException):
            text = _reason(arg)
    reason = getattr(e, "reason", None)
    return _reason(reason) if isinstance(reason, BaseException) else text


def _login(client: Any, engine: DockerEngine) -> None:
    """Logs the client in (the engine checks the credentials with the registry); the SDK keeps
    them in memory and sends them with each pull and push of that registry."""
    from docker.errors import APIError

    assert engine.registry_password is not None
    registry = engine.registry or "Docker's default registry"
    try:
        client.login(
            username=engine.registry_username,
            password=engine.registry_password.get_secret_value(),
            registry=engine.registry,
            reauth=True,
        )
    except APIError as e:
        client.close()
        raise ValueError(
            f"{engine.origin}: registry {registry}: the login of"
            f" {engine.registry_username!r} was refused: {e.explanation or e}"
        ) from None
    log.info("logged in to registry %s as %s", registry, engine.registry_username)


def _check_material(value: str | None, name: str, where: str) -> None:
    if value and not value.lstrip().startswith(_PEM_PREFIX):
        path = os.path.expanduser(value)
        if not os.path.isfile(path):
            raise ValueError(f"{where}{name}: expected a PEM file or the PEM itself, got {value!r}")


def _material(value: str | None, name: str, files: list[str]) -> str | None:
    """The file of a certificate or key given as a path or as the PEM itself (then written to
    a private directory, removed with the client)."""
    if not value:
        return None
    if not value.lstrip().startswith(_PEM_PREFIX):
        return os.path.expanduser(value)
    if not files:
        import tempfile  # (here: shutil and tempfile load bz2, lzma, random; start-up)

        files.append(tempfile.mkdtemp(prefix="shipyard-docker-tls-"))  # (mode 0700)
    path = os.path.join(files[0], name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value if value.endswith("\n") else value + "\n")
    return path


def _remove(files: list[str]) -> None:
    import shutil  # (see _material)

    for path in files:
        shutil.rmtree(path, ignore_errors=True)
