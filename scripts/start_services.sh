#!/usr/bin/env bash
# Starts the real services the tests use: a Docker engine (+ loopback registry and test images)
# and a three-node Slurm cluster with accounting, with an SSH login node and slurmrestd in front of
# it, an Airflow deployment (PostgreSQL, scheduler, dag processor, triggerer, API server), and a
# Prefect server with a Shipyard worker (and the image its Docker flow runs use, and the
# cluster's own Python with Prefect for flow runs on the cluster behind the login node).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
bash ./start_docker.sh
bash ./start_slurm.sh
bash ./start_slurm_remote.sh
bash ./start_airflow.sh
bash ./start_prefect.sh
bash ./cluster_python.sh
