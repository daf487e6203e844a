"""The ``slurm`` scheduler: every app is one heterogeneous Slurm job (see :mod:`core.schedulers.slurm`).

Each replica of each role is one component of a heterogeneous job submitted with ``sbatch`` (or
slurmrestd); the batch script starts all of them with a single ``srun`` whose per-component
command lines are joined by `` : ``. Logs are written as ``slurm-<jobid>-<role>-<replica_id>.out``
(stdout) and ``.err`` (stderr) in the job's working directory: ``cfg.job_dir`` if given (a new
directory; with a workspace, a snapshot of it), else the directory the job was submitted from
(on a named cluster: its ``remote_dir``). The working directory is read back from Slurm itself,
so logs can be followed from any process and any directory.

Jobs submitted with this host's ``sbatch`` inherit the submitting environment (``--export=ALL``,
the default): an activated virtualenv or conda environment is active in the replicas too.

    $ shipyard run --scheduler slurm ...
    $ shipyard run --scheduler slurm --cfg cluster=hpc1 ...   # a cluster of clusters.yaml
    $ shipyard status slurm://session/1234
    $ less slurm-1234-trainer-0.out

This module keeps the names of the specification importable from here.
"""

from core.schedulers.slurm import (
    RANK0_ENV,
    SBATCH_JOB_OPTIONS,
    SLURM_STATES,
    SlurmBatchRequest,
    SlurmOpts,
    SlurmReplicaRequest,
    SlurmScheduler,
    create_scheduler,
)

__all__ = [
    "RANK0_ENV",
    "SBATCH_JOB_OPTIONS",
    "SLURM_STATES",
    "SlurmBatchRequest",
    "SlurmOpts",
    "SlurmReplicaRequest",
    "SlurmScheduler",
    "create_scheduler",
]
