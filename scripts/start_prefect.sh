#!/usr/bin/env bash
# Starts a real Prefect 3 deployment on this host, as a small production one runs:
#   - `prefect server start` (its own process; SQLite database; API on 127.0.0.1:$SHIPYARD_PREFECT_PORT,
#     default 4200; no UI)
#   - a relay from the Docker bridge's gateway address to that port (socat), so flow runs in
#     containers reach the API while the server itself listens on loopback only
#   - the work pool $SHIPYARD_PREFECT_POOL (default `shipyard`) of type `shipyard`, made with
#     `prefect work-pool create -t shipyard`, and the Shipyard block types registered with
#     `prefect block register -m prefect_tasks`
#   - `prefect worker start -p POOL -t shipyard --name shipyard-worker-1` (its own process; it polls
#     every $SHIPYARD_PREFECT_POLL seconds, default 2)
#   - the image shipyard-test/prefect:<version> (scripts/build_prefect_image.sh), when Docker runs
# Idempotent: processes that already run are left alone, a missing one is started again (the
# tests restart the worker this way). Returns once the API answers and the worker has polled.
# Needs root (Debian 12).
#
# Everything lives in $SHIPYARD_PREFECT_HOME (default /var/lib/shipyard-prefect, mode 700):
#   home/                PREFECT_HOME of the processes; prefect.db the SQLite database
#   run/NAME.pid         the pid of each process; logs/NAME.out its output
#   shipyard-state/      SHIPYARD_STATE_DIR of the worker (local jobs' records)
#   work/                the worker's working directory (local_cwd jobs run there)
#   api_url              the API's URL; pool the work pool's name; poll the worker's poll interval
#
#   scripts/start_prefect.sh             # start (or check) the deployment
#   scripts/start_prefect.sh --stop      # stop the processes this script started (by pid)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PHOME=${SHIPYARD_PREFECT_HOME:-/var/lib/shipyard-prefect}
PORT=${SHIPYARD_PREFECT_PORT:-4200}
POOL=${SHIPYARD_PREFECT_POOL:-shipyard}
POLL=${SHIPYARD_PREFECT_POLL:-2}
WORKER_NAME=${SHIPYARD_PREFECT_WORKER:-shipyard-worker-1}
VENV=${SHIPYARD_VENV:-$REPO/.venv}
WAIT=${SHIPYARD_PREFECT_WAIT:-120}
PROCESSES=(server relay worker)

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root
umask 077

RUN=$PHOME/run
LOGS=$PHOME/logs
API_URL="http://127.0.0.1:$PORT/api"

pattern() { # the command line each process has
    case $1 in
    server) echo "prefect server start" ;;
    relay) echo "socat TCP-LISTEN:$PORT" ;;
    worker) echo "prefect worker start" ;;
    esac
}
prefect_alive() { # prefect_alive NAME: run/NAME.pid names a live process of that kind
    pid_alive "$RUN/$1.pid" "$(pattern "$1")"
}

# Prefect 3.7's worker turns SIGTERM into a SIGINT to itself, which an idle worker sometimes
# never acts on (its event loop stays in select): after 20 s it gets SIGKILL (its flow runs are
# found again by the next worker)
stop_worker() {
    local pid
    pid=$(cat "$RUN/worker.pid")
    kill -TERM "$pid"
    deadline=$((SECONDS + 20))
    while prefect_alive worker && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if prefect_alive worker; then
        log "the worker (pid $pid) did not stop on SIGTERM: SIGKILL"
        kill -KILL "$pid"
        deadline=$((SECONDS + 10))
        while prefect_alive worker; do
            [ "$SECONDS" -lt "$deadline" ] || die "the worker (pid $pid) does not stop"
            sleep 0.2
        done
    fi
}

if [ "${1:-}" = "--stop" ]; then
    if prefect_alive worker; then
        log "stopping worker (pid $(cat "$RUN/worker.pid"))"
        stop_worker
    fi
    for name in relay server; do
        if prefect_alive "$name"; then
            log "stopping $name (pid $(cat "$RUN/$name.pid"))"
            kill -TERM "$(cat "$RUN/$name.pid")"
        fi
    done
    deadline=$((SECONDS + 60))
    for name in relay server; do
        while prefect_alive "$name"; do
            [ "$SECONDS" -lt "$deadline" ] || die "$name (pid $(cat "$RUN/$name.pid")) does not stop"
            sleep 0.2
        done
        rm -f "$RUN/$name.pid"
    done
    exit 0
fi

start=$SECONDS
[ -x "$VENV/bin/prefect" ] || die "$VENV/bin/prefect is missing (run scripts/setup.sh)"
apt_install socat || die "socat is missing (apt-get install socat)"
install -d -m 700 "$PHOME" "$RUN" "$LOGS" "$PHOME/home" "$PHOME/shipyard-state" "$PHOME/work"
echo "$API_URL" >"$PHOME/api_url"
echo "$POOL" >"$PHOME/pool"
echo "$POLL" >"$PHOME/poll"

# the processes get this environment only (nothing of the caller's PREFECT_* settings)
run_env=(
    env -i
    "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "HOME=${HOME:-/root}" "LANG=C.UTF-8"
    "PREFECT_HOME=$PHOME/home"
    "PREFECT_API_URL=$API_URL"
    "PREFECT_SERVER_ANALYTICS_ENABLED=false"
    "PREFECT_UI_ENABLED=false"
    "PREFECT_API_DATABASE_CONNECTION_URL=sqlite+aiosqlite:///$PHOME/home/prefect.db"
    # SQLite has one writer: a busy machine needs a longer wait for the lock than the default 10 s
    "PREFECT_API_DATABASE_TIMEOUT=60"
    "PREFECT_API_DATABASE_CONNECTION_TIMEOUT=60"
    "PREFECT_WORKER_QUERY_SECONDS=$POLL"
    "PREFECT_WORKER_HEARTBEAT_SECONDS=$POLL"
    "SHIPYARD_STATE_DIR=$PHOME/shipyard-state"
)
[ -z "${SHIPYARD_TEST_IMAGE:-}" ] || run_env+=("SHIPYARD_TEST_IMAGE=$SHIPYARD_TEST_IMAGE")
[ -z "${SHIPYARD_CLUSTERS:-}" ] || run_env+=("SHIPYARD_CLUSTERS=$SHIPYARD_CLUSTERS")

spawn() { # spawn NAME CMD...: starts CMD in its own session, output to logs/NAME.out
    local name=$1
    shift
    log "starting $name"
    (cd "$PHOME/work" && exec "${run_env[@]}" setsid "$@" >"$LOGS/$name.out" 2>&1 </dev/null) &
    echo $! >"$RUN/$name.pid"
}

api_healthy() {
    "$VENV/bin/python" - "$API_URL" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as r:
        sys.exit(0 if r.read().strip() == b"true" else 1)
except Exception:
    sys.exit(1)
PY
}

# --- the server --------------------------------------------------------------------------------
if ! prefect_alive server; then
    if api_healthy; then
        die "something else answers on 127.0.0.1:$PORT (set SHIPYARD_PREFECT_PORT)"
    fi
    spawn server "$VENV/bin/prefect" server start --host 127.0.0.1 --port "$PORT"
fi
deadline=$((SECONDS + WAIT))
until api_healthy; do
    prefect_alive server || die "prefect server exited: $(tail -5 "$LOGS/server.out")"
    [ "$SECONDS" -lt "$deadline" ] || die "the API is not healthy after ${WAIT}s (see $LOGS/server.out)"
    sleep 0.5
done

# --- the relay for containers ------------------------------------------------------------------
# (the default bridge's gateway is the address of its host interface, docker0)
bridge=$(docker network inspect bridge -f '{{index .Options "com.docker.network.bridge.name"}}' 2>/dev/null || true)
gateway=
if [ -n "$bridge" ]; then
    gateway=$(ip -4 -o addr show dev "$bridge" 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
fi
if [ -n "$gateway" ] && ! prefect_alive relay; then
    spawn relay socat "TCP-LISTEN:$PORT,bind=$gateway,fork,reuseaddr" "TCP:127.0.0.1:$PORT"
fi
if [ -n "$gateway" ]; then
    bash "$REPO/scripts/build_prefect_image.sh"
fi

# --- block types, the pool, the worker ---------------------------------------------------------
stamp="$PHOME/registered-$(cksum <"$REPO/prefect_tasks/blocks.py" | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
    (cd "$PHOME/work" && "${run_env[@]}" "$VENV/bin/prefect" block register -m prefect_tasks >"$LOGS/register.out" 2>&1) ||
        die "prefect block register failed: $(tail -5 "$LOGS/register.out")"
    touch "$stamp"
fi
if ! (cd "$PHOME/work" && "${run_env[@]}" "$VENV/bin/prefect" work-pool inspect "$POOL" >/dev/null 2>&1); then
    log "creating the work pool $POOL"
    (cd "$PHOME/work" && "${run_env[@]}" "$VENV/bin/prefect" work-pool create -t shipyard "$POOL" >"$LOGS/pool.out" 2>&1) ||
        die "prefect work-pool create failed: $(tail -5 "$LOGS/pool.out")"
fi
# a worker that runs older code than the checkout's is started again (it finds its runs again)
code=$(cat "$REPO"/prefect_tasks/*.py "$REPO"/core/runner.py | cksum | cut -d' ' -f1)
if prefect_alive worker && [ "$(cat "$RUN/worker.code" 2>/dev/null)" != "$code" ]; then
    log "restarting the worker (prefect_tasks changed)"
    stop_worker
fi
if ! prefect_alive worker; then
    echo "$code" >"$RUN/worker.code"
    : >"$LOGS/worker.out"
    spawn worker "$VENV/bin/prefect" worker start -p "$POOL" -t shipyard --name "$WORKER_NAME"
fi
deadline=$((SECONDS + WAIT))
until grep -q "started" "$LOGS/worker.out"; do
    prefect_alive worker || die "prefect worker exited: $(tail -5 "$LOGS/worker.out")"
    [ "$SECONDS" -lt "$deadline" ] || die "the worker did not start in ${WAIT}s (see $LOGS/worker.out)"
    sleep 0.2
done
log "Prefect on $API_URL with a worker on pool $POOL ($((SECONDS - start))s)"
