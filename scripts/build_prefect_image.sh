#!/usr/bin/env bash
# Builds the image the Prefect worker's Docker tests run flow runs in, locally (nothing is pulled
# and nothing is downloaded), idempotently:
#   shipyard-test/prefect:<prefect version>   this host's Python interpreter (the one .venv is made
#       from, at the same path), its standard library, and the installed distributions Prefect
#       needs (copied from .venv), plus the shared libraries they link and a static busybox /bin/sh
# `python` on the image's PATH is that interpreter, so the worker's default command
# (`python -m prefect.engine`) runs as it is. An image that already exists is left as it is
# (remove it, or set SHIPYARD_REBUILD=1, to rebuild).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SHIPYARD_VENV:-$REPO/.venv}
VERSION=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("prefect"))')
IMAGE=${SHIPYARD_PREFECT_IMAGE:-shipyard-test/prefect:$VERSION}

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ -z "${SHIPYARD_REBUILD:-}" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE exists"
    exit 0
fi
[ -x /bin/busybox ] || { log "no /bin/busybox (apt-get install busybox-static)"; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
log "collecting the interpreter and Prefect's distributions"
"$VENV/bin/python" "$REPO/scripts/prefect_image_rootfs.py" "$root"
install -d -m 1777 "$root/tmp"
install -d "$root/bin" "$root/etc" "$root/root"
cp /bin/busybox "$root/bin/busybox"
for tool in sh cat ls env sleep; do ln -sf busybox "$root/bin/$tool"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

log "importing $IMAGE"
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/bin' \
    --change 'ENV HOME=/root' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python"]' \
    - "$IMAGE" >/dev/null
docker run --rm --network none "$IMAGE" python -c 'import prefect.engine' ||
    { log "the image cannot import prefect.engine"; exit 1; }
log "built $IMAGE"
