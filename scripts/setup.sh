#!/usr/bin/env bash
# Creates .venv with shipyard and every extra installed. Idempotent; as root on Debian 12 it also
# installs the Debian packages the project needs (python3-venv when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        echo "setup: python3 with venv and ensurepip is required" >&2
        exit 1
    fi
fi

# (v2: built with hatchling since 2026-11; v3: `all` without the dev tools, the Airflow
# deployment's PostgreSQL driver installed here)
stamp=.venv/.shipyard-installed-v3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# reinstall only when the dependency list (pyproject.toml, or what this script adds) changed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    # every extra, the dev tools (tests, ruff, mypy), and the driver of the PostgreSQL metadata
    # database scripts/start_airflow.sh runs Airflow on (the `airflow` extra leaves it out)
    .venv/bin/python -m pip install -q -e '.[all,dev]' 'apache-airflow[postgres]'
    touch "$stamp"
fi
# byte-compile the project (imports would not write .pyc where PYTHONDONTWRITEBYTECODE is set)
.venv/bin/python -m compileall -q core airflow_provider prefect_tasks >/dev/null
echo "setup: .venv ready ($(.venv/bin/python --version))"
