#!/bin/bash
#
# Shipyard app retry: 1 replica(s), one heterogeneous-job component each.
# Submit with: sbatch --parsable <this file>
# Logs: slurm-<job id>-<role>-<replica id>.out and .err in the job's directory.
#
#SBATCH --job-name=worker-0 --ntasks=1 --partition=tiny --comment="mine shipyard-key=sha256-000e0ef2a2e022e21cb87108a3960a5122cc0f3f" --cpus-per-task=1 --requeue --open-mode=append

export PYTHONUNBUFFERED=1
export SLURM_UNBUFFEREDIO=1
# the node of rank 0 (worker-0: het component 0; a job of one component is not heterogeneous)
export SHIPYARD_RANK0_HOST="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"
# a first attempt starts clean: an earlier job of this id may have left files here
if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then
    rm -rf "$PWD/shipyard-results-$SLURM_JOB_ID" "$PWD/shipyard-retries-$SLURM_JOB_ID"
    : >slurm-"$SLURM_JOB_ID"-worker-0.out
    : >slurm-"$SLURM_JOB_ID"-worker-0.err
    [ ! -e "$PWD/shipyard-checkpoint-$SLURM_JOB_ID" ] || mv -T "$PWD/shipyard-checkpoint-$SLURM_JOB_ID" "$PWD/shipyard-checkpoint-$SLURM_JOB_ID.earlier-$(date +%s)"
fi
# results ($SHIPYARD_RESULT_FILE) and a memory sample every second (sacct MaxRSS)
export SHIPYARD_RESULT_DIR="$PWD/shipyard-results-$SLURM_JOB_ID"
mkdir -p "$SHIPYARD_RESULT_DIR"
export SLURM_ACCTG_FREQ="${SLURM_ACCTG_FREQ:-task=1}"
# the attempt (a requeued job keeps its id) and a checkpoint directory kept across them
export SHIPYARD_ATTEMPT="${SLURM_RESTART_COUNT:-0}"
export SHIPYARD_CHECKPOINT_DIR="$PWD/shipyard-checkpoint-$SLURM_JOB_ID"
mkdir -p "$SHIPYARD_CHECKPOINT_DIR"
# Slurm's restart count spans requeues (preemption, node failure, time limit) and
# retries (max_retries): each retry is one line of this file
shipyard_retries_file="$PWD/shipyard-retries-$SLURM_JOB_ID"
shipyard_retries=$(grep -c . "$shipyard_retries_file" 2>/dev/null)
shipyard_requeues=$(( ${SLURM_RESTART_COUNT:-0} - ${shipyard_retries:=0} ))
if [ "$shipyard_requeues" -ge 0 ]; then
    # no requeue left (max_requeues=0): a preemption or a node failure ends the job
    scontrol update JobId="$SLURM_JOB_ID" Requeue=0 || echo "shipyard: could not turn the requeue of job $SLURM_JOB_ID off" >&2
fi
# the replicas' environment, kept out of every command line
export SHIPYARD_ENV_0_0="$SLURM_JOB_ID"
export SHIPYARD_ENV_0_1=worker
export SHIPYARD_ENV_0_2=0
export SHIPYARD_ENV_0_3=1

srun \
    --output=slurm-"$SLURM_JOB_ID"-worker-0.out --error=slurm-"$SLURM_JOB_ID"-worker-0.err --open-mode=append /bin/sh -c 'export SHIPYARD_APP_ID="$SHIPYARD_ENV_0_0" SHIPYARD_ROLE_NAME="$SHIPYARD_ENV_0_1" SHIPYARD_REPLICA_ID="$SHIPYARD_ENV_0_2" SHIPYARD_NUM_REPLICAS="$SHIPYARD_ENV_0_3" SHIPYARD_RESULT_FILE="$SHIPYARD_RESULT_DIR/worker-0.json"; unset SHIPYARD_ENV_0_0 SHIPYARD_ENV_0_1 SHIPYARD_ENV_0_2 SHIPYARD_ENV_0_3; exec "$@"' shipyard-replica /bin/true
exitcode=$?

# max_retries=3: a failed attempt requeues the whole job
if [ "$exitcode" -ne 0 ] && [ "$shipyard_retries" -lt 3 ]; then
    echo "shipyard: attempt $SHIPYARD_ATTEMPT failed with exit code $exitcode, requeueing job $SLURM_JOB_ID" >&2
    echo retry >>"$shipyard_retries_file"
    scontrol update JobId="$SLURM_JOB_ID" Requeue=1
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$exitcode"
