#!/bin/bash
#
# Shipyard app snap: 3 replica(s), one heterogeneous-job component each.
# Submit with: sbatch --parsable <this file>
# Logs: slurm-<job id>-<role>-<replica id>.out and .err in the job's directory.
#
#SBATCH --job-name=trainer-0 --ntasks=1 --partition=debug --time=1:30:00 --comment="say \"hi\" \\ there" --constraint="fast&big" --mail-user=me@example.com --mail-type=END,FAIL --cpus-per-task=2 --mem=1024
#SBATCH hetjob
#SBATCH --job-name=trainer-1 --ntasks=1 --partition=debug --time=1:30:00 --comment="say \"hi\" \\ there" --constraint="fast&big" --mail-user=me@example.com --mail-type=END,FAIL --cpus-per-task=2 --mem=1024
#SBATCH hetjob
#SBATCH --job-name=ps-0 --ntasks=1 --partition=debug --time=1:30:00 --comment="say \"hi\" \\ there" --constraint="fast&big" --mail-user=me@example.com --mail-type=END,FAIL --mem=0

export PYTHONUNBUFFERED=1
export SLURM_UNBUFFEREDIO=1
# a job of one component is not heterogeneous: SLURM_JOB_NODELIST_HET_GROUP_0 is set for it here
export SLURM_JOB_NODELIST_HET_GROUP_0="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"

srun \
    --output=slurm-"$SLURM_JOB_ID"-trainer-0.out --error=slurm-"$SLURM_JOB_ID"-trainer-0.err --open-mode=append env LR=0.1 MSG='it'"'"'s $HOME' SHIPYARD_APP_ID="$SLURM_JOB_ID" SHIPYARD_ROLE_NAME=trainer SHIPYARD_REPLICA_ID=0 SHIPYARD_NUM_REPLICAS=2 python -m train --rank0-env SLURM_JOB_NODELIST_HET_GROUP_0 --id "$SLURM_JOB_ID" \
  : \
    --output=slurm-"$SLURM_JOB_ID"-trainer-1.out --error=slurm-"$SLURM_JOB_ID"-trainer-1.err --open-mode=append env LR=0.1 MSG='it'"'"'s $HOME' SHIPYARD_APP_ID="$SLURM_JOB_ID" SHIPYARD_ROLE_NAME=trainer SHIPYARD_REPLICA_ID=1 SHIPYARD_NUM_REPLICAS=2 python -m train --rank0-env SLURM_JOB_NODELIST_HET_GROUP_0 --id "$SLURM_JOB_ID" \
  : \
    --output=slurm-"$SLURM_JOB_ID"-ps-0.out --error=slurm-"$SLURM_JOB_ID"-ps-0.err --open-mode=append env SHIPYARD_APP_ID="$SLURM_JOB_ID" SHIPYARD_ROLE_NAME=ps SHIPYARD_REPLICA_ID=0 SHIPYARD_NUM_REPLICAS=1 /bin/echo 'replica 0'
exitcode=$?

exit "$exitcode"
