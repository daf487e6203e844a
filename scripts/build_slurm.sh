#!/usr/bin/env bash
# Builds a Slurm release from ../shared/vendor (or $SHIPYARD_VENDOR) into /opt/slurm-<version>,
# once per machine: a build that finished leaves /opt/slurm-<version>/.shipyard-built, and a
# second run only checks it. For the test rig's second cluster (scripts/start_slurm26.sh), beside
# Debian's 22.05; Shipyard itself never installs Slurm.
#
#   scripts/build_slurm.sh             # 26.05.3 (about 2 min on 2 cores)
#   scripts/build_slurm.sh 26.05.3
set -euo pipefail

VERSION=${1:-26.05.3}
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=/opt/slurm-$VERSION
DONE=$PREFIX/.shipyard-built
# the ports of this version's daemons (22.05 keeps Slurm's defaults, 6817-6820)
PORTS="--with-slurmctld-port=26817 --with-slurmd-port=26818 --with-slurmdbd-port=26819"

if [ -f "$DONE" ]; then
    log "Slurm $VERSION: already built in $PREFIX"
    exit 0
fi
# the vendored sources: $SHIPYARD_VENDOR, else ../shared/vendor beside the clone or the workplace's
TARBALL=
for dir in ${SHIPYARD_VENDOR:-} "$ROOT/../shared/vendor" /work/shared/vendor; do
    if [ -f "$dir/slurm-$VERSION.tar.xz" ]; then
        TARBALL=$dir/slurm-$VERSION.tar.xz
        break
    fi
done
[ -n "$TARBALL" ] ||
    die "no slurm-$VERSION.tar.xz in \$SHIPYARD_VENDOR, $ROOT/../shared/vendor or /work/shared/vendor"

apt_install build-essential libmunge-dev libjson-c-dev libjwt-dev libhttp-parser-dev \
    libyaml-dev libmariadb-dev munge
BUILD=$(mktemp -d /tmp/slurm-build.XXXXXX)
trap 'rm -rf "$BUILD"' EXIT
log "building Slurm $VERSION in $BUILD (prefix $PREFIX)"
tar -xJf "$TARBALL" -C "$BUILD"
cd "$BUILD"/slurm-*
start=$SECONDS
# shellcheck disable=SC2086 # (PORTS: several words)
./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --with-jwt --with-json --with-yaml \
    --enable-multiple-slurmd --disable-static $PORTS --with-slurmrestd-port=26820 \
    >"$BUILD/configure.log" 2>&1 || die "configure failed: $(tail -5 "$BUILD/configure.log")"
grep -q "whether to compile slurmrestd... yes" "$BUILD/configure.log" ||
    die "configure: slurmrestd would not be built (libjwt, json-c, http-parser, yaml?)"
make -j"$(nproc)" >"$BUILD/make.log" 2>&1 || die "make failed: $(tail -20 "$BUILD/make.log")"
make install >"$BUILD/install.log" 2>&1 || die "make install failed: $(tail -5 "$BUILD/install.log")"
mkdir -p "$PREFIX/etc"
touch "$DONE"
log "Slurm $VERSION built in $((SECONDS - start)) s: $PREFIX"
