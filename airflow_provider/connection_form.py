"""The ``shipyard`` connection type's form: its extra fields and how the standard fields show.

Declared here, without importing Airflow, so that :func:`airflow_provider.get_provider_info`
can hand them to Airflow (``conn-fields`` and ``ui-field-behaviour``, Airflow 3.2+).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONN_FIELDS", "UI_FIELD_BEHAVIOUR"]

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema"],
    "relabeling": {
        "host": "SSH login node (Slurm)",
        "login": "User",
        "password": "slurmrestd token (JWT), or the Docker registry's password",
    },
    "placeholders": {
        "host": "login.hpc.example (or an alias of ~/.ssh/config)",
        "port": "22",
        "login": "the cluster user",
    },
}

#: the connection form's extra fields (Airflow 3.2+ ``conn-fields``)
CONN_FIELDS: dict[str, Any] = {
    "scheduler": {
        "label": "Scheduler",
        "schema": {
            "type": ["string", "null"],
            "enum": [None, "local_cwd", "local_dir", "local_docker", "slurm"],
        },  # fmt: skip
    },
    "cfg": {
        "label": "Default run options (JSON)",
        "schema": {"type": ["string", "null"]},
        "description": 'e.g. {"partition": "gpu", "time": "2:00:00"}',
    },
    "transport": {
        "label": "Slurm transport",
        "schema": {"type": ["string", "null"], "enum": [None, "local", "ssh", "rest"]},
        "description": "how to reach a Slurm cluster that is not this worker",
    },
    "rest_url": {"label": "slurmrestd URL", "schema": {"type": ["string", "null"]}},
    "ui_url": {
        "label": "Job page URL template",
        "schema": {"type": ["string", "null"]},
        "description": "the task's 'Shipyard job' link, e.g. https://grafana.example/d/x?job={job_id}",
    },
    "private_key": {
        "label": "SSH private key",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "identity_file": {"label": "SSH private key file", "schema": {"type": ["string", "null"]}},
    "known_hosts": {
        "label": "known_hosts file (or accept-new)",
        "schema": {"type": ["string", "null"]},
    },
    "remote_dir": {
        "label": "Directory on the cluster for logs and job directories",
        "schema": {"type": ["string", "null"]},
    },
    "local_mount": {
        "label": "That directory as mounted on the workers (optional)",
        "schema": {"type": ["string", "null"]},
    },
    "token_command": {
        "label": "Command printing the JWT (instead of the token field)",
        "schema": {"type": ["string", "null"]},
    },
    "token_file": {
        "label": "File holding the JWT on the worker (instead of the token field)",
        "schema": {"type": ["string", "null"]},
    },
    "slurm_bin": {
        "label": "Directory of Slurm's commands (if not on the login PATH)",
        "schema": {"type": ["string", "null"]},
        "description": "e.g. /opt/slurm/bin",
    },
    "api_version": {
        "label": "slurmrestd API version (optional)",
        "schema": {"type": ["string", "null"]},
        "description": "e.g. v0.0.42; default: the newest both sides speak",
    },
    "docker_host": {
        "label": "Docker engine URL",
        "schema": {"type": ["string", "null"]},
        "description": "as DOCKER_HOST, e.g. tcp://builder:2376 (default: the worker's)",
    },
    "tls_ca_cert": {
        "label": "Docker TLS: CA certificate (file or PEM)",
        "schema": {"type": ["string", "null"]},
    },
    "tls_client_cert": {
        "label": "Docker TLS: client certificate (file or PEM)",
        "schema": {"type": ["string", "null"]},
    },
    "tls_private_key": {
        "label": "Docker TLS: client key (file or PEM)",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "registry_url": {
        "label": "Docker registry to log in to",
        "schema": {"type": ["string", "null"]},
        "description": "host:port; the password goes in the password field",
    },
    "registry_username": {"label": "Docker registry user", "schema": {"type": ["string", "null"]}},
}
