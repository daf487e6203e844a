#!/usr/bin/env bash
# Makes the TLS material of the test engine's TCP listener (tcp://127.0.0.1:2376, --tlsverify),
# with openssl, idempotently; everything is readable by root only:
#   DIR/ca-key.pem                the test CA's key (kept to sign again; never leaves DIR)
#   DIR/server/{ca,cert,key}.pem  dockerd's --tlscacert/--tlscert/--tlskey (127.0.0.1, localhost)
#   DIR/client/{ca,cert,key}.pem  a client's certificate, laid out as DOCKER_CERT_PATH expects
# Usage: make_docker_certs.sh [DIR]   (default $SHIPYARD_DOCKER_TLS_DIR or /var/lib/shipyard-docker-tls)
# Certificates that expire within 30 days, or whose CA changed, are made again.
set -euo pipefail

DIR="${1:-${SHIPYARD_DOCKER_TLS_DIR:-/var/lib/shipyard-docker-tls}}"
DAYS=825

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

valid() { # $1: certificate; true if it exists, is signed by DIR's CA and lasts 30 more days
    [ -s "$1" ] && openssl x509 -checkend 2592000 -noout -in "$1" >/dev/null 2>&1 \
        && openssl verify -CAfile "$DIR/ca.pem" "$1" >/dev/null 2>&1
}

umask 077
install -d -m 700 "$DIR" "$DIR/server" "$DIR/client"

if ! valid "$DIR/ca.pem" || [ ! -s "$DIR/ca-key.pem" ]; then
    log "making the test CA in $DIR"
    openssl genrsa -out "$DIR/ca-key.pem" 3072 2>/dev/null
    openssl req -new -x509 -sha256 -days "$DAYS" -key "$DIR/ca-key.pem" -out "$DIR/ca.pem" \
        -subj "/CN=shipyard test CA"
    rm -f "$DIR/server/cert.pem" "$DIR/client/cert.pem"
fi

sign() { # $1: out dir, $2: subject CN, $3: extensions
    local ext
    ext="$(mktemp)"
    printf '%s\n' "$3" >"$ext"
    openssl genrsa -out "$1/key.pem" 3072 2>/dev/null
    openssl req -new -sha256 -key "$1/key.pem" -subj "/CN=$2" -out "$1/req.csr"
    openssl x509 -req -sha256 -days "$DAYS" -in "$1/req.csr" -CA "$DIR/ca.pem" \
        -CAkey "$DIR/ca-key.pem" -CAcreateserial -CAserial "$DIR/ca.srl" \
        -extfile "$ext" -out "$1/cert.pem" 2>/dev/null
    rm -f "$1/req.csr" "$ext"
    cp "$DIR/ca.pem" "$1/ca.pem"
}

if ! valid "$DIR/server/cert.pem"; then
    log "making dockerd's certificate (127.0.0.1, localhost)"
    sign "$DIR/server" "127.0.0.1" \
        "subjectAltName = IP:127.0.0.1,DNS:localhost
extendedKeyUsage = serverAuth"
fi
if ! valid "$DIR/client/cert.pem"; then
    log "making a client certificate"
    sign "$DIR/client" "shipyard-test-client" "extendedKeyUsage = clientAuth"
fi
chmod 600 "$DIR"/*.pem "$DIR"/server/*.pem "$DIR"/client/*.pem
