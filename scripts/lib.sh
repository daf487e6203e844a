# Functions the start scripts share. Source it: `. "$(dirname "$0")/lib.sh"` (after setting
# LOG_TAG, the name in front of every line; default: the script's name).
# shellcheck shell=bash

LOG_TAG=${LOG_TAG:-$(basename "$0" .sh)}

log() { echo "[$LOG_TAG] $*" >&2; }

die() {
    log "ERROR: $*"
    exit 1
}

require_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

# wait_for SECONDS DESCRIPTION COMMAND...: runs COMMAND until it succeeds (true, logging
# "DESCRIPTION: ok") or SECONDS pass (false).
wait_for() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
    log "$what: ok"
}

# pid_alive PIDFILE PATTERN: the pid file names a live process whose command line contains
# PATTERN (a fixed string), so a pid reused by another process does not count.
pid_alive() {
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -Fq -- "$2"
}

# write_if_changed FILE MODE: stdin to FILE (mode MODE) when the content differs; prints
# "changed" if it did.
write_if_changed() {
    local file=$1 mode=$2 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [ -f "$file" ] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
        chmod "$mode" "$file"
        return 0
    fi
    mv "$tmp" "$file"
    chmod "$mode" "$file"
    echo changed
}

# apt_install [--with-recommends] PACKAGE...: installs the Debian packages not installed yet,
# without starting their services (each script starts what it needs its own way).
apt_install() {
    local missing=() pkg had_policy=0 recommends=--no-install-recommends
    if [ "${1:-}" = --with-recommends ]; then
        recommends=--install-recommends
        shift
    fi
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    [ -e /usr/sbin/policy-rc.d ] && had_policy=1
    if [ "$had_policy" = 0 ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
    fi
    apt-get update -qq || log "apt-get update failed; trying the package lists already here"
    local status=0
    apt-get install -y -qq "$recommends" "${missing[@]}" >/dev/null || status=$?
    [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
    return $status
}
