"""Prefect Blocks holding where Shipyard jobs run, so flows need no file on the worker.

:class:`SlurmCluster` is a Slurm cluster reached over SSH (a login node) or slurmrestd, with its
secrets as ``SecretStr`` (stored encrypted by the Prefect server, never logged)::

    SlurmCluster(cluster_name="hpc1", transport="ssh", host="login.hpc.example", user="alice",
                 private_key="-----BEGIN OPENSSH PRIVATE KEY-----...").save("hpc1")

    @flow
    def train():
        handle = submit_job("app.yaml", cluster=SlurmCluster.load("hpc1"))
        wait_for_job(handle, cluster=SlurmCluster.load("hpc1"))

Register the block types with ``prefect block register -m prefect_tasks``.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from core.clusters import ClusterConfig, Secret, register_cluster

__all__ = ["SlurmCluster", "use_cluster"]


class SlurmCluster(Block):
    """A Slurm cluster that is not the worker's own: the settings of ``core.clusters``."""

    _block_type_name = "Shipyard Slurm Cluster"
    _block_type_slug = "shipyard-slurm-cluster"
    _description = (
        "A Slurm cluster reached over SSH (a login node) or slurmrestd, for Shipyard jobs."
    )

    cluster_name: str = Field(
        description="The cluster's name in app handles (slurm://session/{cluster_name}:{job id})."
    )
    transport: Literal["local", "ssh", "rest"] = Field(
        default="ssh", description="local: this host's Slurm; ssh: a login node; rest: slurmrestd."
    )
    host: str | None = Field(default=None, description="The SSH login node (or ssh config alias).")
    port: int | None = Field(default=None, description="The login node's SSH port.")
    user: str | None = Field(default=None, description="The cluster user.")
    identity_file: str | None = Field(default=None, description="An SSH private key file.")
    private_key: SecretStr | None = Field(default=None, description="The SSH private key itself.")
    known_hosts: str | None = Field(
        default=None, description="A known_hosts file, or accept-new (default: ssh's own)."
    )
    rest_url: str | None = Field(default=None, description="slurmrestd's URL.")
    token: SecretStr | None = Field(default=None, description="slurmrestd's JWT.")
    token_env: str = Field(default="SLURM_JWT", description="A variable holding the JWT.")
    token_file: str | None = Field(default=None, description="A file holding the JWT.")
    token_command: str | None = Field(default=None, description="A command printing the JWT.")
    remote_dir: str | None = Field(
        default=None, description="The directory on the cluster for logs and job directories."
    )
    local_mount: str | None = Field(
        default=None, description="That directory as mounted on the worker (optional)."
    )

    def cluster_config(self) -> ClusterConfig:
        """The settings as a :class:`core.clusters.ClusterConfig` (secrets stay in memory).

        Raises:
            core.clusters.ClusterError: naming the setting that is not usable.
        """
        values: dict[str, Any] = {
            k: v
            for k, v in self.model_dump(exclude={"cluster_name", "private_key", "token"}).items()
            if k in _SETTINGS and v is not None
        }
        if self.private_key is not None:
            values["private_key"] = Secret(self.private_key.get_secret_value())
        if self.token is not None:
            values["token"] = Secret(self.token.get_secret_value())
        return ClusterConfig(name=self.cluster_name, **values)

    def register(self) -> str:
        """Makes the cluster known to every runner of this process; returns its name."""
        register_cluster(self.cluster_config())
        return self.cluster_name


_SETTINGS = frozenset(
    {"transport", "host", "port", "user", "identity_file", "known_hosts", "rest_url",
     "token_env", "token_file", "token_command", "remote_dir", "local_mount"}
)  # fmt: skip


def use_cluster(cluster: SlurmCluster | str | None) -> str | None:
    """Registers ``cluster`` (a block, or the name of a saved one) and returns its cluster name;
    None for None."""
    if cluster is None:
        return None
    if isinstance(cluster, str):
        loaded = SlurmCluster.load(cluster)
        assert isinstance(loaded, SlurmCluster)
        cluster = loaded
    if not isinstance(cluster, SlurmCluster):
        raise ValueError(f"cluster: expected a SlurmCluster block or its name, got {cluster!r}")
    return cluster.register()
