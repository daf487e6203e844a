"""Prefect Blocks holding where Shipyard jobs run, so flows need no file on the worker.

:class:`SlurmCluster` is a Slurm cluster reached over SSH (a login node) or slurmrestd, with its
secrets as ``SecretStr`` (stored encrypted by the Prefect server, never logged)::

    SlurmCluster(cluster_name="hpc1", transport="ssh", host="login.hpc.example", user="alice",
                 private_key="-----BEGIN OPENSSH PRIVATE KEY-----...").save("hpc1")

    @flow
    def train():
        handle = submit_job("app.yaml", cluster=SlurmCluster.load("hpc1"))
        wait_for_job(handle, cluster=SlurmCluster.load("hpc1"))

:class:`ShipyardBackend` is a whole backend configuration: the scheduler and its default run
options, the Docker engine and registry credentials, or a :class:`SlurmCluster`. The tasks take it
(or the name of a saved one) wherever they take ``scheduler``, and the Shipyard worker takes the
name of one as its ``backend`` job variable::

    ShipyardBackend(scheduler="local_docker", docker_host="tcp://builder:2375",
                    registry_url="registry.example:5000", registry_username="ci",
                    registry_password="...").save("builder")

    @flow
    def build():
        handle = submit_job("app.yaml", scheduler="builder")   # or ShipyardBackend.load("builder")
        wait_for_job(handle, cluster="builder")

Register the block types with ``prefect block register -m prefect_tasks``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, HttpUrl, SecretStr

from core.clusters import ClusterConfig, Secret, register_cluster
from core.joburl import check_ui_url_template
from core.runner import Runner, get_runner
from core.schedulers import SchedulerFactory, get_scheduler_factories
from core.schedulers.docker_scheduler import DockerEngine, connect
from core.specs import Cfg

__all__ = [
    "PROCESS_LOGO_URL",
    "Backend",
    "ShipyardBackend",
    "SlurmCluster",
    "resolve_backend",
    "runner_for",
    "use_cluster",
]

log = logging.getLogger(__name__)

#: the icon of a job run as processes: Shipyard has no logo hosted anywhere, so its blocks and
#: worker show the one Prefect 3.7's own process worker shows (prefect.workers.process)
PROCESS_LOGO_URL = (
    "https://cdn.sanity.io/images/3ugk85nk/production/"
    "356e6766a91baf20e1d08bbe16e8b5aaef4d8643-48x48.png"
)


class SlurmCluster(Block):
    """A Slurm cluster that is not the worker's own: the settings of ``core.clusters``."""

    _block_type_name = "Shipyard Slurm Cluster"
    _block_type_slug = "shipyard-slurm-cluster"
    _description = (
        "A Slurm cluster reached over SSH (a login node) or slurmrestd, for Shipyard jobs."
    )
    #: Slurm's own logo, as SchedMD's documentation site serves it
    _logo_url = HttpUrl("https://slurm.schedmd.com/slurm_logo.png")
    #: slurmrestd's documentation (the REST settings: rest_url, token, api_version)
    _documentation_url = HttpUrl("https://slurm.schedmd.com/rest.html")
    _code_example = """
    ```python
    from prefect import flow
    from prefect_tasks import SlurmCluster, submit_job, wait_for_job

    SlurmCluster(
        cluster_name="hpc1",
        transport="ssh",
        host="login.hpc.example",
        user="alice",
        private_key=open("id_ed25519").read(),
    ).save("hpc1")

    @flow
    def train():
        handle = submit_job("app.yaml", cluster="hpc1")
        return wait_for_job(handle, cluster="hpc1")
    ```
    """

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
    slurm_bin: str | None = Field(
        default=None,
        description="The directory of Slurm's commands, if not on the login PATH (/opt/slurm/bin).",
    )
    api_version: str | None = Field(
        default=None,
        description="slurmrestd's API version to speak (default: the newest both sides speak).",
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
     "token_env", "token_file", "token_command", "remote_dir", "local_mount", "slurm_bin",
     "api_version"}
)  # fmt: skip


def use_cluster(cluster: SlurmCluster | ShipyardBackend | str | None) -> str | None:
    """Registers ``cluster`` (a block, or the name of a saved one) and returns its cluster name;
    None for None (and for a :class:`ShipyardBackend` without a cluster)."""
    if cluster is None:
        return None
    if isinstance(cluster, str):
        cluster = _load(cluster)
    if isinstance(cluster, ShipyardBackend):
        return None if cluster.cluster is None else cluster.cluster.register()
    if not isinstance(cluster, SlurmCluster):
        raise ValueError(f"cluster: expected a SlurmCluster block or its name, got {cluster!r}")
    return cluster.register()


class ShipyardBackend(Block):
    """Where Shipyard jobs run: a scheduler with its default run options, and what reaching the
    backend takes (a Docker engine and registry credentials, or a Slurm cluster)."""

    _block_type_name = "Shipyard Backend"
    _block_type_slug = "shipyard-backend"
    _description = (
        "A Shipyard backend: the scheduler (local_cwd, local_docker, slurm ...), its default run"
        " options, and the Docker engine, registry credentials or Slurm cluster it uses."
    )
    _logo_url = HttpUrl(PROCESS_LOGO_URL)
    #: Prefect's page on blocks (saving, loading, referencing them in work pools)
    _documentation_url = HttpUrl("https://docs.prefect.io/v3/concepts/blocks")
    _code_example = """
    ```python
    from prefect import flow
    from prefect_tasks import ShipyardBackend, SlurmCluster, submit_job, wait_for_job

    ShipyardBackend(
        scheduler="slurm", cfg={"partition": "gpu"}, cluster=SlurmCluster.load("hpc1")
    ).save("gpu")

    @flow
    def train():
        handle = submit_job("app.yaml", scheduler="gpu")  # the block, or its name
        return wait_for_job(handle, cluster="gpu")
    ```

    As the backend of a Shipyard work pool's flow runs: the job variable `backend` (the
    block, picked in the UI, or its name).
    """

    scheduler: str = Field(
        default="local_cwd",
        description="The scheduler: local_cwd, local_dir, local_docker, slurm or a plugin's name.",
    )
    cfg: dict[str, Any] = Field(
        default_factory=dict,
        description="Default run options of the scheduler (see `shipyard runopts NAME`).",
    )
    docker_host: str | None = Field(
        default=None,
        description="The Docker engine's URL (default: DOCKER_HOST, else the local socket).",
    )
    tls_ca_cert: str | None = Field(
        default=None,
        description="The CA of the engine's TLS certificate: a file on the worker, or the PEM.",
    )
    tls_client_cert: str | None = Field(
        default=None, description="This client's TLS certificate (a file or the PEM)."
    )
    tls_private_key: SecretStr | None = Field(
        default=None, description="The client certificate's private key (a file or the PEM)."
    )
    registry_url: str | None = Field(
        default=None, description="A registry to log in to (e.g. registry.example:5000)."
    )
    registry_username: str | None = Field(default=None, description="The registry user.")
    registry_password: SecretStr | None = Field(
        default=None, description="The registry password or token."
    )
    cluster: SlurmCluster | None = Field(
        default=None,
        description="A Slurm cluster that is not this host's (the scheduler is then slurm).",
    )
    ui_url: str | None = Field(
        default=None,
        description="URL template of a job's page in a dashboard, linked from the run that"
        " submits it (a link artifact): fields {handle}, {scheduler}, {session}, {app_id},"
        " {job_id}, e.g. https://grafana.example/d/slurm?var-job={job_id}. Default:"
        " $SHIPYARD_UI_URL.",
    )

    def resolve(self, cfg: Cfg | None = None) -> Backend:
        """The backend with ``cfg`` over the block's default options; registers its cluster.

        Raises:
            ValueError: naming the field that is not usable.
        """
        if self.scheduler not in get_scheduler_factories():
            raise ValueError(
                f"scheduler: unknown scheduler {self.scheduler!r}; expected one of"
                f" {', '.join(get_scheduler_factories())}"
            )
        merged: dict[str, Any] = {**self.cfg, **(cfg or {})}
        if self.cluster is not None:
            merged.setdefault("cluster", self.cluster.register())
        if (self.registry_username is None) != (self.registry_password is None):
            raise ValueError("registry_username and registry_password: give both or neither")
        if self.ui_url:
            check_ui_url_template(self.ui_url, "ui_url")
        return Backend(self.scheduler, merged, self)

    def docker_engine(self) -> DockerEngine:
        """The block's Docker engine (TLS when a TLS field is set) and registry login."""
        key, password = self.tls_private_key, self.registry_password
        return DockerEngine(
            host=self.docker_host,
            tls_ca_cert=self.tls_ca_cert,
            tls_client_cert=self.tls_client_cert,
            tls_private_key=Secret(key.get_secret_value()) if key is not None else None,
            registry=self.registry_url,
            registry_username=self.registry_username,
            registry_password=Secret(password.get_secret_value()) if password else None,
            origin="Shipyard Backend block",
        )

    def docker_client(self) -> Any:
        """A ``docker.DockerClient`` for the block's engine, logged in to its registry."""
        return connect(self.docker_engine())

    @property
    def needs_docker_client(self) -> bool:
        """True when the block sets the Docker engine, TLS or registry credentials."""
        return bool(
            self.docker_host or self.registry_username or self.tls_ca_cert or self.tls_client_cert
        )


@dataclass(frozen=True)
class Backend:
    """A resolved backend: the scheduler name, the run options, and the block it came from."""

    scheduler: str | None
    cfg: Cfg | None
    block: ShipyardBackend | None = field(default=None, compare=False)

    @property
    def ui_url(self) -> str | None:
        """The block's job-page URL template, if it has one."""
        return self.block.ui_url if self.block is not None else None

    @property
    def docker_engine(self) -> DockerEngine | None:
        """The block's Docker engine and registry login; None: the environment's engine."""
        block = self.block
        return block.docker_engine() if block is not None and block.needs_docker_client else None

    def runner(self) -> Runner:
        """A runner that reaches this backend (the block's Docker engine, if it names one)."""
        factories = self.factories()
        return get_runner() if factories is None else get_runner(scheduler_factories=factories)

    def factories(self) -> dict[str, SchedulerFactory] | None:
        """The scheduler factories of a runner that reaches this backend; None: the default
        ones (a block that names no Docker engine, registry or TLS setting).

        Raises:
            ValueError: the block names a Docker engine and ``local_docker`` is not installed.
        """
        engine = self.docker_engine
        if engine is None:
            return None
        factories = dict(get_scheduler_factories())
        docker_factory = factories.get("local_docker")
        if docker_factory is None:
            raise ValueError("docker_host: the local_docker scheduler is not available")

        def make_docker(session_name: str, **kwargs: Any) -> Any:
            return docker_factory(session_name, **{**kwargs, "docker_engine": engine})

        factories["local_docker"] = make_docker
        return factories


def _load(name: str) -> SlurmCluster | ShipyardBackend:
    """The saved block called ``name``: a SlurmCluster, else a ShipyardBackend."""
    for kind in (SlurmCluster, ShipyardBackend):
        try:
            loaded = kind.load(name)
        except ValueError:
            continue
        assert isinstance(loaded, SlurmCluster | ShipyardBackend)
        return loaded
    raise ValueError(f"no saved Shipyard Slurm Cluster or Shipyard Backend block named {name!r}")


def resolve_backend(scheduler: str | ShipyardBackend | None, cfg: Cfg | None = None) -> Backend:
    """The backend of a ``scheduler`` argument: a scheduler name, a :class:`ShipyardBackend`,
    or the name of a saved one (a name that is not a scheduler's); ``cfg`` goes over its options.

    Raises:
        ValueError: an unknown scheduler and no block of that name; a block's bad field.
    """
    if scheduler is None or (
        isinstance(scheduler, str) and (scheduler in get_scheduler_factories() or not scheduler)
    ):
        return Backend(scheduler, cfg)
    if isinstance(scheduler, str):
        try:
            block = ShipyardBackend.load(scheduler)
        except ValueError:
            raise ValueError(
                f"scheduler: unknown scheduler {scheduler!r}; expected one of"
                f" {', '.join(get_scheduler_factories())}, or the name of a saved Shipyard"
                " Backend block"
            ) from None
        assert isinstance(block, ShipyardBackend)
        scheduler = block
    if not isinstance(scheduler, ShipyardBackend):
        raise ValueError(
            f"scheduler: expected a scheduler name or a ShipyardBackend block, got {scheduler!r}"
        )
    return scheduler.resolve(cfg)


def runner_for(where: SlurmCluster | ShipyardBackend | str | None) -> Runner:
    """A runner for the tasks that take a handle and a ``cluster`` argument (a block, or the
    name of a saved one): registers the cluster; the runner reaches the block's Docker engine."""
    if isinstance(where, str):
        where = _load(where)
    if isinstance(where, ShipyardBackend):
        return where.resolve().runner()
    use_cluster(where)
    return get_runner()
