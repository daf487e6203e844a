"""Named Slurm clusters: how the ``slurm`` scheduler reaches a cluster that is not this host.

A cluster is chosen with the run option ``cluster`` (``shipyard run -s slurm --cfg cluster=hpc1``
or ``cfg={"cluster": "hpc1"}``); without it the Slurm commands of this host are used. Its app
handles name the cluster, never a secret (``slurm://session/hpc1:1234``), so any process with
the same named configuration can describe, follow and cancel the job.

Clusters are read from ``$SHIPYARD_CLUSTERS`` or else ``$XDG_CONFIG_HOME/shipyard/clusters.yaml``
(default ``~/.config/shipyard/clusters.yaml``), a mapping from name to settings::

    hpc1:                        # the Slurm commands run on a login node over SSH
      transport: ssh
      host: login.hpc.example    # or an alias of ~/.ssh/config (ProxyJump etc. are honoured)
      user: alice
      identity_file: ~/.ssh/id_ed25519
      known_hosts: accept-new    # or a known_hosts file (default: ssh's own)
      remote_dir: /scratch/alice/shipyard   # logs and job directories (default ~/shipyard)
    hpc2:                        # slurmrestd with a JWT
      transport: rest
      rest_url: https://slurm.example:6820
      user: alice
      token_command: ssh login.hpc.example scontrol token lifespan=3600
      remote_dir: /scratch/alice/shipyard
      host: login.hpc.example    # logs over SFTP (or local_mount: the same directory mounted here)

A program holding its settings elsewhere (an Airflow connection, a Prefect block) registers a
:class:`ClusterConfig` with :func:`register_cluster` instead of writing a file; registered
clusters win over the file's.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from core.errors import ShipyardError

log = logging.getLogger(__name__)

__all__ = [
    "ClusterConfig",
    "ClusterError",
    "Secret",
    "clusters_file",
    "get_cluster",
    "load_clusters",
    "register_cluster",
]

Transport = Literal["local", "ssh", "rest"]
TRANSPORTS: tuple[str, ...] = ("local", "ssh", "rest")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_VERSION_RE = re.compile(r"^v\d+\.\d+\.\d+$")


class ClusterError(ShipyardError, ValueError):
    """A cluster that is unknown, badly configured or cannot be reached; the message names the
    cluster and the setting."""


class Secret:
    """A secret value (a token, a private key) that never shows in ``repr``/``str``/logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        """The value itself."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class ClusterConfig:
    """How to reach one Slurm cluster. Only ``name`` and ``transport`` are always needed.

    Attributes:
        name: the cluster's name (in handles: ``slurm://session/{name}:{job_id}``)
        transport: ``local`` (this host's Slurm commands), ``ssh`` (the commands run on a login
            node) or ``rest`` (slurmrestd)
        host, port, user: the SSH login node (an alias of ``~/.ssh/config`` works as ``host``);
            for ``rest``, ``user`` is the Slurm user the token belongs to, and ``host`` (if
            set) is where logs and job directories are read and written over SFTP
        identity_file: the SSH private key file (default: ssh's own keys and agent)
        private_key: the SSH private key itself, held in memory (from a secrets backend)
        known_hosts: a known_hosts file, or ``accept-new`` (record an unknown host's key on
            first use, refuse a changed one); default: ssh's own known_hosts
        rest_url: slurmrestd's base URL, e.g. ``http://slurm.example:6820``
        token: the JWT itself, held in memory (from a secrets backend)
        token_env: the environment variable holding the JWT (default ``SLURM_JWT``)
        token_file: a file holding the JWT
        token_command: a command printing the JWT (``scontrol token`` output works)
        remote_dir: the directory on the cluster for logs and job directories (default
            ``shipyard`` in the login user's home; must be absolute for ``rest``)
        local_mount: ``remote_dir`` as mounted on this host (a shared file system): logs are
            read from here instead of over SSH
        slurm_bin: the directory of the cluster's Slurm commands where they are not on the
            login shell's ``PATH`` (``/opt/slurm/bin``): Shipyard runs them from there, and
            jobs find ``srun`` there
        api_version: for ``rest``, the slurmrestd API version to speak (``v0.0.42``); default:
            the newest one both slurmrestd and Shipyard speak
    """

    name: str
    transport: Transport = "local"
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    private_key: Secret | None = None
    known_hosts: str | None = None
    rest_url: str | None = None
    token: Secret | None = None
    token_env: str = "SLURM_JWT"
    token_file: str | None = None
    token_command: str | None = None
    remote_dir: str | None = None
    local_mount: str | None = None
    slurm_bin: str | None = None
    api_version: str | None = None

    def __post_init__(self) -> None:
        self._check()

    def _error(self, field: str, problem: str) -> ClusterError:
        return ClusterError(f"cluster {self.name!r}: {field}: {problem}")

    def _check(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ClusterError(
                f"cluster name: expected letters, digits, '_', '.', '-' (at most 63), got"
                f" {self.name!r}"
            )
        if self.transport not in TRANSPORTS:
            raise self._error(
                "transport", f"expected one of {list(TRANSPORTS)}, got {self.transport!r}"
            )
        if self.port is not None and (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not 0 < self.port < 65536
        ):
            raise self._error("port", f"expected a port 1-65535, got {self.port!r}")
        if self.transport == "ssh" and not self.host:
            raise self._error("host", "required for transport ssh (the login node)")
        if self.transport == "rest":
            if not self.rest_url or not re.match(r"^https?://[^/\s]+", self.rest_url):
                raise self._error(
                    "rest_url", f"expected http(s)://host:port, got {self.rest_url!r}"
                )
            if not self.user:
                raise self._error("user", "required for transport rest (the token's Slurm user)")
            if not self.remote_dir or not self.remote_dir.startswith("/"):
                raise self._error(
                    "remote_dir",
                    "an absolute directory on the cluster is required for transport rest (where"
                    f" jobs run and write their logs), got {self.remote_dir!r}",
                )
        if self.slurm_bin is not None and (
            not isinstance(self.slurm_bin, str) or not self.slurm_bin.startswith("/")
        ):
            raise self._error(
                "slurm_bin",
                f"expected the absolute directory of Slurm's commands, got {self.slurm_bin!r}",
            )
        if self.api_version is not None and (
            not isinstance(self.api_version, str) or not _VERSION_RE.fullmatch(self.api_version)
        ):
            raise self._error(
                "api_version", f"expected slurmrestd's form, e.g. v0.0.45, got {self.api_version!r}"
            )
        for name in ("host", "user", "identity_file", "known_hosts", "remote_dir", "local_mount"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or "\0" in value):
                raise self._error(name, f"expected a non-empty string, got {value!r}")
        for name in ("token", "private_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Secret):
                raise self._error(name, "expected a core.clusters.Secret")

    @property
    def uses_ssh(self) -> bool:
        """True if the cluster is reached (or its files read) over SSH."""
        return self.transport == "ssh" or (self.transport == "rest" and bool(self.host))

    @classmethod
    def from_mapping(cls, name: str, data: Any, source: str = "") -> ClusterConfig:
        """A config from plain data (a clusters file's entry); errors name ``source``, the
        cluster and the field."""
        where = f"{source}: " if source else ""
        if not isinstance(data, Mapping):
            raise ClusterError(
                f"{where}cluster {name!r}: expected a mapping of settings, got {data!r}"
            )
        known = {f.name for f in fields(cls)} - {"name"}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ClusterError(
                    f"{where}cluster {name!r}: {key}: unknown setting; expected one of"
                    f" {', '.join(sorted(known))}"
                )
            if key in ("token", "private_key") and isinstance(value, str):
                value = Secret(value)
            elif key in (
                "identity_file",
                "known_hosts",
                "token_file",
                "local_mount",
            ) and isinstance(value, str):
                value = value if value == "accept-new" else os.path.expanduser(value)
            values[key] = value
        try:
            return cls(name=str(name), **values)
        except ClusterError as e:
            raise ClusterError(f"{where}{e}") from None
        except TypeError as e:
            raise ClusterError(f"{where}cluster {name!r}: {e}") from None

    def resolve_token(self) -> str:
        """The JWT for slurmrestd, from ``token``, else ``token_command``, ``token_file``,
        ``token_env`` (in that order). Output like ``SLURM_JWT=...`` is accepted.

        Raises:
            ClusterError: naming the setting when no token can be had.
        """
        if self.token is not None:
            return _strip_token(self.token.get_secret_value())
        if self.token_command:
            return _strip_token(self._run_token_command())
        if self.token_file:
            try:
                with open(os.path.expanduser(self.token_file), encoding="utf-8") as f:
                    return _strip_token(f.read())
            except OSError as e:
                raise self._error(
                    "token_file", f"cannot read {self.token_file}: {e.strerror}"
                ) from None
        value = os.environ.get(self.token_env)
        if not value:
            raise self._error(
                "token_env",
                f"no token: ${self.token_env} is not set (or set token_file / token_command)",
            )
        return _strip_token(value)

    def _run_token_command(self) -> str:
        assert self.token_command
        import subprocess  # (lazily: start-up)

        try:
            p = subprocess.run(
                shlex.split(self.token_command),
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            raise self._error("token_command", f"could not be run: {e}") from None
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
            raise self._error("token_command", f"failed: {last}")
        return p.stdout


def _strip_token(text: str) -> str:
    value = text.strip()
    for line in value.splitlines():
        line = line.strip()
        if line.startswith("SLURM_JWT="):
            return line.partition("=")[2].strip()
    return value


def clusters_file() -> str:
    """The clusters file: ``$SHIPYARD_CLUSTERS``, else ``$XDG_CONFIG_HOME/shipyard/clusters.yaml``
    (default ``~/.config/shipyard/clusters.yaml``)."""
    explicit = os.environ.get("SHIPYARD_CLUSTERS")
    if explicit:
        return os.path.expanduser(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "shipyard", "clusters.yaml")


def load_clusters(path: str | None = None) -> dict[str, ClusterConfig]:
    """The clusters of ``path`` (default: :func:`clusters_file`); none if the default file does
    not exist.

    Raises:
        ClusterError: the file cannot be read or parsed, or an entry is invalid (naming the
            file, the cluster and the setting).
    """
    import yaml

    file = path or clusters_file()
    try:
        with open(file, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        if path is None and not os.environ.get("SHIPYARD_CLUSTERS"):
            return {}
        raise ClusterError(f"clusters file {file}: does not exist") from None
    except OSError as e:
        raise ClusterError(f"clusters file {file}: cannot be read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ClusterError(f"clusters file {file}: invalid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ClusterError(f"clusters file {file}: expected a mapping of cluster names to settings")
    return {str(n): ClusterConfig.from_mapping(str(n), v, file) for n, v in data.items()}


class _Registry:
    """The clusters registered in this process (see :func:`register_cluster`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[str, ClusterConfig] = {}

    def register(self, config: ClusterConfig) -> None:
        with self._lock:
            self._clusters[config.name] = config

    def get(self, name: str) -> ClusterConfig | None:
        with self._lock:
            return self._clusters.get(name)


_REGISTRY = _Registry()


def register_cluster(config: ClusterConfig) -> None:
    """Makes ``config`` known in this process under ``config.name`` (it wins over the clusters
    file). For settings held outside a file: an Airflow connection, a Prefect block."""
    if not isinstance(config, ClusterConfig):
        raise TypeError(f"register_cluster: expected a ClusterConfig, got {type(config).__name__}")
    _REGISTRY.register(config)


def get_cluster(name: str) -> ClusterConfig:
    """The cluster called ``name``: a registered one, else the clusters file's.

    Raises:
        ClusterError: if no cluster has that name (the message says where it was looked for).
    """
    found = _REGISTRY.get(name)
    if found is not None:
        return found
    clusters = load_clusters()
    if name in clusters:
        return clusters[name]
    known = ", ".join(sorted(clusters)) or "none"
    raise ClusterError(
        f"cfg.cluster: unknown cluster {name!r}; clusters in {clusters_file()}: {known}"
    )
