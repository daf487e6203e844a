#!/usr/bin/env bash
# The test command: sets up .venv, starts the services (as root), then lint, types and the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$(id -u)" = 0 ]; then
    bash scripts/start_services.sh
else
    echo "test: not root, using whatever Docker/Slurm already run (tests needing them skip)" >&2
fi
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy core airflow_provider prefect_tasks
echo "== sizes"
.venv/bin/python scripts/check_sizes.py core airflow_provider prefect_tasks
echo "== pytest"
.venv/bin/pytest "$@"
