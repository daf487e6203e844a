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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook, Connection

from airflow_provider.connection_form import UI_FIELD_BEHAVIOUR
from core.clusters import ClusterConfig, Secret, register_cluster
from core.runner import Runner, get_runner

__all__ = ["ShipyardHook", "cluster_from_connection", "connection_settings"]

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
    cluster = cluster_from_connection(conn)
    if cluster is not None:
        scheduler = scheduler or "slurm"
        cfg = {**cfg, "cluster": cluster.name}
    return scheduler, dict(cfg), cluster


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

    def settings(self) -> tuple[str | None, dict[str, Any], ClusterConfig | None]:
        """``(scheduler, default cfg, cluster)`` of the connection; the cluster (if any) is
        registered in this process, so handles that name it can be followed here."""
        if self._settings is None:
            conn = self.get_connection(self.shipyard_conn_id)
            self._settings = connection_settings(conn)
            if self._settings[2] is not None:
                register_cluster(self._settings[2])
        return self._settings

    def ui_url_template(self) -> str | None:
        """The connection's extra ``ui_url`` (a job page URL template; see
        :mod:`airflow_provider.links`), if it has one."""
        extra = self.get_connection(self.shipyard_conn_id).extra_dejson or {}
        return str(extra["ui_url"]) if extra.get("ui_url") else None

    def get_conn(self) -> Runner:
        """A runner that can reach the connection's backend."""
        self.settings()
        return get_runner()

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """How the connection form shows the standard fields (also declared in
        ``get_provider_info``, which Airflow 3.2+ reads without importing the hook)."""
        return UI_FIELD_BEHAVIOUR
