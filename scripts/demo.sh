#!/usr/bin/env bash
# The demo: one multi-role job on the embedded local scheduler, followed through the CLI and the
# Python API; then the example Airflow DAG (dag.test() on SQLite) and the example Prefect flow
# (Prefect's temporary local server). Needs no services.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH"
demo_home=${SHIPYARD_DEMO_HOME:-$PWD/.shipyard/demo}
mkdir -p "$demo_home"

echo "== 1. CLI: a two-role job, logs streamed while it runs"
echo "\$ shipyard run scripts/demo/app.yaml --log"
shipyard run scripts/demo/app.yaml --log

echo
echo "== 2. Python API: build an app, run, follow, then address it from another process"
python scripts/demo/api_demo.py

if [ -f dags/shipyard_local_job.py ]; then
    echo
    echo "== 3. Airflow: the example DAG with dag.test() on SQLite"
    export AIRFLOW_HOME="$demo_home/airflow"
    export AIRFLOW__CORE__LOAD_EXAMPLES=False
    export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
    if [ ! -f "$AIRFLOW_HOME/.migrated" ]; then
        echo "(first run: creating Airflow's SQLite database in $AIRFLOW_HOME)"
        airflow db migrate >"$demo_home/airflow-migrate.log" 2>&1 || { tail -20 "$demo_home/airflow-migrate.log"; exit 1; }
        touch "$AIRFLOW_HOME/.migrated"
    fi
    python dags/shipyard_local_job.py
fi

if [ -f prefect_tasks/examples.py ]; then
    echo
    echo "== 4. Prefect: the example flow on Prefect's temporary local server"
    python -m prefect_tasks.examples
fi
echo
echo "demo: all parts succeeded"
