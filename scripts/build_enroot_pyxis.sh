#!/usr/bin/env bash
# Builds NVIDIA enroot 4.1.2 (/opt/enroot-4.1.2) and the Pyxis 0.24.0 SPANK plugin
# (/opt/pyxis-0.24.0, against Slurm 26.05.3's headers) from ../shared/vendor, once per machine
# (a finished build leaves .shipyard-built in each prefix; a second run only checks them). For
# the test rig's 26.05 cluster (scripts/start_slurm26.sh loads the plugin); Shipyard itself
# never installs them. About 10 s on 2 cores.
#
# enroot's sources come without their git submodules; Debian's packages stand in: makeself
# (the pinned 2.4.5), musl-tools (the helpers are static-pie against musl, as upstream's
# release builds them) and linux-libc-dev's headers.
set -euo pipefail

ENROOT_VERSION=4.1.2
PYXIS_VERSION=0.24.0
SLURM_PREFIX=/opt/slurm-26.05.3
ENROOT=/opt/enroot-$ENROOT_VERSION
PYXIS=/opt/pyxis-$PYXIS_VERSION
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
require_root

if [ -f "$ENROOT/.shipyard-built" ] && [ -f "$PYXIS/.shipyard-built" ]; then
    log "enroot $ENROOT_VERSION and Pyxis $PYXIS_VERSION: already built"
    exit 0
fi
VENDOR=
for dir in ${SHIPYARD_VENDOR:-} "$ROOT/../shared/vendor" /work/shared/vendor; do
    if [ -f "$dir/enroot-$ENROOT_VERSION.tar.gz" ]; then
        VENDOR=$dir
        break
    fi
done
[ -n "$VENDOR" ] || die "no enroot-$ENROOT_VERSION.tar.gz in \$SHIPYARD_VENDOR or ../shared/vendor"
[ -f "$SLURM_PREFIX/include/slurm/spank.h" ] || die "no Slurm headers in $SLURM_PREFIX (build_slurm.sh)"

apt_install build-essential libcap2-bin makeself musl-tools libbsd-dev squashfs-tools parallel jq zstd pigz \
    bsdmainutils squashfuse linux-libc-dev
BUILD=$(mktemp -d /tmp/enroot-build.XXXXXX)
trap 'rm -rf "$BUILD"' EXIT
start=$SECONDS

log "building enroot $ENROOT_VERSION"
tar -xzf "$VENDOR/enroot-$ENROOT_VERSION.tar.gz" -C "$BUILD"
cd "$BUILD"/enroot-*
install -m 755 /usr/bin/makeself deps/makeself/makeself.sh
# the linux-headers submodule: the system's own headers
printf '%s\n' 'install:' \
    '	install -d $(prefix)/include' \
    '	ln -sfn /usr/include/linux $(prefix)/include/linux' \
    '	ln -sfn /usr/include/asm-generic $(prefix)/include/asm-generic' \
    '	ln -sfn /usr/include/x86_64-linux-gnu/asm $(prefix)/include/asm' >deps/linux-headers/Makefile
# the musl submodule: Debian's musl-gcc, with static-pie in its specs (what deps/musl.patch does)
musl=$PWD/deps/dist/musl
lib=/usr/lib/x86_64-linux-musl
mkdir -p "$musl/bin"
sed -e "s#^%{!shared: $lib/Scrt1.o}#%{static-pie: $lib/rcrt1.o} %{!static-pie: %{!shared: $lib/Scrt1.o}}#" \
    -e 's#^-dynamic-linker \(/lib/ld-musl-x86_64.so.1\)#%{static-pie:-no-dynamic-linker -static -pie} %{!static-pie:-dynamic-linker \1}#' \
    "$lib/musl-gcc.specs" >"$musl/musl-gcc.specs"
printf '#!/bin/sh\nexec "${REALGCC:-x86_64-linux-gnu-gcc}" "$@" -specs "%s/musl-gcc.specs"\n' \
    "$musl" >"$musl/bin/musl-gcc"
chmod 755 "$musl/bin/musl-gcc"
touch deps/musl/.stamp
make prefix="$ENROOT" >"$BUILD/enroot.log" 2>&1 || die "enroot: make failed: $(tail -5 "$BUILD/enroot.log")"
make install prefix="$ENROOT" >>"$BUILD/enroot.log" 2>&1 || die "enroot: install failed"
# (as upstream's packages do: unprivileged users unpack image layers through these two)
make setcap prefix="$ENROOT" >>"$BUILD/enroot.log" 2>&1 || die "enroot: setcap failed"
# per-user paths without XDG_RUNTIME_DIR (slurmstepd sets none; /run/enroot is root's), and
# plain HTTP for the rig's loopback registry
cat >"$ENROOT/etc/enroot/enroot.conf.d/50-shipyard.conf" <<'EOF'
# Written by shipyard scripts/build_enroot_pyxis.sh
ENROOT_RUNTIME_PATH /tmp/enroot-runtime-$(id -u)
ENROOT_CACHE_PATH   /tmp/enroot-cache-$(id -u)
ENROOT_DATA_PATH    /tmp/enroot-data-$(id -u)
ENROOT_ALLOW_HTTP   yes
EOF
# Pyxis runs "enroot" from the job's PATH, and enroot its helpers from PATH
for f in "$ENROOT"/bin/*; do ln -sfn "$f" "/usr/local/bin/$(basename "$f")"; done
touch "$ENROOT/.shipyard-built"

log "building Pyxis $PYXIS_VERSION"
tar -xzf "$VENDOR/pyxis-$PYXIS_VERSION.tar.gz" -C "$BUILD"
cd "$BUILD"/pyxis-*
# (CFLAGS from the environment: on the command line it would replace the Makefile's own)
CFLAGS="-I$SLURM_PREFIX/include" make -j2 >"$BUILD/pyxis.log" 2>&1 ||
    die "pyxis: make failed: $(tail -5 "$BUILD/pyxis.log")"
make install prefix="$PYXIS" >>"$BUILD/pyxis.log" 2>&1 || die "pyxis: install failed"
touch "$PYXIS/.shipyard-built"
log "enroot in $ENROOT, Pyxis in $PYXIS/lib/slurm/spank_pyxis.so ($((SECONDS - start)) s)"
