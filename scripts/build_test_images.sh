#!/usr/bin/env bash
# Builds the images the Docker tests use, locally (nothing is pulled), idempotently:
#   shipyard-test/busybox:latest   FROM scratch + Debian's static busybox (sh, sleep, nslookup...)
# An image that already exists is left as it is (remove it to rebuild).
set -euo pipefail

BUSYBOX_IMAGE="${SHIPYARD_TEST_IMAGE:-shipyard-test/busybox:latest}"

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if docker image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1; then
    log "$BUSYBOX_IMAGE exists"
    exit 0
fi

# busybox-static installs a statically linked /bin/busybox (it replaces the dynamic one).
BUSYBOX_BIN=/bin/busybox
if [ ! -x "$BUSYBOX_BIN" ]; then
    log "no $BUSYBOX_BIN (apt-get install busybox-static)"
    exit 1
fi

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp "$BUSYBOX_BIN" "$ctx/busybox"
cat >"$ctx/Dockerfile" <<'EOF'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/busybox", "mkdir", "-p", "/tmp", "/etc", "/root", "/usr/bin", "/sbin", "/usr/sbin"]
ENV PATH=/bin:/usr/bin:/sbin:/usr/sbin
CMD ["/bin/sh"]
EOF
log "building $BUSYBOX_IMAGE"
docker build -q -t "$BUSYBOX_IMAGE" "$ctx" >/dev/null
log "built $BUSYBOX_IMAGE"
