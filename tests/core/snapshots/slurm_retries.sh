#!/bin/bash
#
# Shipyard app retry: 1 replica(s), one heterogeneous-job component each.
# Submit with: sbatch --parsable <this file>
# Logs: slurm-<job id>-<role>-<replica id>.out and .err in the job's directory.
#
#SBATCH --job-name=worker-0 --ntasks=1 --partition=tiny --comment="mine shipyard-key=sha256-000e0ef2a2e022e21cb87108a3960a5122cc0f3f" --cpus-per-task=1 --requeue

export PYTHONUNBUFFERED=1
export SLURM_UNBUFFEREDIO=1
# a job of one component is not heterogeneous: SLURM_JOB_NODELIST_HET_GROUP_0 is set for it here
export SLURM_JOB_NODELIST_HET_GROUP_0="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"

srun \
    --output=slurm-"$SLURM_JOB_ID"-worker-0.out --error=slurm-"$SLURM_JOB_ID"-worker-0.err --open-mode=append env SHIPYARD_APP_ID="$SLURM_JOB_ID" SHIPYARD_ROLE_NAME=worker SHIPYARD_REPLICA_ID=0 SHIPYARD_NUM_REPLICAS=1 /bin/true
exitcode=$?

# max_retries=3: a failed attempt requeues the whole job
if [ "$exitcode" -ne 0 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt 3 ]; then
    echo "shipyard: attempt ${SLURM_RESTART_COUNT:-0} failed with exit code $exitcode, requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$exitcode"
