"""The ``slurm`` scheduler, one module per concern.

- :mod:`~core.schedulers.slurm.script`: the batch script of an app (one heterogeneous-job
  component per replica, environment values kept out of every command line) and idempotency
  keys in job comments.
- :mod:`~core.schedulers.slurm.jobinfo`: what Slurm says about a job (``squeue``/``sacct``
  text, mapped states and exit codes) and its :class:`DescribeAppResponse`.
- :mod:`~core.schedulers.slurm.transport`: the :class:`SlurmClient` interface the scheduler
  talks to, and its implementation over Slurm's commands run on this host.
- :mod:`~core.schedulers.slurm.ssh`: the same commands on a login node over SSH, and the
  cluster's files over SFTP (one connection per cluster per process).
- :mod:`~core.schedulers.slurm.rest`, :mod:`~core.schedulers.slurm.rest_v0038`: slurmrestd
  with a JWT, one module per API version.
- :mod:`~core.schedulers.slurm.logs`: reading and following a replica's log file.
- :mod:`~core.schedulers.slurm.scheduler`: :class:`SlurmScheduler`, which ties them together
  (app ids, named clusters, exactly-once submission, describe/list/cancel/logs).

Which cluster: the run option ``cluster`` names one of :mod:`core.clusters`; without it this
host's Slurm commands are used. App ids are the job id, or ``{cluster}:{job id}``.
"""

from core.schedulers.slurm.jobinfo import SLURM_STATES
from core.schedulers.slurm.scheduler import SlurmOpts, SlurmScheduler, create_scheduler
from core.schedulers.slurm.script import (
    RANK0_ENV,
    SBATCH_JOB_OPTIONS,
    SlurmBatchRequest,
    SlurmReplicaRequest,
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
