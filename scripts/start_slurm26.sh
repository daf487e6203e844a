#!/usr/bin/env bash
# Starts the test rig's second Slurm cluster, a current release (26.05.3, built once by
# scripts/build_slurm.sh into /opt/slurm-26.05.3) beside Debian's 22.05 (scripts/start_slurm.sh,
# whose munged and MariaDB it shares): cluster "shipyard26", three nodes s26n1..s26n3 (one
# `slurmd -N` each), slurmctld, slurmdbd with accounting and slurmrestd with JWT authentication
# (127.0.0.1:26820), all on their own ports (26817-26820), state, logs and pid files.
#
# Idempotent, like start_slurm.sh. Use it with the release's commands and configuration:
#   export PATH=/opt/slurm-26.05.3/bin:$PATH SLURM_CONF=/opt/slurm-26.05.3/etc/slurm.conf
set -euo pipefail

VERSION=26.05.3
PREFIX=/opt/slurm-$VERSION
CLUSTER=shipyard26
NODES=(s26n1 s26n2 s26n3)
DB_NAME=slurm26_acct_db
DB_USER=slurm
DB_PASS=shipyard-slurm
STATE=/var/spool/slurm26
LOGS=/var/log/slurm26
RUN=/run/slurm26
WAIT=${SHIPYARD_SLURM_WAIT:-90}
HOST=$(hostname)
HERE=$(dirname "${BASH_SOURCE[0]}")

# shellcheck source=scripts/lib.sh
. "$HERE/lib.sh"
require_root

bash "$HERE/build_slurm.sh" "$VERSION"
# munge and MariaDB (and the 22.05 cluster) first: they are shared
bash "$HERE/start_slurm.sh"
export PATH="$PREFIX/bin:$PREFIX/sbin:$PATH:/usr/sbin:/sbin"
export SLURM_CONF=$PREFIX/etc/slurm.conf
alive() { pid_alive "$1" "$PREFIX/sbin/$2"; } # alive PIDFILE DAEMON

mysql -uroot <<SQL
CREATE DATABASE IF NOT EXISTS ${DB_NAME};
GRANT ALL PRIVILEGES ON ${DB_NAME}.* TO '${DB_USER}'@'localhost';
FLUSH PRIVILEGES;
SQL

mkdir -p "$PREFIX/etc" "$STATE/ctld" "$LOGS" "$RUN"
for n in "${NODES[@]}"; do mkdir -p "$STATE/d/$n"; done
JWT_KEY=$STATE/ctld/jwt_hs256.key
[ -s "$JWT_KEY" ] || dd if=/dev/urandom of="$JWT_KEY" bs=32 count=1 status=none
chmod 600 "$JWT_KEY"

dbd_changed=$(write_if_changed "$PREFIX/etc/slurmdbd.conf" 600 <<EOF
# Written by shipyard scripts/start_slurm26.sh
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=${JWT_KEY}
DbdHost=localhost
DbdPort=26819
SlurmUser=root
PidFile=${RUN}/slurmdbd.pid
LogFile=${LOGS}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=${DB_USER}
StoragePass=${DB_PASS}
StorageLoc=${DB_NAME}
EOF
)

conf_changed=$(write_if_changed "$SLURM_CONF" 644 <<EOF
# Written by shipyard scripts/start_slurm26.sh: three nodes on one host (slurmd -N s26nX),
# beside the 22.05 cluster (see start_slurm.sh for the reasons of the settings they share).
ClusterName=${CLUSTER}
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmctldPort=26817
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=${JWT_KEY}
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/d/%n
SlurmctldPidFile=${RUN}/slurmctld.pid
SlurmdPidFile=${RUN}/slurmd-%n.pid
SlurmctldLogFile=${LOGS}/slurmctld.log
SlurmdLogFile=${LOGS}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_resolution=1,sched_interval=1
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=26819
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
MaxJobCount=100000
NodeName=s26n[1-3] NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=27001-27003 CPUs=2 RealMemory=4000 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=s26n[1-3] Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=s26n[1-3] MaxTime=INFINITE State=UP PriorityTier=10
EOF
)

# Slurm's OCI containers (srun --container, Shipyard's container_runtime=oci): runc, rootless,
# its state under /tmp (no systemd session makes /run/user/<uid> for the job's user); the
# documentation's recommended "run" form (no polling)
apt_install runc
# Pyxis (srun --container-image, container_runtime=pyxis) over enroot, built once per machine
bash "$HERE/build_enroot_pyxis.sh"
plug_changed=$(write_if_changed "$PREFIX/etc/plugstack.conf" 644 <<EOF
# Written by shipyard scripts/start_slurm26.sh
required /opt/pyxis-0.24.0/lib/slurm/spank_pyxis.so
EOF
)
runc="/usr/sbin/runc --rootless=true --root=/tmp/shipyard-runc-%U"
oci_changed=$(write_if_changed "$PREFIX/etc/oci.conf" 644 <<EOF
# Written by shipyard scripts/start_slurm26.sh
EnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="
RunTimeEnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="
RunTimeQuery="$runc state %n.%u.%j.%s.%t"
RunTimeKill="$runc kill -a %n.%u.%j.%s.%t"
RunTimeDelete="$runc delete --force %n.%u.%j.%s.%t"
RunTimeRun="$runc run %n.%u.%j.%s.%t -b %b"
EOF
)

if ! grep -qE '^127\.0\.0\.1[[:space:]].*\bs26n1\b' /etc/hosts; then
    echo "127.0.0.1 s26n1 s26n2 s26n3  # shipyard start_slurm26.sh" >>/etc/hosts
fi

stop() { # stop PIDFILE DAEMON
    if alive "$1" "$2"; then
        kill "$(cat "$1")"
        wait_for 30 "$2 stopped" bash -c "! kill -0 \$(cat $1) 2>/dev/null"
    fi
}

dbd_ok() { alive "$RUN/slurmdbd.pid" slurmdbd && sacctmgr -n -P show cluster format=cluster; }
[ -z "$dbd_changed" ] || stop "$RUN/slurmdbd.pid" slurmdbd
if ! alive "$RUN/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd $VERSION"
    "$PREFIX/sbin/slurmdbd" </dev/null >/dev/null 2>&1
fi
wait_for 60 "slurmdbd $VERSION" dbd_ok || die "slurmdbd does not answer (see $LOGS/slurmdbd.log)"
if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    log "registering cluster $CLUSTER"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

if [ -n "$conf_changed$oci_changed$plug_changed" ]; then
    for n in "${NODES[@]}"; do stop "$RUN/slurmd-$n.pid" slurmd; done
    stop "$RUN/slurmctld.pid" slurmctld
fi
if ! alive "$RUN/slurmctld.pid" slurmctld; then
    log "starting slurmctld $VERSION"
    "$PREFIX/sbin/slurmctld" </dev/null >/dev/null 2>&1
fi
wait_for 60 "slurmctld $VERSION" bash -c 'scontrol ping | grep -q "is UP"' ||
    die "slurmctld does not answer (see $LOGS/slurmctld.log)"
for n in "${NODES[@]}"; do
    if ! alive "$RUN/slurmd-$n.pid" slurmd; then
        log "starting slurmd -N $n"
        "$PREFIX/sbin/slurmd" -N "$n" </dev/null >/dev/null 2>&1
    fi
done

nodes_ready() {
    local states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    [ "$(echo "$states" | grep -cE ' (idle|allocated|mixed|completing)$')" -ge "${#NODES[@]}" ]
}
wait_for "$WAIT" "nodes ${NODES[*]}" nodes_ready || {
    scontrol update NodeName="s26n[1-3]" State=RESUME >/dev/null 2>&1 || true
    wait_for 30 "nodes resumed" nodes_ready || die "nodes not ready: $(sinfo -N 2>&1 | tail -5)"
}
# slurmrestd (it refuses to run as root or SlurmUser; SLURM_JWT=daemon: it checks the tokens)
REST_ADDR=127.0.0.1:26820
id slurmrest >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin slurmrest
rest_ok() {
    local token
    token=$(scontrol token username=root lifespan=60 | sed -n 's/^SLURM_JWT=//p')
    curl -sf -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $token" \
        "http://$REST_ADDR/slurm/v0.0.45/ping"
}
if ! alive "$RUN/slurmrestd.pid" slurmrestd; then
    log "starting slurmrestd $VERSION on $REST_ADDR"
    SLURM_JWT=daemon setsid nohup "$PREFIX/sbin/slurmrestd" -u slurmrest -g slurmrest \
        -a rest_auth/jwt "$REST_ADDR" </dev/null >"$LOGS/slurmrestd.log" 2>&1 &
    echo $! >"$RUN/slurmrestd.pid"
fi
wait_for 30 "slurmrestd $VERSION" rest_ok || die "slurmrestd does not answer (see $LOGS/slurmrestd.log)"
log "Slurm $VERSION cluster $CLUSTER ready: SLURM_CONF=$SLURM_CONF, REST on http://$REST_ADDR"

# the same cluster through each transport, beside the 22.05 ones in the clusters file of
# start_slurm_remote.sh (run first): local26 (this host's 26.05 commands), ssh26 (the login
# node), rest26 (slurmrestd); the commands are not on the login PATH (slurm_bin says where).
# Jobs run in a directory of their own: the two clusters' job ids overlap, and a follower that
# opens a job's log before the job starts would read the other cluster's job of that id.
REMOTE=${SHIPYARD_REMOTE_DIR:-/var/lib/shipyard-remote}
if [ -f "$REMOTE/clusters.yaml" ] && ! grep -q '^rest26:' "$REMOTE/clusters.yaml"; then
    home=$(getent passwd hpcuser | cut -d: -f6)
    ssh_opts="-p 2222 -i $REMOTE/userkey -o BatchMode=yes -o UserKnownHostsFile=$REMOTE/known_hosts"
    cat >>"$REMOTE/clusters.yaml" <<YAML
# Written by scripts/start_slurm26.sh: the 26.05 cluster through the same three doors.
local26:
  transport: local
  slurm_bin: $PREFIX/bin
ssh26:
  transport: ssh
  host: 127.0.0.1
  port: 2222
  user: hpcuser
  identity_file: $REMOTE/userkey
  known_hosts: $REMOTE/known_hosts
  remote_dir: $home/shipyard26
  slurm_bin: $PREFIX/bin
rest26:
  transport: rest
  rest_url: http://$REST_ADDR
  user: hpcuser
  token_command: ssh $ssh_opts hpcuser@127.0.0.1 $PREFIX/bin/scontrol token lifespan=3600
  host: 127.0.0.1
  port: 2222
  identity_file: $REMOTE/userkey
  known_hosts: $REMOTE/known_hosts
  remote_dir: $home/shipyard26
  slurm_bin: $PREFIX/bin
YAML
    log "clusters local26, ssh26, rest26 added to $REMOTE/clusters.yaml"
fi
