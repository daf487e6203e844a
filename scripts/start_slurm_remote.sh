#!/usr/bin/env bash
# Puts the two remote front doors of a real cluster in front of the local 3-node Slurm cluster
# (scripts/start_slurm.sh), the way users reach a cluster from an Airflow or Prefect worker:
#   - an OpenSSH login node on 127.0.0.1:2222 (user hpcuser, key authentication only)
#   - slurmrestd on 127.0.0.1:6820 with JWT authentication (openapi/v0.0.38 + dbv0.0.38)
# Idempotent (a daemon that already answers is left alone). Needs root (Debian 12).
#
# Client material, in $SHIPYARD_REMOTE_DIR (default /var/lib/shipyard-remote, mode 700):
#   userkey        hpcuser's private key (the client's identity_file)
#   known_hosts    the login node's host key, as ssh writes it for [127.0.0.1]:2222
#   clusters.yaml  a clusters file naming both: `ssh-login` (transport ssh) and `rest-api`
#                  (transport rest, token from `ssh ... scontrol token`, logs over SSH)
set -euo pipefail

DIR=${SHIPYARD_REMOTE_DIR:-/var/lib/shipyard-remote}
SSH_PORT=2222
REST_ADDR=127.0.0.1:6820
USER_NAME=hpcuser
SSHD_PID=/run/shipyard-sshd.pid
REST_PID=/run/shipyard-slurmrestd.pid

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root
export PATH="$PATH:/usr/sbin:/sbin"

apt_install openssh-server openssh-client slurmrestd curl

# --- the login user and the keys -------------------------------------------------------------
if ! id "$USER_NAME" >/dev/null 2>&1; then
    log "creating user $USER_NAME"
    useradd -m -s /bin/bash "$USER_NAME"
fi
usermod -p '*' "$USER_NAME" # no password, not locked: sshd with UsePAM=no refuses locked accounts
home=$(getent passwd "$USER_NAME" | cut -d: -f6)
install -d -m 700 "$DIR"
[ -s "$DIR/hostkey" ] || ssh-keygen -q -t ed25519 -N '' -C shipyard-login-node -f "$DIR/hostkey"
[ -s "$DIR/userkey" ] || ssh-keygen -q -t ed25519 -N '' -C "$USER_NAME@shipyard" -f "$DIR/userkey"
install -d -m 700 -o "$USER_NAME" -g "$USER_NAME" "$home/.ssh"
install -m 600 -o "$USER_NAME" -g "$USER_NAME" "$DIR/userkey.pub" "$home/.ssh/authorized_keys"
printf '[127.0.0.1]:%s %s\n' "$SSH_PORT" "$(cut -d' ' -f1,2 "$DIR/hostkey.pub")" >"$DIR/known_hosts"
# where jobs submitted through the front doors keep their logs and job directories
install -d -m 700 -o "$USER_NAME" -g "$USER_NAME" "$home/shipyard"

# --- sshd ------------------------------------------------------------------------------------
mkdir -p /run/sshd
ssh_ok() {
    ssh -p "$SSH_PORT" -i "$DIR/userkey" -o BatchMode=yes -o UserKnownHostsFile="$DIR/known_hosts" \
        -o StrictHostKeyChecking=yes "$USER_NAME@127.0.0.1" true
}
if ! pid_alive "$SSHD_PID" sshd; then
    log "starting sshd on 127.0.0.1:$SSH_PORT"
    /usr/sbin/sshd -f /dev/null -p "$SSH_PORT" -o ListenAddress=127.0.0.1 -h "$DIR/hostkey" \
        -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o UsePAM=no \
        -o PidFile="$SSHD_PID" -o MaxSessions=64 -o MaxStartups=64:30:128 \
        -o AcceptEnv=none -o PermitUserEnvironment=no -o Subsystem="sftp internal-sftp"
fi
wait_for 30 "ssh login node" ssh_ok || die "cannot log in over ssh to $USER_NAME@127.0.0.1:$SSH_PORT"

# --- slurmrestd ------------------------------------------------------------------------------
id slurmrest >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin slurmrest
token() { scontrol token username="$USER_NAME" lifespan=600 | sed -n 's/^SLURM_JWT=//p'; }
rest_ok() {
    curl -sf -H "X-SLURM-USER-NAME: $USER_NAME" -H "X-SLURM-USER-TOKEN: $(token)" \
        "http://$REST_ADDR/slurm/v0.0.38/ping"
}
if ! pid_alive "$REST_PID" slurmrestd; then
    log "starting slurmrestd on $REST_ADDR (started again if it dies, as its service would be)"
    # it refuses to run as root or SlurmUser; SLURM_JWT=daemon: it authenticates with JWT itself.
    # Debian's 22.05 slurmrestd dies now and then under the racing-submitters test (no error in
    # its log; about 1 run in 8 on this machine, old and new Shipyard alike): the loop plays
    # systemd's Restart=on-failure, so one crash is an outage of a second, not of every later test.
    : >/var/log/slurm/slurmrestd.log
    SLURM_JWT=daemon setsid nohup bash -c 'while :; do
        slurmrestd -u slurmrest -g slurmrest -a rest_auth/jwt \
            -s openapi/v0.0.38,openapi/dbv0.0.38 "$0" </dev/null
        echo "slurmrestd exited with $?: starting it again" >&2
        sleep 1
    done' "$REST_ADDR" </dev/null >>/var/log/slurm/slurmrestd.log 2>&1 &
    echo $! >"$REST_PID"
fi
wait_for 30 "slurmrestd" rest_ok || die "slurmrestd does not answer (see /var/log/slurm/slurmrestd.log)"

# (kept as it is when it already starts with this: start_slurm26.sh appends the 26.05
# cluster's entries, which a re-run of this script must not drop)
new=$(mktemp)
cat >"$new" <<EOF
# Written by scripts/start_slurm_remote.sh: the local cluster through its two front doors.
ssh-login:
  transport: ssh
  host: 127.0.0.1
  port: $SSH_PORT
  user: $USER_NAME
  identity_file: $DIR/userkey
  known_hosts: $DIR/known_hosts
  remote_dir: $home/shipyard
rest-api:
  transport: rest
  rest_url: http://$REST_ADDR
  user: $USER_NAME
  token_command: ssh -p $SSH_PORT -i $DIR/userkey -o BatchMode=yes -o UserKnownHostsFile=$DIR/known_hosts $USER_NAME@127.0.0.1 scontrol token lifespan=3600
  # logs and job directories are read and written over SSH
  host: 127.0.0.1
  port: $SSH_PORT
  identity_file: $DIR/userkey
  known_hosts: $DIR/known_hosts
  remote_dir: $home/shipyard
EOF
if [ -f "$DIR/clusters.yaml" ] &&
    [ "$(head -c "$(wc -c <"$new")" "$DIR/clusters.yaml")" = "$(cat "$new")" ]; then
    rm -f "$new"
else
    cat "$new" >"$DIR/clusters.yaml"
    rm -f "$new"
fi
chmod 600 "$DIR/clusters.yaml"
log "front doors up; clusters file: $DIR/clusters.yaml"
