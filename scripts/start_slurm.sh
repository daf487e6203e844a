#!/usr/bin/env bash
# Starts a real Slurm 22.05 cluster on this host: three nodes (node1..node3, one `slurmd -N` each),
# slurmctld, and accounting through slurmdbd on MariaDB, all authenticated by munge.
#
# Made for Debian 12 as root without systemd (CI containers, developer VMs). Idempotent: a daemon
# that already answers is left alone, so running it twice is safe; it returns once `sinfo` shows
# every node idle (or allocated/mixed, if jobs are already running).
#
#   scripts/start_slurm.sh            # start (or check) the cluster
#   SHIPYARD_SLURM_WAIT=120 scripts/start_slurm.sh   # wait longer for the nodes
set -euo pipefail

CLUSTER=shipyard
NODES=(node1 node2 node3)
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=shipyard-slurm
WAIT=${SHIPYARD_SLURM_WAIT:-90}
HOST=$(hostname)

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root

slurm_alive() { pid_alive "$1" slurm; } # slurm_alive PIDFILE: a live slurm daemon

# ---------------------------------------------------------------------------------------------
# packages
# ---------------------------------------------------------------------------------------------
apt_install --with-recommends slurm-wlm munge mariadb-server slurmdbd
export PATH="$PATH:/usr/sbin:/sbin"

# ---------------------------------------------------------------------------------------------
# munge
# ---------------------------------------------------------------------------------------------
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
    chmod 0700 /etc/munge /var/log/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    log "starting munged"
    # A stale socket or pid file of a dead munged makes it refuse to start.
    rm -f /run/munge/munge.socket.2 /run/munge/munged.pid
    su -s /bin/sh munge -c "/usr/sbin/munged" </dev/null >/dev/null 2>&1
    wait_for 20 "munge" munge_ok || die "munged did not start (see /var/log/munge/munged.log)"
else
    log "munge: already running"
fi

# ---------------------------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------------------------
db_ok() { mysqladmin --protocol=socket -uroot ping >/dev/null 2>&1; }
if ! db_ok; then
    mkdir -p /run/mysqld
    chown mysql:mysql /run/mysqld
    if [ ! -d /var/lib/mysql/mysql ]; then
        log "initialising the MariaDB data directory"
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    log "starting mariadb (mysqld_safe)"
    setsid nohup mysqld_safe --user=mysql </dev/null >/var/log/mysqld_safe.log 2>&1 &
    wait_for 60 "mariadb" db_ok || die "mariadb did not start (see /var/log/mysqld_safe.log)"
else
    log "mariadb: already running"
fi
mysql -uroot <<SQL
CREATE DATABASE IF NOT EXISTS ${DB_NAME};
CREATE USER IF NOT EXISTS '${DB_USER}'@'localhost' IDENTIFIED BY '${DB_PASS}';
ALTER USER '${DB_USER}'@'localhost' IDENTIFIED BY '${DB_PASS}';
GRANT ALL PRIVILEGES ON ${DB_NAME}.* TO '${DB_USER}'@'localhost';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
mkdir -p /etc/slurm /var/log/slurm /var/spool/slurmctld /run/slurm
# The key slurmctld and slurmdbd sign and check JSON Web Tokens with (slurmrestd's clients
# authenticate with `scontrol token` tokens: scripts/start_slurm_remote.sh).
JWT_KEY=/var/spool/slurmctld/jwt_hs256.key
if [ ! -s "$JWT_KEY" ]; then
    dd if=/dev/urandom of="$JWT_KEY" bs=32 count=1 status=none
fi
chmod 600 "$JWT_KEY"
for n in "${NODES[@]}"; do mkdir -p "/var/spool/slurmd/$n"; done

dbd_changed=$(write_if_changed /etc/slurm/slurmdbd.conf 600 <<EOF
# Written by shipyard scripts/start_slurm.sh
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=${JWT_KEY}
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=${DB_USER}
StoragePass=${DB_PASS}
StorageLoc=${DB_NAME}
EOF
)

conf_changed=$(write_if_changed /etc/slurm/slurm.conf 644 <<EOF
# Written by shipyard scripts/start_slurm.sh: three nodes on one host (slurmd -N nodeX).
ClusterName=${CLUSTER}
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmctldPort=6817
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=${JWT_KEY}
# A requeued job waits cred_expire+1 seconds before it may start again (default 120).
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job asking no memory gets 1000 MiB a CPU (not the whole node).
DefMemPerCPU=1000
# Heterogeneous jobs are started only by the backfill scheduler: run it every second, planning
# to the second (the default 60 s slots held a requeued job 15-25 s past its eligible time).
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_resolution=1,sched_interval=1
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# --mem is enforced by the accounting plugin: a step whose sampled RSS passes it is killed
# (jobs sample every second: --acctg-freq=task=1). Memory is a consumable resource for that.
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
# every task of a cancelled array is a job record until MinJobAge: the default 10000 records
# (ten cancelled 1,000-element arrays) would make sbatch wait for room
MaxJobCount=100000
NodeName=node[1-3] NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=17001-17003 CPUs=2 RealMemory=4000 State=UNKNOWN
# Preemption for real: a job in "urgent" takes the nodes of "debug" jobs, which Slurm requeues
# (or, not requeueable, ends PREEMPTED). The steps get SIGTERM and KillWait seconds first.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=node[1-3] MaxTime=INFINITE State=UP PriorityTier=10
EOF
)

# The node names resolve to this host, so a replica can reach rank 0 by its node name
# (SLURM_JOB_NODELIST_HET_GROUP_0 holds e.g. "node1").
if ! grep -qE '^127\.0\.0\.1[[:space:]].*\bnode1\b' /etc/hosts; then
    echo "127.0.0.1 node1 node2 node3  # shipyard start_slurm.sh" >>/etc/hosts
fi

# ---------------------------------------------------------------------------------------------
# slurmdbd + cluster registration
# ---------------------------------------------------------------------------------------------
dbd_ok() { slurm_alive /run/slurmdbd.pid && sacctmgr -n -P show cluster format=cluster; }
if slurm_alive /run/slurmdbd.pid && [ -n "$dbd_changed" ]; then
    log "slurmdbd.conf changed: restarting slurmdbd"
    kill "$(cat /run/slurmdbd.pid)"
    wait_for 30 "slurmdbd stopped" bash -c '! kill -0 $(cat /run/slurmdbd.pid) 2>/dev/null'
fi
if ! slurm_alive /run/slurmdbd.pid; then
    log "starting slurmdbd"
    slurmdbd </dev/null >/dev/null 2>&1
fi
wait_for 60 "slurmdbd" dbd_ok || die "slurmdbd does not answer (see /var/log/slurm/slurmdbd.log)"
if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    log "registering cluster $CLUSTER"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# ---------------------------------------------------------------------------------------------
# slurmctld + three slurmd
# ---------------------------------------------------------------------------------------------
ctld_ok() { scontrol ping | grep -q "is UP"; }
if slurm_alive /run/slurmctld.pid && [ -n "$conf_changed" ]; then
    log "slurm.conf changed: restarting slurmctld and the slurmd"
    for n in "${NODES[@]}"; do
        slurm_alive "/run/slurmd-$n.pid" && kill "$(cat "/run/slurmd-$n.pid")"
    done
    kill "$(cat /run/slurmctld.pid)"
    wait_for 30 "slurmctld stopped" bash -c '! kill -0 $(cat /run/slurmctld.pid) 2>/dev/null'
    for n in "${NODES[@]}"; do
        wait_for 30 "slurmd $n stopped" bash -c "! kill -0 \$(cat /run/slurmd-$n.pid) 2>/dev/null"
    done
fi
if ! slurm_alive /run/slurmctld.pid; then
    log "starting slurmctld"
    slurmctld </dev/null >/dev/null 2>&1
fi
wait_for 60 "slurmctld" ctld_ok || die "slurmctld does not answer (see /var/log/slurm/slurmctld.log)"

for n in "${NODES[@]}"; do
    if ! slurm_alive "/run/slurmd-$n.pid"; then
        log "starting slurmd -N $n"
        slurmd -N "$n" </dev/null >/dev/null 2>&1
    fi
done

nodes_ready() {
    local states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    [ "$(echo "$states" | grep -cE ' (idle|allocated|mixed|completing)$')" -ge "${#NODES[@]}" ]
}
deadline=$((SECONDS + WAIT))
resumed=0
until nodes_ready; do
    # Nodes left DOWN/DRAINED by an earlier, unclean stop are put back into service once.
    if [ "$resumed" = 0 ] && sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(down|drain)'; then
        sleep 2
        scontrol update NodeName=node[1-3] State=RESUME >/dev/null 2>&1 || true
        resumed=1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        sinfo -N >&2 || true
        die "nodes are not idle after ${WAIT}s (see /var/log/slurm/slurmd-node*.log)"
    fi
    sleep 0.5
done
log "cluster $CLUSTER is up:"
sinfo -N >&2
