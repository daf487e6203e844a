#!/usr/bin/env bash
# Starts the real services the Docker tests use, idempotently (safe to run again and again):
#   - a Docker engine (dockerd --iptables=false, API on /var/run/docker.sock, log /var/log/dockerd.log),
#     also listening on tcp://127.0.0.1:2376 with --tlsverify (certificates made by
#     scripts/make_docker_certs.sh in /var/lib/shipyard-docker-tls, root-only; a client's are in
#     its client/ folder, as DOCKER_CERT_PATH expects)
#   - a Docker registry on 127.0.0.1:5000 (Debian's docker-registry, log /var/log/docker-registry.log)
#   - a second registry on 127.0.0.1:5001 that wants a login (htpasswd; user `shipyard`, the password
#     in /var/lib/shipyard-registry-auth/password, root-only; log /var/log/docker-registry-auth.log)
#   - the test images (scripts/build_test_images.sh)
# No registry on the internet is reachable: images are built locally, never pulled.
# Needs root (Debian 12). Works without systemd: daemons are started in the background.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REGISTRY_ADDR="${SHIPYARD_REGISTRY_ADDR:-127.0.0.1:5000}"
REGISTRY_DIR="${SHIPYARD_REGISTRY_DIR:-/var/lib/shipyard-registry}"
DOCKERD_LOG=/var/log/dockerd.log
REGISTRY_LOG=/var/log/docker-registry.log
TLS_DIR="${SHIPYARD_DOCKER_TLS_DIR:-/var/lib/shipyard-docker-tls}"
TLS_ADDR=127.0.0.1:2376
AUTH_REGISTRY_ADDR=127.0.0.1:5001
AUTH_REGISTRY_DIR="${SHIPYARD_REGISTRY_AUTH_DIR:-/var/lib/shipyard-registry-auth}"
AUTH_REGISTRY_LOG=/var/log/docker-registry-auth.log

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root

apt_install docker.io busybox-static docker-registry procps openssl apache2-utils

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

bash "$HERE/make_docker_certs.sh" "$TLS_DIR"

docker_up() { docker info >/dev/null 2>&1; }
# the TCP listener answers a client that shows the test client certificate
tls_up() {
    docker -H "tcp://$TLS_ADDR" --tlsverify --tlscacert "$TLS_DIR/client/ca.pem" \
        --tlscert "$TLS_DIR/client/cert.pem" --tlskey "$TLS_DIR/client/key.pem" info >/dev/null 2>&1
}

start_dockerd() {
    # containerd is started by dockerd itself when it is not running.
    log "starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd --iptables=false -H unix:///var/run/docker.sock -H "tcp://$TLS_ADDR" \
        --tlsverify --tlscacert "$TLS_DIR/server/ca.pem" --tlscert "$TLS_DIR/server/cert.pem" \
        --tlskey "$TLS_DIR/server/key.pem" >>"$DOCKERD_LOG" 2>&1 </dev/null &
}

# An engine whose default bridge (docker0) has vanished cannot start containers on the default
# network; restarting dockerd recreates it (and starts the TLS listener of an engine without it).
if docker_up && { [ ! -e /sys/class/net/docker0 ] || [ "$daemon_json_changed" = 1 ] || ! tls_up; }; then
    log "the docker0 bridge is missing, daemon.json changed or no TLS listener on $TLS_ADDR: restarting dockerd"
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
for _ in $(seq 1 20); do
    tls_up && break
    sleep 0.5
done
if tls_up; then
    log "docker engine over TLS: tcp://$TLS_ADDR (client certificates: $TLS_DIR/client)"
else
    # (a dockerd run by systemd gets its listeners from its unit: add -H tcp://$TLS_ADDR and the
    # --tls* options of start_dockerd there)
    log "note: no TLS listener on tcp://$TLS_ADDR (dockerd not started by this script?)"
fi

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

# --- registry with authentication -------------------------------------------------------------
# The same registry program with its own storage, on another loopback port, wanting a login
# (htpasswd with bcrypt; the password is made once, kept root-only, and never on a command line).
AUTH_HOST="${AUTH_REGISTRY_ADDR%:*}"
AUTH_PORT="${AUTH_REGISTRY_ADDR##*:}"
auth_registry_up() { [ "$(http_status "$AUTH_HOST" "$AUTH_PORT" /v2/)" = 401 ]; }

if ! auth_registry_up; then
    install -d -m 700 "$AUTH_REGISTRY_DIR" "$AUTH_REGISTRY_DIR/data"
    if [ ! -s "$AUTH_REGISTRY_DIR/password" ]; then
        (umask 077; openssl rand -hex 16 >"$AUTH_REGISTRY_DIR/password")
    fi
    (umask 077; htpasswd -niB shipyard <"$AUTH_REGISTRY_DIR/password" >"$AUTH_REGISTRY_DIR/htpasswd")
    (umask 077; cat >"$AUTH_REGISTRY_DIR/config.yml" <<EOF
version: 0.1
log:
  level: warn
  fields:
    service: registry-auth
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: $AUTH_REGISTRY_DIR/data
  delete:
    enabled: true
auth:
  htpasswd:
    realm: shipyard-test
    path: $AUTH_REGISTRY_DIR/htpasswd
http:
  addr: $AUTH_REGISTRY_ADDR
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    )
    log "starting docker-registry with authentication on $AUTH_REGISTRY_ADDR (log: $AUTH_REGISTRY_LOG)"
    nohup docker-registry serve "$AUTH_REGISTRY_DIR/config.yml" >>"$AUTH_REGISTRY_LOG" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        auth_registry_up && break
        sleep 0.5
    done
    if ! auth_registry_up; then
        log "the registry with authentication did not come up; last lines of $AUTH_REGISTRY_LOG:"
        tail -n 30 "$AUTH_REGISTRY_LOG" >&2 || true
        exit 1
    fi
fi
log "registry with authentication: http://$AUTH_REGISTRY_ADDR (user shipyard, password in $AUTH_REGISTRY_DIR/password)"

# --- test images ------------------------------------------------------------------------------
bash "$HERE/build_test_images.sh"
