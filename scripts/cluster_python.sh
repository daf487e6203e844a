#!/usr/bin/env bash
# The Slurm cluster's own Python with Prefect, as a site provides one for flow runs on its nodes:
# a venv of the system python3 in $SHIPYARD_CLUSTER_PYTHON (default /opt/shipyard-cluster-python),
# readable by every cluster user (hpcuser cannot run the project's .venv, which may live under
# /root), with the Prefect version of the project's .venv. The Prefect deployment test of a flow
# run on the cluster behind the SSH login node runs it. Idempotent. Needs root (Debian 12).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=${SHIPYARD_CLUSTER_PYTHON:-/opt/shipyard-cluster-python}
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

want=$("$REPO/.venv/bin/python" -c 'import prefect; print(prefect.__version__)')
have=$("$DEST/bin/python" -c 'import prefect; print(prefect.__version__)' 2>/dev/null || true)
if [ "$have" = "$want" ]; then
    log "$DEST has Prefect $want"
    exit 0
fi
start=$SECONDS
[ -x "$DEST/bin/python" ] || /usr/bin/python3 -m venv "$DEST"
out=$(mktemp)
if ! "$DEST/bin/python" -m pip install -q --disable-pip-version-check "prefect==$want" >"$out" 2>&1; then
    tail -20 "$out" >&2
    rm -f "$out"
    log "ERROR: Prefect $want did not install in $DEST"
    exit 1
fi
rm -f "$out"
chmod -R a+rX "$DEST"
log "$DEST has Prefect $want ($((SECONDS - start))s)"
