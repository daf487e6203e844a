#!/bin/bash
#
# Shipyard app snap: 3 replica(s), one heterogeneous-job component each.
# Submit with: sbatch --parsable <this file>
# Logs: slurm-<job id>-<role>-<replica id>.out and .err in the job's directory.
#
#SBATCH --job-name=ps-0 --ntasks=1 --partition=debug --time=1:30:00 --comment="say \"hi\" \\ there" --constraint="fast&big" --mail-user=me@example.com --mail-type=END,FAIL --no-requeue
#SBATCH hetjob
#SBATCH --job-name=trainer-0 --ntasks=1 --partition=debug --time=1:30:00 --comment="say \"hi\" \\ there" --constraint="fast&big" --mail-user=me@example.com --mail-type=END,FAIL --cpus-per-task=2 --mem=1024
#SBATCH hetjob
#SBATCH --job-name=trainer-1 --ntasks=1 --partition=debug --time=1:30:00 --comment="say \"hi\" \\ there" --constraint="fast&big" --mail-user=me@example.com --mail-type=END,FAIL --cpus-per-task=2 --mem=1024

export PYTHONUNBUFFERED=1
export SLURM_UNBUFFEREDIO=1
# the node of rank 0 (trainer-0: het component 1; a job of one component is not heterogeneous)
export SHIPYARD_RANK0_HOST="${SLURM_JOB_NODELIST_HET_GROUP_1:-$SLURM_JOB_NODELIST}"
# a first attempt starts clean: an earlier job of this id may have left files here
if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then
    rm -rf "$PWD/shipyard-results-$SLURM_JOB_ID" "$PWD/shipyard-retries-$SLURM_JOB_ID"
    : >slurm-"$SLURM_JOB_ID"-ps-0.out
    : >slurm-"$SLURM_JOB_ID"-ps-0.err
    : >slurm-"$SLURM_JOB_ID"-trainer-0.out
    : >slurm-"$SLURM_JOB_ID"-trainer-0.err
    : >slurm-"$SLURM_JOB_ID"-trainer-1.out
    : >slurm-"$SLURM_JOB_ID"-trainer-1.err
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
# the replicas' environment, kept out of every command line
export SHIPYARD_ENV_0_0="$SLURM_JOB_ID"
export SHIPYARD_ENV_0_1=ps
export SHIPYARD_ENV_0_2=0
export SHIPYARD_ENV_0_3=1
export SHIPYARD_ENV_1_0=0.1
export SHIPYARD_ENV_1_1='it'"'"'s $HOME'
export SHIPYARD_ENV_1_2="$SLURM_JOB_ID"
export SHIPYARD_ENV_1_3=trainer
export SHIPYARD_ENV_1_4=0
export SHIPYARD_ENV_1_5=2
export SHIPYARD_ENV_2_0=0.1
export SHIPYARD_ENV_2_1='it'"'"'s $HOME'
export SHIPYARD_ENV_2_2="$SLURM_JOB_ID"
export SHIPYARD_ENV_2_3=trainer
export SHIPYARD_ENV_2_4=1
export SHIPYARD_ENV_2_5=2
# srun refuses components that mix the cluster's DefMemPerCPU with --mem; those without a request get their allocation's memory
unset $(compgen -v SLURM_MEM_PER_CPU)

srun \
    --output=slurm-"$SLURM_JOB_ID"-ps-0.out --error=slurm-"$SLURM_JOB_ID"-ps-0.err --open-mode=append /bin/sh -c 'export SHIPYARD_APP_ID="$SHIPYARD_ENV_0_0" SHIPYARD_ROLE_NAME="$SHIPYARD_ENV_0_1" SHIPYARD_REPLICA_ID="$SHIPYARD_ENV_0_2" SHIPYARD_NUM_REPLICAS="$SHIPYARD_ENV_0_3" SHIPYARD_RESULT_FILE="$SHIPYARD_RESULT_DIR/ps-0.json"; unset SHIPYARD_ENV_0_0 SHIPYARD_ENV_0_1 SHIPYARD_ENV_0_2 SHIPYARD_ENV_0_3 SHIPYARD_ENV_1_0 SHIPYARD_ENV_1_1 SHIPYARD_ENV_1_2 SHIPYARD_ENV_1_3 SHIPYARD_ENV_1_4 SHIPYARD_ENV_1_5 SHIPYARD_ENV_2_0 SHIPYARD_ENV_2_1 SHIPYARD_ENV_2_2 SHIPYARD_ENV_2_3 SHIPYARD_ENV_2_4 SHIPYARD_ENV_2_5; exec "$@"' shipyard-replica /bin/echo 'replica 0' \
  : \
    --output=slurm-"$SLURM_JOB_ID"-trainer-0.out --error=slurm-"$SLURM_JOB_ID"-trainer-0.err --open-mode=append /bin/sh -c 'export LR="$SHIPYARD_ENV_1_0" MSG="$SHIPYARD_ENV_1_1" SHIPYARD_APP_ID="$SHIPYARD_ENV_1_2" SHIPYARD_ROLE_NAME="$SHIPYARD_ENV_1_3" SHIPYARD_REPLICA_ID="$SHIPYARD_ENV_1_4" SHIPYARD_NUM_REPLICAS="$SHIPYARD_ENV_1_5" SHIPYARD_RESULT_FILE="$SHIPYARD_RESULT_DIR/trainer-0.json"; unset SHIPYARD_ENV_0_0 SHIPYARD_ENV_0_1 SHIPYARD_ENV_0_2 SHIPYARD_ENV_0_3 SHIPYARD_ENV_1_0 SHIPYARD_ENV_1_1 SHIPYARD_ENV_1_2 SHIPYARD_ENV_1_3 SHIPYARD_ENV_1_4 SHIPYARD_ENV_1_5 SHIPYARD_ENV_2_0 SHIPYARD_ENV_2_1 SHIPYARD_ENV_2_2 SHIPYARD_ENV_2_3 SHIPYARD_ENV_2_4 SHIPYARD_ENV_2_5; exec "$@"' shipyard-replica python -m train --rank0-env SHIPYARD_RANK0_HOST --id "$SLURM_JOB_ID" \
  : \
    --output=slurm-"$SLURM_JOB_ID"-trainer-1.out --error=slurm-"$SLURM_JOB_ID"-trainer-1.err --open-mode=append /bin/sh -c 'export LR="$SHIPYARD_ENV_2_0" MSG="$SHIPYARD_ENV_2_1" SHIPYARD_APP_ID="$SHIPYARD_ENV_2_2" SHIPYARD_ROLE_NAME="$SHIPYARD_ENV_2_3" SHIPYARD_REPLICA_ID="$SHIPYARD_ENV_2_4" SHIPYARD_NUM_REPLICAS="$SHIPYARD_ENV_2_5" SHIPYARD_RESULT_FILE="$SHIPYARD_RESULT_DIR/trainer-1.json"; unset SHIPYARD_ENV_0_0 SHIPYARD_ENV_0_1 SHIPYARD_ENV_0_2 SHIPYARD_ENV_0_3 SHIPYARD_ENV_1_0 SHIPYARD_ENV_1_1 SHIPYARD_ENV_1_2 SHIPYARD_ENV_1_3 SHIPYARD_ENV_1_4 SHIPYARD_ENV_1_5 SHIPYARD_ENV_2_0 SHIPYARD_ENV_2_1 SHIPYARD_ENV_2_2 SHIPYARD_ENV_2_3 SHIPYARD_ENV_2_4 SHIPYARD_ENV_2_5; exec "$@"' shipyard-replica python -m train --rank0-env SHIPYARD_RANK0_HOST --id "$SLURM_JOB_ID"
exitcode=$?

exit "$exitcode"
