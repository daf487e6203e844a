#!/usr/bin/env bash
# Starts the real services the Docker tests use, idempotently (safe to run again and again):
#   - a Docker engine (dockerd --iptables=false, API on /var/run/docker.sock, log /var/log/dockerd.log)
#   - a Docker registry on 127.0.0.1:5000 (Debian's docker-registry, log /var/log/docker-registry.log)
#   - the test images (scripts/build_test_images.sh)
# No registry on the internet is reachable: images are built locally, never pulled.
# Needs root (Debian 12). Works without systemd: daemons are started in the background.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REGISTRY_ADDR="${SHIPYARD_REGISTRY_ADDR:-127.0.0.1:5000}"
REGISTRY_DIR="${SHIPYARD_REGISTRY_DIR:-/var/lib/shipyard-registry}"
DOCKERD_LOG=/var/log/dockerd.log
REGISTRY_LOG=/var/log/docker-registry.log

log() { echo "[start_docker] $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root"
    exit 1
fi

# --- packages ---------------------------------------------------------------------------------
missing=()
for pkg in docker.io busybox-static docker-registry procps; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- dockerd ----------------------------------------------------------------------------------
# Registries on loopback are insecure (plain http) by default in dockerd; say it explicitly so
# that a registry address other than 127.0.0.1 still works.
mkdir -p /etc/docker
# Every multi-replica app gets a network of its own: Docker's default address pools hold only ~30
# networks, so give the engine 256 /24 networks from a range of its own.
DAEMON_JSON=$(printf '{\n  "insecure-registries": ["%s"],\n  "default-address-pools": [{"base": "10.210.0.0/16", "size": 24}]\n}\n' "$REGISTRY_ADDR")
OLD_DAEMON_JSON=$(printf '{\n  "insecure-registries": ["%s"]\n}\n' "$REGISTRY_ADDR")
daemon_json_changed=0
if [ ! -s /etc/docker/daemon.json ] || [ "$(cat /etc/docker/daemon.json)" = "$OLD_DAEMON_JSON" ]; then
    if [ "$(cat /etc/docker/daemon.json 2>/dev/null)" != "$DAEMON_JSON" ]; then
        printf '%s\n' "$DAEMON_JSON" >/etc/docker/daemon.json
        daemon_json_changed=1
    fi
elif [ "$(cat /etc/docker/daemon.json)" != "$DAEMON_JSON" ]; then
    log "note: /etc/docker/daemon.json is not shipyard's (left unchanged); apps need insecure-registries $REGISTRY_ADDR and enough default-address-pools"
fi

docker_up() { docker info >/dev/null 2>&1; }

start_dockerd() {
    # containerd is started by dockerd itself when it is not running.
    log "starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd --iptables=false >>"$DOCKERD_LOG" 2>&1 </dev/null &
}

# An engine whose default bridge (docker0) has vanished cannot start containers on the default
# network; restarting dockerd recreates it.
if docker_up && { [ ! -e /sys/class/net/docker0 ] || [ "$daemon_json_changed" = 1 ]; }; then
    log "the docker0 bridge is missing or daemon.json changed: restarting dockerd"
    if command -v systemctl >/dev/null && systemctl is-active --quiet docker 2>/dev/null; then
        systemctl restart docker
    else
        pid="$(pgrep -o -x dockerd || true)"
        if [ -n "$pid" ]; then
            kill "$pid"
            for _ in $(seq 1 120); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.5
            done
        fi
    fi
fi

if ! docker_up; then
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        start_dockerd
    fi
    for _ in $(seq 1 120); do
        docker_up && break
        sleep 0.5
    done
    if ! docker_up; then
        log "dockerd did not come up; last lines of $DOCKERD_LOG:"
        tail -n 30 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
fi
log "docker engine: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"

# --- registry ---------------------------------------------------------------------------------
# HTTP status of GET http://$1:$2$3 (pure bash: no curl or python needed), empty if no answer.
http_status() {
    ( exec 3<>"/dev/tcp/$1/$2" || exit 1
      printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
      IFS=' ' read -r -t 3 _ code _ <&3 || exit 1
      echo "$code" ) 2>/dev/null || true
}
REGISTRY_HOST="${REGISTRY_ADDR%:*}"
REGISTRY_PORT="${REGISTRY_ADDR##*:}"
registry_up() { [ "$(http_status "$REGISTRY_HOST" "$REGISTRY_PORT" /v2/)" = 200 ]; }

if ! registry_up; then
    # On a machine with systemd, installing docker-registry starts Debian's service with its own
    # config (all interfaces, htpasswd auth): it holds the port, so it is stopped first.
    if [ -n "$(http_status "$REGISTRY_HOST" "$REGISTRY_PORT" /v2/)" ] && command -v systemctl >/dev/null \
        && systemctl is-active --quiet docker-registry 2>/dev/null; then
        log "stopping Debian's docker-registry service (it wants authentication)"
        systemctl stop docker-registry || true
    fi
    # Debian's /etc/docker/registry/config.yml listens on every interface and wants an htpasswd
    # file; the tests need an open registry on loopback only, so it gets a config of its own.
    mkdir -p "$REGISTRY_DIR/data"
    cat >"$REGISTRY_DIR/config.yml" <<EOF
version: 0.1
log:
  level: warn
  fields:
    service: registry
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: $REGISTRY_DIR/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    log "starting docker-registry on $REGISTRY_ADDR (log: $REGISTRY_LOG)"
    nohup docker-registry serve "$REGISTRY_DIR/config.yml" >>"$REGISTRY_LOG" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        registry_up && break
        sleep 0.5
    done
    if ! registry_up; then
        log "the registry did not come up; last lines of $REGISTRY_LOG:"
        tail -n 30 "$REGISTRY_LOG" >&2 || true
        exit 1
    fi
fi
log "registry: http://$REGISTRY_ADDR"

# --- test images ------------------------------------------------------------------------------
bash "$HERE/build_test_images.sh"
