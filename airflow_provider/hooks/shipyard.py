"""ShipyardHook: turns an Airflow connection into what a Shipyard runner needs.

A connection of type ``shipyard`` holds the scheduler, its default run options and, for a Slurm
cluster that is not the worker's own, how to reach it (SSH login node and/or slurmrestd). The
cluster is registered under the connection's id, so app handles name the connection
(``slurm://session/{conn_id}:1234``), never a secret, and any worker, triggerer or sensor with
access to the same connection follows and cancels the job. A standard ``ssh`` connection works
too: it names a login node where the Slurm commands run.

::

    airflow connections add hpc1 --conn-type shipyard --conn-host login.hpc.example \\
        --conn-login alice --conn-extra '{"scheduler": "slurm", "transport": "ssh",
        "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----...", "known_hosts": "accept-new"}'

Or a Docker engine (``local_docker``) that is not the worker's default one, with TLS, and a
registry login (the password in the connection's password field); :meth:`ShipyardHook.get_conn`
gives a runner whose ``local_docker`` uses them::

    airflow connections add builder --conn-type shipyard --conn-password "$REGISTRY_TOKEN" \\
        --conn-extra '{"docker_host": "tcp://builder:2376", "tls_ca_cert": "/etc/shipyard/ca.pem",
        "tls_client_cert": "/etc/shipyard/cert.pem", "tls_private_key": "-----BEGIN ...",
        "registry_url": "registry.example:5000", "registry_username": "ci"}'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook, Connection

from airflow_provider.config import session_name as configured_session
from airflow_provider.connection_form import UI_FIELD_BEHAVIOUR
from core.clusters import ClusterConfig, Secret, register_cluster
from core.runner import Runner, get_runner
from core.schedulers import SchedulerFactory, get_scheduler_factories
from core.schedulers.docker_scheduler import DockerEngine

__all__ = [
    "ShipyardHook",
    "cluster_from_connection",
    "connection_settings",
    "docker_engine_from_connection",
    "docker_scheduler_factories",
]

#: the extras of a ``shipyard`` connection (besides host, port, login and password)
CLUSTER_EXTRAS = (
    "transport",
    "rest_url",
    "private_key",
    "identity_file",
    "known_hosts",
    "remote_dir",
    "local_mount",
    "token_command",
    "token_file",
    "slurm_bin",
    "api_version",
)

#: the extras of a ``shipyard`` connection that name a Docker engine and a registry login (the
#: registry password is the connection's password); certificates and the key are files or PEM
DOCKER_EXTRAS = (
    "docker_host",
    "tls_ca_cert",
    "tls_client_cert",
    "tls_private_key",
    "registry_url",
    "registry_username",
)


def connection_settings(
    conn: Connection,
) -> tuple[str | None, dict[str, Any], ClusterConfig | None]:
    """The scheduler, default run options and Slurm cluster a connection describes.

    Raises:
        ValueError: naming the connection and the field when it is not usable.
    """
    extra = conn.extra_dejson or {}
    where = f"connection {conn.conn_id!r}"
    scheduler = extra.get("scheduler") or None
    cfg = extra.get("cfg") or {}
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg) if cfg.strip() else {}
        except ValueError as e:
            raise ValueError(f"{where}: extra.cfg: expected a JSON object: {e}") from None
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: extra.cfg: expected a JSON object, got {cfg!r}")
    engine = docker_engine_from_connection(conn)
    cluster = cluster_from_connection(conn)
    if cluster is not None:
        scheduler = scheduler or "slurm"
        cfg = {**cfg, "cluster": cluster.name}
    elif engine is not None:
        scheduler = scheduler or "local_docker"
    return scheduler, dict(cfg), cluster


def docker_engine_from_connection(conn: Connection) -> DockerEngine | None:
    """The Docker engine and registry login of a ``shipyard`` connection with Docker extras
    (see :data:`DOCKER_EXTRAS`); None for a connection without any. The registry password (the
    connection's password) and the TLS key stay in memory.

    Raises:
        ValueError: naming the connection and the field when it is not usable.
    """
    extra = conn.extra_dejson or {}
    values = {k: str(extra[k]) for k in DOCKER_EXTRAS if extra.get(k) not in (None, "")}
    if not values or conn.conn_type != "shipyard":
        return None
    where = f"connection {conn.conn_id!r}"
    if extra.get("transport"):
        raise ValueError(
            f"{where}: transport and {', '.join(values)}: a connection names a Slurm cluster"
            " or a Docker engine, not both"
        )
    key = values.get("tls_private_key")
    user = values.get("registry_username")
    if user and not conn.password:
        raise ValueError(
            f"{where}: registry_username: the registry's password goes in the connection's"
            " password field, which is empty"
        )
    engine = DockerEngine(
        host=values.get("docker_host"),
        tls_ca_cert=values.get("tls_ca_cert"),
        tls_client_cert=values.get("tls_client_cert"),
        tls_private_key=Secret(key) if key else None,
        registry=values.get("registry_url"),
        registry_username=user,
        registry_password=Secret(conn.password) if user and conn.password else None,
        origin=where,
    )
    engine.check()
    return engine


def docker_scheduler_factories(engine: DockerEngine) -> dict[str, SchedulerFactory]:
    """The scheduler factories, with ``local_docker`` connecting to ``engine`` (for
    ``get_runner(scheduler_factories=...)``).

    Raises:
        ValueError: the ``local_docker`` scheduler is not installed.
    """
    factories = dict(get_scheduler_factories())
    docker_factory = factories.get("local_docker")
    if docker_factory is None:
        raise ValueError(
            f"{engine.origin}: docker_host: the local_docker scheduler is not available"
            " (pip install -e '.[docker]')"
        )

    def make_docker(session_name: str, **kwargs: Any) -> Any:
        return docker_factory(session_name, **{**kwargs, "docker_engine": engine})

    factories["local_docker"] = make_docker
    return factories


def cluster_from_connection(conn: Connection) -> ClusterConfig | None:
    """The Slurm cluster of a ``shipyard`` connection with a ``transport``, or of a standard
    ``ssh`` connection (a login node); None for a connection without one. Secrets (the
    password as slurmrestd's JWT, the private key) stay in memory."""
    extra = conn.extra_dejson or {}
    transport = extra.get("transport") or ("ssh" if conn.conn_type == "ssh" else None)
    if not transport:
        return None
    values: dict[str, Any] = {k: extra[k] for k in CLUSTER_EXTRAS if extra.get(k) not in (None, "")}
    values["transport"] = transport
    if conn.conn_type == "ssh":  # the standard SSH connection's own extras
        values.pop("private_key", None)
        if extra.get("key_file"):
            values["identity_file"] = extra["key_file"]
        if str(extra.get("no_host_key_check", "")).lower() == "true":
            values["known_hosts"] = "accept-new"
    key = extra.get("private_key")
    if key:
        values["private_key"] = Secret(str(key))
    if conn.password and transport == "rest":
        values["token"] = Secret(conn.password)
    if conn.host:  # (for rest: where logs and job directories are reached over SFTP)
        values["host"] = conn.host
    if conn.port:
        values["port"] = int(conn.port)
    if conn.login:
        values["user"] = conn.login
    try:
        return ClusterConfig.from_mapping(conn.conn_id, values, f"connection {conn.conn_id!r}")
    except ValueError as e:
        raise ValueError(str(e)) from None


class ShipyardHook(BaseHook):
    """Interacts with Shipyard through an Airflow connection (``shipyard_conn_id``).

    Args:
        shipyard_conn_id: the connection (type ``shipyard``, or a standard ``ssh`` one)
    """

    conn_name_attr = "shipyard_conn_id"
    default_conn_name = "shipyard_default"
    conn_type = "shipyard"
    hook_name = "Shipyard"

    def __init__(self, shipyard_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shipyard_conn_id = shipyard_conn_id
        self._settings: tuple[str | None, dict[str, Any], ClusterConfig | None] | None = None
        self._engine: DockerEngine | None = None

    def settings(self) -> tuple[str | None, dict[str, Any], ClusterConfig | None]:
        """``(scheduler, default cfg, cluster)`` of the connection; the cluster (if any) is
        registered in this process, so handles that name it can be followed here."""
        if self._settings is None:
            conn = self.get_connection(self.shipyard_conn_id)
            self._settings = connection_settings(conn)
            self._engine = docker_engine_from_connection(conn)
            if self._settings[2] is not None:
                register_cluster(self._settings[2])
        return self._settings

    def docker_engine(self) -> DockerEngine | None:
        """The connection's Docker engine and registry login (see
        :func:`docker_engine_from_connection`), None if it names none."""
        self.settings()
        return self._engine

    def ui_url_template(self) -> str | None:
        """The connection's extra ``ui_url`` (a job page URL template; see
        :mod:`airflow_provider.links`), if it has one."""
        extra = self.get_connection(self.shipyard_conn_id).extra_dejson or {}
        return str(extra["ui_url"]) if extra.get("ui_url") else None

    def get_conn(self) -> Runner:
        """A runner (of the session ``[shipyard] session`` names, if set) that can reach the
        connection's backend: its Slurm cluster is registered; its ``local_docker`` connects to
        the connection's Docker engine, logged in to its registry (on first use)."""
        self.settings()
        session = configured_session()
        if self._engine is None:
            return get_runner(session)
        return get_runner(session, docker_scheduler_factories(self._engine))

    def test_connection(self) -> tuple[bool, str]:
        """Reaches the connection's backend once, as the connection form's Test button and
        ``airflow connections test`` do: a Slurm cluster answers ``sinfo --version`` (this
        host's or its login node's) or slurmrestd's ping, a Docker engine its version. The
        message names what answered, or why nothing did (never a secret)."""
        try:
            scheduler, _, cluster = self.settings()
            if cluster is not None or scheduler == "slurm":
                return True, _slurm_version(cluster)
            if self._engine is not None or scheduler == "local_docker":
                return True, _docker_version(self._engine)
            return True, f"scheduler {scheduler or 'default'}: runs on the worker, nothing to reach"
        except Exception as e:  # (the form shows the message: any failure is the answer)
            return False, f"{type(e).__name__}: {e}"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """How the connection form shows the standard fields (also declared in
        ``get_provider_info``, which Airflow 3.2+ reads without importing the hook)."""
        return UI_FIELD_BEHAVIOUR


def _slurm_version(cluster: ClusterConfig | None) -> str:
    from core.schedulers.slurm.transport import TransportError
    from core.schedulers.slurm_scheduler import SlurmScheduler

    sched = SlurmScheduler("connection-test")
    try:
        answer = sched.client(cluster.name if cluster else None).version()
    except TransportError as e:
        if cluster is None:
            raise
        # (unreachable: name the setting to check, as a submit does)
        where = "rest_url" if cluster.transport == "rest" else "host"
        detail = str(e).removeprefix(f"cluster {cluster.name!r}: ")
        raise TransportError(f"cluster {cluster.name!r}: {where}: {detail}") from None
    finally:
        sched.close()
    where = f"cluster {cluster.name!r} over {cluster.transport}" if cluster else "this host's Slurm"
    return f"{where}: {answer}"


def _docker_version(engine: DockerEngine | None) -> str:
    from core.schedulers.docker.engine import connect

    client = connect(engine)
    try:
        version = client.version().get("Version", "?")
    finally:
        client.close()
    return f"Docker engine {version} at {engine.host if engine and engine.host else 'the default'}"
