#!/usr/bin/env bash
# Starts the real services the tests use: a Docker engine (+ loopback registry and test images),
# a three-node Slurm 22.05 cluster with accounting, with an SSH login node and slurmrestd in front
# of it, a second cluster of Slurm 26.05 (built once per machine) behind the same login node, an
# Airflow deployment (PostgreSQL, scheduler, dag processor, triggerer, API server), and a
# Prefect server with a Shipyard worker (and the image its Docker flow runs use, and the
# cluster's own Python with Prefect for flow runs on the cluster behind the login node).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
bash ./start_docker.sh
bash ./start_slurm.sh
bash ./start_slurm_remote.sh
bash ./start_slurm26.sh
bash ./start_airflow.sh
bash ./start_prefect.sh
bash ./cluster_python.sh
