#!/usr/bin/env bash
# Starts a real Apache Airflow 3.3 deployment on this host, the way a small production one runs:
#   - PostgreSQL 15 (Debian's cluster 15/main) holding the metadata database `shipyard_airflow`
#   - LocalExecutor, the repository's dags/ (and the deployment tests' tests/deploy/airflow/dags/) as
#     DAG bundles
#   - `airflow scheduler`, `airflow dag-processor`, `airflow triggerer` and `airflow api-server`
#     (on 127.0.0.1:$SHIPYARD_AIRFLOW_PORT, default 28080) as separate background processes
#   - the simple auth manager with one admin user (`admin`), its password in a file only root
#     reads; a token comes from `POST /auth/token`
# Idempotent: processes that already run are left alone, a missing one is started again (the
# tests restart the triggerer this way). Returns once the API server reports the metadata
# database, scheduler, triggerer and dag processor healthy. Needs root (Debian 12).
#
# Everything lives in $SHIPYARD_AIRFLOW_HOME (default /var/lib/shipyard-airflow, mode 700):
#   airflow.cfg          the configuration (mode 600: it holds the database password and keys)
#   admin_password       the admin's password (mode 600)
#   passwords.json       the simple auth manager's password file (mode 600)
#   run/NAME.pid         the pid of each process; logs/NAME.out its output; logs/ the task logs
#   shipyard-state/      SHIPYARD_STATE_DIR of the deployment (local jobs' records)
#   api_url              the API server's base URL
#
#   scripts/start_airflow.sh             # start (or check) the deployment
#   scripts/start_airflow.sh --stop      # stop the processes this script started (by pid)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
AHOME=${SHIPYARD_AIRFLOW_HOME:-/var/lib/shipyard-airflow}
PORT=${SHIPYARD_AIRFLOW_PORT:-28080}
VENV=${SHIPYARD_VENV:-$REPO/.venv}
WAIT=${SHIPYARD_AIRFLOW_WAIT:-180}
PG_VERSION=15
PG_CLUSTER=main
DB_NAME=shipyard_airflow
DB_USER=shipyard_airflow
PROCESSES=(scheduler dag-processor triggerer api-server)

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root
export PATH="$PATH:/usr/sbin:/sbin"
umask 077

RUN=$AHOME/run
LOGS=$AHOME/logs
API_URL="http://127.0.0.1:$PORT"

airflow_alive() { # airflow_alive NAME: run/NAME.pid names a live `airflow NAME` process
    # (the API server renames itself "airflow api_server -- ...")
    pid_alive "$RUN/$1.pid" "airflow $1" || pid_alive "$RUN/$1.pid" "airflow ${1//-/_}"
}

if [ "${1:-}" = "--stop" ]; then
    for name in "${PROCESSES[@]}"; do
        if airflow_alive "$name"; then
            log "stopping $name (pid $(cat "$RUN/$name.pid"))"
            kill -TERM "$(cat "$RUN/$name.pid")"
        fi
    done
    # a scheduler waits for the tasks its LocalExecutor runs ("signal again if you don't want to
    # wait"): a second TERM after 30 s, then KILL after 60 s, as a service manager does
    deadline=$((SECONDS + 60))
    for name in "${PROCESSES[@]}"; do
        again=$((SECONDS + 30))
        while airflow_alive "$name"; do
            pid=$(cat "$RUN/$name.pid")
            if [ "$SECONDS" -ge "$deadline" ]; then
                log "airflow $name (pid $pid) does not stop: killing it"
                kill -KILL "$pid" 2>/dev/null || true
            elif [ "$SECONDS" -ge "$again" ]; then
                log "airflow $name (pid $pid) still waits: signalling it again"
                kill -TERM "$pid" 2>/dev/null || true
                again=$deadline
            fi
            sleep 0.2
        done
        rm -f "$RUN/$name.pid"
    done
    exit 0
fi

start=$SECONDS

# --- packages --------------------------------------------------------------------------------
[ -x "$VENV/bin/airflow" ] || die "$VENV/bin/airflow is missing (run scripts/setup.sh)"
"$VENV/bin/python" -c 'import psycopg2' 2>/dev/null ||
    die "psycopg2 is missing from $VENV (run scripts/setup.sh, or pip install 'apache-airflow[postgres]')"
apt_install postgresql

# --- PostgreSQL ------------------------------------------------------------------------------
if ! pg_lsclusters -h 2>/dev/null | awk '{print $1"/"$2}' | grep -qx "$PG_VERSION/$PG_CLUSTER"; then
    log "creating the PostgreSQL cluster $PG_VERSION/$PG_CLUSTER"
    pg_createcluster "$PG_VERSION" "$PG_CLUSTER" >/dev/null
fi
PG_PORT=$(pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$PG_CLUSTER" '$1 == v && $2 == c {print $3}')
if ! pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" status >/dev/null 2>&1; then
    log "starting PostgreSQL $PG_VERSION/$PG_CLUSTER"
    pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" start
fi
deadline=$((SECONDS + 60))
until pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; do
    [ "$SECONDS" -lt "$deadline" ] || die "PostgreSQL does not accept connections on 127.0.0.1:$PG_PORT"
    sleep 0.1
done

# --- secrets (generated once, readable by root only) -----------------------------------------
install -d -m 700 "$AHOME" "$RUN" "$LOGS" "$AHOME/shipyard-state" "$AHOME/work"
new_secret() { # new_secret FILE: a random token in FILE unless it already holds one
    [ -s "$1" ] || "$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$1"
}
new_secret "$AHOME/db_password"
new_secret "$AHOME/admin_password"
new_secret "$AHOME/api_secret_key"
new_secret "$AHOME/jwt_secret"
[ -s "$AHOME/fernet_key" ] ||
    "$VENV/bin/python" -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())' >"$AHOME/fernet_key"
chmod 600 "$AHOME"/db_password "$AHOME"/admin_password "$AHOME"/api_secret_key "$AHOME"/jwt_secret "$AHOME"/fernet_key

# the role and database (the password goes through stdin, never argv)
{
    printf "SELECT 'CREATE ROLE %s LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s')\\gexec\n" "$DB_USER" "$DB_USER"
    printf "ALTER ROLE %s WITH LOGIN PASSWORD '%s';\n" "$DB_USER" "$(cat "$AHOME/db_password")"
    printf "SELECT 'CREATE DATABASE %s OWNER %s' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '%s')\\gexec\n" "$DB_NAME" "$DB_USER" "$DB_NAME"
} | runuser -u postgres -- psql -q -X -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres >/dev/null

# the simple auth manager's password file (written here, so no password is ever printed)
printf '{"admin": "%s"}\n' "$(cat "$AHOME/admin_password")" >"$AHOME/passwords.json.new"
mv "$AHOME/passwords.json.new" "$AHOME/passwords.json"

# --- configuration ---------------------------------------------------------------------------
bundles=$(printf '[{"name": "shipyard-examples", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {"path": "%s/dags", "refresh_interval": 5}}, {"name": "shipyard-deploy-tests", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {"path": "%s/tests/deploy/airflow/dags", "refresh_interval": 5}}]' "$REPO" "$REPO")
cat >"$AHOME/airflow.cfg.new" <<EOF
# written by scripts/start_airflow.sh (mode 600: it holds the database password and keys)
[core]
executor = LocalExecutor
dags_folder = $REPO/dags
load_examples = False
dags_are_paused_at_creation = False
parallelism = 4
fernet_key = $(cat "$AHOME/fernet_key")
auth_manager = airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
simple_auth_manager_users = admin:admin
simple_auth_manager_passwords_file = $AHOME/passwords.json
execution_api_server_url = $API_URL/execution/
dagbag_import_timeout = 120
default_task_retry_delay = 1

[database]
sql_alchemy_conn = postgresql+psycopg2://$DB_USER:$(cat "$AHOME/db_password")@127.0.0.1:$PG_PORT/$DB_NAME

[logging]
base_log_folder = $LOGS
dag_processor_child_process_log_directory = $LOGS/dag-processor

[api]
host = 127.0.0.1
port = $PORT
base_url = $API_URL
workers = 1
secret_key = $(cat "$AHOME/api_secret_key")
expose_config = False

[api_auth]
jwt_secret = $(cat "$AHOME/jwt_secret")

[operators]
default_deferrable = False

[scheduler]
scheduler_heartbeat_sec = 1
scheduler_idle_sleep_time = 0.5
task_instance_heartbeat_timeout = 30
task_instance_heartbeat_timeout_detection_interval = 2
orphaned_tasks_check_interval = 30

[triggerer]
job_heartbeat_sec = 1
# a triggerer that stopped without ending its job hands its triggers over after this long
triggerer_health_check_threshold = 10

[dag_processor]
dag_bundle_config_list = $bundles
refresh_interval = 5
min_file_process_interval = 30
parsing_processes = 1
EOF
if ! cmp -s "$AHOME/airflow.cfg.new" "$AHOME/airflow.cfg"; then
    mv "$AHOME/airflow.cfg.new" "$AHOME/airflow.cfg"
else
    rm -f "$AHOME/airflow.cfg.new"
fi
echo "$API_URL" >"$AHOME/api_url"

# the processes get this environment only (nothing of the caller's AIRFLOW__* settings)
run_env=(
    env -i
    "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "HOME=${HOME:-/root}" "LANG=C.UTF-8"
    "AIRFLOW_HOME=$AHOME"
    "SHIPYARD_STATE_DIR=$AHOME/shipyard-state"
)
[ -z "${SHIPYARD_TEST_IMAGE:-}" ] || run_env+=("SHIPYARD_TEST_IMAGE=$SHIPYARD_TEST_IMAGE")

# --- migrate (when nothing runs yet or Airflow changed) ---------------------------------------
version=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("apache-airflow-core"))')
stamp="$AHOME/migrated-$version"
if [ ! -f "$stamp" ] || ! airflow_alive scheduler; then
    log "airflow db migrate ($version)"
    (cd "$AHOME/work" && "${run_env[@]}" "$VENV/bin/airflow" db migrate >"$LOGS/migrate.out" 2>&1) ||
        die "airflow db migrate failed: $(tail -5 "$LOGS/migrate.out")"
    touch "$stamp"
fi

# --- the processes ---------------------------------------------------------------------------
for name in "${PROCESSES[@]}"; do
    if airflow_alive "$name"; then
        continue
    fi
    log "starting airflow $name"
    # setsid: its own session, so a signal to the caller's process group does not reach it
    (cd "$AHOME/work" && exec "${run_env[@]}" setsid "$VENV/bin/airflow" "$name" \
        >"$LOGS/$name.out" 2>&1 </dev/null) &
    echo $! >"$RUN/$name.pid"
done

# --- readiness: every component healthy, as the API server reports it ------------------------
healthy() {
    "$VENV/bin/python" - "$API_URL" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/api/v2/monitor/health", timeout=2) as r:
        health = json.load(r)
except Exception:
    sys.exit(1)
parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
sys.exit(0 if all((health.get(p) or {}).get("status") == "healthy" for p in parts) else 1)
PY
}
deadline=$((SECONDS + WAIT))
until healthy; do
    for name in "${PROCESSES[@]}"; do
        airflow_alive "$name" || die "airflow $name exited: $(tail -5 "$LOGS/$name.out")"
    done
    [ "$SECONDS" -lt "$deadline" ] || die "the deployment is not healthy after ${WAIT}s (see $LOGS/*.out)"
    sleep 0.5
done
log "Airflow on $API_URL is healthy ($((SECONDS - start))s)"
