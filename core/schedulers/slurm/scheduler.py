"""The ``slurm`` scheduler: every app is one heterogeneous Slurm job, on this host's cluster or
on a named cluster reached over SSH or slurmrestd (see :mod:`core.clusters`)."""

from __future__ import annotations

import logging
import math
import os
import posixpath
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from core.clusters import ClusterConfig, ClusterError, get_cluster
from core.limits import TIME_LIMIT_OPT, limits_from_cfg, requeue_from_cfg
from core.reports import (
    RESULT_REPLICAS_OPT,
    Problem,
    ReplicaResult,
    result_replicas,
)
from core.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    check_stream,
    filter_regex,
)
from core.schedulers.slurm import checks, outcome
from core.schedulers.slurm.containers import containerize
from core.schedulers.slurm.containers import stage as stage_images
from core.schedulers.slurm.describe import describe_jobs
from core.schedulers.slurm.images import resolve as resolve_images
from core.schedulers.slurm.jobinfo import JobInfo, app_state, task_ranges, to_response
from core.schedulers.slurm.logs import TailChecks, read_lines
from core.schedulers.slurm.nodefail import exclusion_comment, keep_off_failed_nodes
from core.schedulers.slurm.options import SlurmOpts, run_opts, validate_options
from core.schedulers.slurm.script import (
    RANK0_ENV,
    WARN_SIGNAL,
    SlurmBatchRequest,
    SlurmReplicaRequest,
    comment_key,
    key_mark,
    key_token,
    lost_comment,
)
from core.schedulers.slurm.transport import (
    CommandClient,
    Files,
    LocalFiles,
    LocalShell,
    SlurmClient,
    SubmitRefusedError,
    TransportError,
    submit_error,
)
from core.specs import (
    AppDef,
    AppDryRunInfo,
    Attempt,
    CfgVal,
    RetryPolicy,
    Role,
    is_terminal,
    macros,
    runopts,
)
from core.transient import BackendUnavailableError
from core.workspace import DirWorkspaceMixin, walk_workspace

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger(__name__)

__all__ = ["SlurmOpts", "SlurmScheduler", "create_scheduler", "run_opts"]


_JOB_ID_RE = re.compile(r"^[0-9]+$")
# used with fullmatch: `$` would also accept a trailing newline ("123\n" as job 123)
_APP_ID_RE = re.compile(
    r"(?:(?P<cluster>[A-Za-z0-9][A-Za-z0-9_.-]{0,62}):)?(?P<job>[0-9]+(?:_[0-9]+)?)"
)


class SlurmScheduler(DirWorkspaceMixin, Scheduler[SlurmBatchRequest]):
    """Runs apps on a Slurm cluster as heterogeneous jobs (see the package docs).

    ``describe`` asks the controller once per poll for any number of jobs of one cluster
    (``squeue``, or slurmrestd's job list) and accounting (``sacct``) only for jobs the
    controller forgot or that were requeued. Replica ``k`` of role ``r`` is the het-job
    component named ``r-k``. App ids are the job id (this host's cluster) or
    ``{cluster}:{job id}`` (a named cluster).

    Args:
        session_name: the session the apps are submitted under
    """

    def __init__(self, session_name: str, **kwargs: Any) -> None:
        super().__init__("slurm", session_name)
        self._lock = threading.Lock()
        self._clients: dict[str | None, SlurmClient] = {}
        self._clusters: dict[str, ClusterConfig] = {}
        self._partitions: dict[str | None, tuple[dict[str, int], str | None]] = {}
        self._default_dirs: dict[str | None, str | None] = {}
        self._workdirs: dict[str, str] = {}
        self._created_job_dirs: set[str] = set()
        self._made_dirs: set[str] = set()
        self._probed: set[str] = set()  # clusters reached once (their settings work)
        self._usage: dict[str, dict[str, Any]] = {}  # of ended jobs, once accounting has all
        #: by cluster: a requeued job's ended attempts, by (job id, restarts)
        self._attempts: dict[str | None, dict[tuple[str, int], list[Attempt]]] = {}
        #: the (job, requeues) kept off their failed nodes, by cluster (see :mod:`.nodefail`)
        self._kept_off: dict[str | None, set[tuple[str, int]]] = {}
        self._tails = TailChecks(self.describe_many, _tail_ended)

    # -- clusters ------------------------------------------------------------------------------

    def _cluster(self, name: str) -> ClusterConfig:
        with self._lock:
            found = self._clusters.get(name)
        if found is None:
            found = get_cluster(name)
            with self._lock:
                self._clusters[name] = found
        return found

    def client(self, cluster: str | None) -> SlurmClient:
        """The transport to ``cluster`` (``None``: this host's Slurm commands), made once."""
        with self._lock:
            client = self._clients.get(cluster)
        if client is None:
            client = _make_client(None if cluster is None else self._cluster(cluster))
            with self._lock:
                client = self._clients.setdefault(cluster, client)
        return client

    def default_dir(self, cluster: str | None) -> str | None:
        """Where a job without ``job_dir`` runs: this process's directory (this host's
        cluster) or the cluster's ``remote_dir`` (relative to the login user's home)."""
        if cluster not in self._default_dirs:
            if cluster is None:
                path = None
            else:
                config = self._cluster(cluster)
                path = config.remote_dir or "shipyard"
                if not path.startswith("/"):
                    path = posixpath.join(_home(self.client(cluster)), path)
            self._default_dirs[cluster] = path
        return self._default_dirs[cluster]

    def _probe(self, cluster: str) -> None:
        """Reaches the cluster once (before anything is submitted), so that a bad host, key,
        host key, token or API version is one clear error naming the setting."""
        if cluster in self._probed:
            return
        config = self._cluster(cluster)
        client = self.client(cluster)
        try:
            if config.transport == "rest":
                client.partitions()
            self.default_dir(cluster)
        except TransportError as e:
            # unreachable (after retries) is not a bad setting: the caller may try again later;
            # the message still names the setting to check
            where = "rest_url" if config.transport == "rest" else "host"
            detail = str(e).removeprefix(f"cluster {cluster!r}: ")
            raise TransportError(f"cluster {cluster!r}: {where}: {detail}") from None
        self._probed.add(cluster)

    # -- options -----------------------------------------------------------------------------

    def _run_opts(self) -> runopts:
        return run_opts()

    # -- validation ----------------------------------------------------------------------------

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        validate_options(cfg)
        if cfg.get("time") and cfg.get(TIME_LIMIT_OPT):
            raise ValueError(f"cfg.{TIME_LIMIT_OPT}, cfg.time: expected one of them, got both")
        requeue_from_cfg(cfg, limits_from_cfg(cfg))
        result_replicas(cfg.get(RESULT_REPLICAS_OPT))
        for i, role in enumerate(app.roles):
            if role.max_retries > 0 and role.retry_policy != RetryPolicy.APPLICATION:
                raise ValueError(
                    f"roles[{i}].retry_policy: slurm supports only APPLICATION (the whole job is"
                    f" requeued), got {role.retry_policy.value}"
                )
        cluster = _cfg_cluster(cfg)
        if cluster is not None:
            self._probe(cluster)
        job_dir = self._job_dir(cfg)
        if job_dir and job_dir not in self._created_job_dirs:
            files = self.client(cluster).files or LocalFiles()
            if files.exists(job_dir):
                raise ValueError(
                    f"cfg.job_dir: must not exist (it is created), but {job_dir} exists"
                )

    def _job_dir(self, cfg: Mapping[str, CfgVal]) -> str | None:
        value = cfg.get("job_dir")
        if not value:
            return None
        cluster = _cfg_cluster(cfg)
        if cluster is None:
            return os.path.abspath(str(value))
        base = self.default_dir(cluster) or "/"
        return posixpath.normpath(posixpath.join(base, str(value)))

    # -- workspace -----------------------------------------------------------------------------

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Snapshots ``workspace`` into the new ``cfg.job_dir`` (on a named cluster: uploaded
        over SFTP, or written to its local mount), where the job then runs."""
        cluster = _cfg_cluster(cfg)
        if cluster is None or self._cluster(cluster).transport == "local":
            super().build_workspace_and_update_role(role, workspace, cfg)
            job_dir = cfg.get("job_dir")
            if isinstance(job_dir, str) and job_dir:
                self._created_job_dirs.add(os.path.abspath(job_dir))
            return
        job_dir = self._job_dir(cfg)
        if not job_dir:
            return
        files = _files_or_fail(self.client(cluster), cluster, "job_dir snapshots")
        if not files.mkdir(job_dir, parents=True):
            raise ValueError(f"cfg.job_dir: must not exist (it is created), but {job_dir} exists")
        count = _upload(files, workspace, job_dir)
        log.info("workspace %s uploaded into %s:%s (%d files)", workspace, cluster, job_dir, count)
        self._created_job_dirs.add(job_dir)
        role.image = job_dir

    # -- submitting ----------------------------------------------------------------------------

    def _nomem(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> bool:
        """True where the partition's nodes have (almost) no RealMemory configured: such
        partitions reject any ``--mem`` request."""
        if not any(role.resource.memMB > 0 for role in app.roles):
            return False
        cluster = _cfg_cluster(cfg)
        if cluster not in self._partitions:
            try:
                self._partitions[cluster] = self.client(cluster).partitions()
            except TransportError as e:
                log.debug("partition sizes unknown: %s", e)
                self._partitions[cluster] = ({}, None)
        memory, default = self._partitions[cluster]
        part = cfg.get("partition")
        wanted = str(part) if part else default
        mem = memory.get(wanted.split(",")[0]) if wanted else None
        return mem is not None and mem < 1000

    def _submit_dryrun(
        self, app: AppDef, cfg: Mapping[str, CfgVal]
    ) -> AppDryRunInfo[SlurmBatchRequest]:
        cluster = _cfg_cluster(cfg)
        job_dir = self._job_dir(cfg)
        nomem = self._nomem(app, cfg)
        job_cfg = dict(cfg)
        limits = limits_from_cfg(cfg)
        requeue = requeue_from_cfg(cfg, limits)
        job_cfg["comment"] = exclusion_comment(cfg, requeue.max_requeues) or cfg.get("comment")
        if limits.time_limit is not None:  # (Slurm keeps limits in whole minutes)
            job_cfg["time"] = str(math.ceil(limits.time_limit / 60))
        img_root = job_dir or self.default_dir(cluster) or os.getcwd()
        replicas: dict[str, SlurmReplicaRequest] = {}
        for role in app.roles:
            for replica_id in range(role.num_replicas):
                name = f"{role.name}-{replica_id}"
                replica_role = _replica_role(role, replica_id, img_root)
                replicas[name] = SlurmReplicaRequest.from_role(name, replica_role, job_cfg, nomem)
        max_retries = max(role.max_retries for role in app.roles)
        first = next(iter(replicas.values()))
        # (explicit: a site's JobRequeue=1 would otherwise requeue a preempted job unasked)
        if max_retries or requeue.max_requeues:
            first.sbatch_opts["requeue"] = None
            first.sbatch_opts["open-mode"] = "append"  # (the batch log of every attempt)
        else:
            first.sbatch_opts["no-requeue"] = None
        warn = limits.signal or (WARN_SIGNAL if requeue.on_timeout else None)
        if warn is not None:  # to the batch shell, which passes a checkpoint signal on
            first.sbatch_opts["signal"] = f"B:{warn}@{math.ceil(limits.grace)}"
        req = SlurmBatchRequest(
            cmd=["sbatch", "--parsable"],
            replicas=replicas,
            job_dir=job_dir,
            max_retries=max_retries,
            app_name=app.name,
            cluster=cluster,
            slurm_bin=self._cluster(cluster).slurm_bin if cluster else None,
            result_replicas=result_replicas(cfg.get(RESULT_REPLICAS_OPT)),
            checkpoint_signal=limits.signal,
            max_requeues=requeue.max_requeues,
            timeout_requeue_in=_timeout_requeue_delay(limits.grace) if requeue.on_timeout else None,
        )
        req.order_components()
        containerize(req, app, resolve_images(app, cfg), self.default_dir(cluster))
        return AppDryRunInfo(req, lambda r: r.materialize())

    def _keep_idempotency_key(
        self, dryrun_info: AppDryRunInfo[SlurmBatchRequest], key: str
    ) -> None:
        """The key's mark goes into every component's comment (after the user's)."""
        req = dryrun_info.request
        req.key = key_token(key)
        mark = key_mark(key)
        for rep in req.replicas.values():
            comment = rep.sbatch_opts.get("comment")
            rep.sbatch_opts["comment"] = f"{comment} {mark}" if comment else mark

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        """Queues the job (in ``job_dir`` if set) and returns its app id. With an idempotency
        key the job is queued held and released only if it is the key's first job; otherwise
        it is cancelled before it ran and the first job's id is returned.

        Raises:
            ValueError: Slurm rejected an option (e.g. an unknown partition): nothing queued.
            RuntimeError: the submission failed (BackendUnavailableError: retry with the key).
        """
        req = dryrun_info.request
        client = self.client(req.cluster)
        workdir = req.job_dir or self.default_dir(req.cluster)
        created = self._prepare_workdir(client, req, workdir)
        stage_images(client.files or LocalFiles(), req.images, req.oci_dir)
        try:
            job_id = client.submit(req, workdir, hold=bool(req.key))
        except SubmitRefusedError as e:
            self._undo_job_dir(client, req.job_dir, created)
            first = next(iter(req.replicas.values()))
            raise submit_error(str(e), dict(first.sbatch_opts)) from None
        except TransportError as e:  # (retryable: a keyed rerun finds what it queued)
            raise BackendUnavailableError(
                f"slurm: the submission may or may not have reached the cluster: {e}"
            ) from e
        if req.key:
            job_id = self._settle_key(client, req.key, job_id)
        app_id = _join(req.cluster, job_id)
        if workdir:
            self._workdirs[app_id] = workdir
        if req.job_dir:
            self._created_job_dirs.discard(req.job_dir)
        log.info("submitted slurm job %s (%d replicas)", app_id, len(req.replicas))
        return app_id

    def _prepare_workdir(
        self, client: SlurmClient, req: SlurmBatchRequest, workdir: str | None
    ) -> bool:
        """Creates the job's directory (``job_dir``, or a cluster's ``remote_dir``) and keeps
        a copy of the script in ``job_dir`` (readable by its owner only). True if this call
        created ``job_dir``."""
        if workdir is None or workdir in self._made_dirs:
            return False
        files = client.files or LocalFiles()
        created = files.mkdir(workdir, parents=True)
        if not req.job_dir:
            self._made_dirs.add(workdir)  # (a cluster's remote_dir: made once per scheduler)
        else:
            files.write(
                posixpath.join(req.job_dir, "shipyard-sbatch.sh"), req.materialize().encode()
            )
        return created

    @staticmethod
    def _undo_job_dir(client: SlurmClient, job_dir: str | None, created: bool) -> None:
        """Removes the ``job_dir`` made for a job that was not queued."""
        if job_dir and created:
            files = client.files or LocalFiles()
            try:
                files.remove(posixpath.join(job_dir, "shipyard-sbatch.sh"))
                files.remove(job_dir)
            except (OSError, TransportError) as e:
                log.debug("could not remove %s: %s", job_dir, e)

    def _settle_key(self, client: SlurmClient, token: str, mine: str) -> str:
        """Decides, among the jobs that carry the key ``token``, which one runs: the first
        (lowest id). Every submitter decides the same; each releases the winner (which also
        finishes a submit whose submitter died before releasing) and cancels its own job if it
        lost, before that job could run."""
        try:
            jobs = client.user_jobs(marked=token)
            winner = _first_with_key(jobs, token) or mine
            client.release(winner)
            if winner != mine:
                comment = next((j.comment for j in jobs.values() if j.submit_id == mine), "")
                client.set_comment(mine, lost_comment(comment))
                client.cancel(mine)
                log.info("job %s lost the race for its key to job %s; cancelled", mine, winner)
        except BaseException:
            client.cancel(mine)  # held: it never ran
            raise
        return winner

    def native_array(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> bool:
        """An app of one role with one replica is one ``sbatch --array`` (a het job cannot be
        an array: an app of several replicas runs as one job per element, under the cap)."""
        return len(app.roles) == 1 and app.roles[0].num_replicas == 1

    def submit_array(
        self,
        app: AppDef,
        cfg: Mapping[str, CfgVal],
        template: tuple[AppDef, list[dict[int, str]]],
        indices: list[int],
        max_parallel: int,
        idempotency_key: str | None = None,
    ) -> tuple[str, list[str]]:
        """One ``sbatch --array=<indices>%<max_parallel>``: each task's app id is Slurm's own
        ``<array job id>_<index>``; the per-element values are set by the batch script from
        ``$SLURM_ARRAY_TASK_ID``."""
        if not self.native_array(app, cfg):
            raise NotImplementedError("slurm: only an app of one replica is a native array")
        info = self.submit_dryrun(template[0], cfg, idempotency_key)
        info.request.array = f"{task_ranges(indices)}%{max_parallel}"
        info.request.array_values = template[1]
        array_id = self.schedule(info)
        return array_id, [f"{array_id}_{i}" for i in indices]

    def native_after(
        self, app_ids: list[str], condition: str, cfg: Mapping[str, CfgVal]
    ) -> dict[str, CfgVal] | None:
        """``--dependency=after<condition>:<ids>`` when every app is a job (or array) of the
        cluster ``cfg`` submits to; else None."""
        cluster = _cfg_cluster(cfg)
        jobs = [_split(a) for a in app_ids]
        if not jobs or any(j is None or j[0] != cluster for j in jobs):
            return None
        return {"dependency": f"after{condition}:" + ":".join(j[1] for j in jobs if j)}

    # -- describing ----------------------------------------------------------------------------

    def _job_infos(self, app_ids: Iterable[str]) -> dict[str, JobInfo]:
        """What Slurm says of ``app_ids``, keyed by app id: one controller call per cluster,
        accounting only for jobs it forgot (or requeued ones that ended)."""
        groups: dict[str | None, list[str]] = {}
        for app_id in dict.fromkeys(app_ids):
            parts = _split(app_id)
            if parts is not None:
                groups.setdefault(parts[0], []).append(parts[1])
        found: dict[str, JobInfo] = {}
        for cluster, ids in groups.items():
            attempts = self._attempts.setdefault(cluster, {})
            infos = describe_jobs(self.client(cluster), ids, attempts)
            keep_off_failed_nodes(
                self.client(cluster), infos, self._kept_off.setdefault(cluster, set())
            )
            for job_id, info in infos.items():
                app_id = _join(cluster, job_id)
                found[app_id] = info
                if info.workdir:
                    self._workdirs[app_id] = info.workdir
        return found

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state, restarts and per-replica states, exit codes and nodes (None if
        Slurm does not know ``app_id``). One controller call while the controller knows it."""
        return self.describe_many([app_id])[app_id]

    def describe_many(self, app_ids: Iterable[str]) -> dict[str, DescribeAppResponse | None]:
        """Describes several jobs with one controller call per cluster (and at most one
        accounting call)."""
        ids = list(app_ids)
        infos = self._job_infos(ids)
        out = {a: (to_response(infos[a], a) if a in infos else None) for a in ids}
        read = {a: info.usage for a, info in infos.items() if info.usage is not None}
        self._add_usage([r for r in out.values() if r is not None], read)
        return out

    def _add_usage(
        self, responses: list[DescribeAppResponse], read: dict[str, outcome.Usage]
    ) -> None:
        """Each ended job's replica usage from accounting: ``read`` with its state already
        (a job the controller forgot), else one ``sacct`` per cluster for the jobs whose usage
        is not complete yet (then remembered)."""
        ended = [r for r in responses if is_terminal(r.state)]
        asking: dict[str | None, list[str]] = {}
        for resp in ended:
            parts = _split(resp.app_id)
            if resp.app_id not in self._usage and resp.app_id not in read and parts is not None:
                asking.setdefault(parts[0], []).append(parts[1])
        fetched: dict[str, outcome.Usage] = {}
        for cluster, job_ids in asking.items():
            found = outcome.fetch_usage(self.client(cluster), job_ids) or {}
            fetched.update({_join(cluster, j): u for j, u in found.items()})
        for resp in ended:
            usage = (
                self._usage.get(resp.app_id) or read.get(resp.app_id) or fetched.get(resp.app_id)
            )
            if usage is None:
                continue
            if outcome.complete(resp, usage):
                self._usage[resp.app_id] = usage
            outcome.apply_usage(resp, usage)

    def read_results(self, app_id: str) -> list[ReplicaResult]:
        """The replicas' results, from the job's result directory on the cluster."""
        parts = _split(app_id)
        desc = self.describe(app_id) if parts is not None else None
        workdir = self._workdirs.get(app_id)
        if parts is None or desc is None or not workdir:
            raise ValueError(f"app_id: slurm does not know job {app_id!r}")
        files = _files_or_fail(self.client(parts[0]), parts[0], "results")
        replicas = [(rs.role, r.id) for rs in desc.roles_statuses for r in rs.replicas]
        return outcome.read_results(files, workdir, parts[1], replicas)

    def preflight(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> list[Problem]:
        """``sbatch --test-only`` of each component (partition, constraint, time, resources),
        with its estimated start time (an ``info`` problem), and every role's entrypoint on
        the submit host (see :mod:`.checks`; slurmrestd: the partition and its memory)."""
        req = dryrun_info.request
        if req is None:
            return []
        client = self.client(req.cluster)
        workdir = req.job_dir or self.default_dir(req.cluster)
        in_job_dir = not req.job_dir  # a job_dir is made at submit: not there yet
        if workdir and not (client.files or LocalFiles()).exists(workdir):
            workdir, in_job_dir = self.default_dir(req.cluster), False
        return checks.preflight(client, dryrun_info.app, req, workdir, in_job_dir)

    def list(self, cfg: Mapping[str, CfgVal] | None = None) -> list[ListAppResponse]:
        """The user's Slurm jobs on the cluster of ``cfg`` (default this host's): those the
        controller knows plus today's from accounting."""
        cluster = _cfg_cluster(cfg or {})
        client = self.client(cluster)
        out = {a: app_state(j.state) for a, j in client.user_accounting("now-1days").items()}
        out.update({a: app_state(j.state) for a, j in client.user_jobs().items()})
        ordered = sorted(out.items(), key=lambda kv: [int(n) for n in kv[0].split("_")])
        return [ListAppResponse(app_id=_join(cluster, a), state=s) for a, s in ordered]

    def find_by_idempotency_key(
        self, key: str, cfg: Mapping[str, CfgVal] | None = None
    ) -> str | None:
        """The job submitted with idempotency ``key`` (stored in its comment) on the cluster of
        ``cfg``. A job still held because its submitter died before releasing it is released
        (the retry finishes that submit)."""
        cluster = _cfg_cluster(cfg or {})
        client = self.client(cluster)
        token = key_token(key)
        jobs = client.user_jobs(marked=token)
        winner = _first_with_key(jobs, token)
        if winner is None:
            winner = _first_with_key(client.user_accounting("now-30days"), token)
        if winner is None:
            return None
        if any(j.held for j in jobs.values() if j.submit_id == winner):
            client.release(winner)
        return _join(cluster, winner)

    # -- cancelling ----------------------------------------------------------------------------

    def cancel(self, app_id: str) -> None:
        """Cancels the job (every component). Idempotent: cancelling a job that ended or that
        Slurm does not know does nothing."""
        parts = _split(app_id)
        if parts is not None:
            self.client(parts[0]).cancel(parts[1])

    def _cancel_existing(self, app_id: str) -> None:
        self.cancel(app_id)

    # -- logs ----------------------------------------------------------------------------------

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Lines of ``slurm-<job id>-<role>-<k>.out`` (stdout, the default) or ``.err``
        (stderr) in the job's directory, found through Slurm and read from the cluster's
        files. ``since``/``until`` are ignored (lines carry no times); with ``should_tail``
        it follows the file until the job ends.

        Raises:
            ValueError: for ``streams=combined`` (stdout and stderr are separate files), if
                Slurm does not know the job, or if the cluster's files cannot be read.
        """
        stream = check_stream(streams, [Stream.STDOUT, Stream.STDERR])
        parts = _split(app_id)
        if parts is None:
            raise ValueError(f"app_id: not a slurm app id: {app_id!r}")
        cluster, job_id = parts
        files = _files_or_fail(self.client(cluster), cluster, "logs")
        if app_id not in self._workdirs:
            self._job_infos([app_id])
        workdir = self._workdirs.get(app_id)
        if workdir is None:
            raise ValueError(f"app_id: slurm does not know job {app_id!r}")
        ext = "err" if stream == Stream.STDERR else "out"
        path = posixpath.join(workdir, f"slurm-{job_id}-{role_name}-{k}.{ext}")
        lines = read_lines(files, path, self._terminal_check(app_id) if should_tail else None)
        return filter_regex(regex, lines)

    def _terminal_check(self, app_id: str) -> Callable[[], bool]:
        return lambda: self._tails.ended(app_id)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


# -----------------------------------------------------------------------------------------------
# helpers
# -----------------------------------------------------------------------------------------------


def _tail_ended(desc: DescribeAppResponse | None) -> bool:
    return desc is None or is_terminal(desc.state)


def _make_client(config: ClusterConfig | None) -> SlurmClient:
    if config is None:
        return CommandClient(LocalShell())
    if config.transport == "local":
        return CommandClient(LocalShell(config.slurm_bin), config.remote_dir)
    if config.transport == "ssh":
        from core.schedulers.slurm.ssh import SSHShell

        return CommandClient(SSHShell(config))
    from core.schedulers.slurm.rest import RestClient

    files: Files | None = None
    if config.local_mount:
        files = LocalFiles(config.remote_dir, config.local_mount)
    elif config.host:
        from core.schedulers.slurm.ssh import SFTPFiles, connection

        files = SFTPFiles(connection(config))
    return RestClient(config, files)


def _home(client: SlurmClient) -> str:
    home = client.home()
    if home is None:
        raise ClusterError("remote_dir: an absolute directory is required for this cluster")
    return home


def _files_or_fail(client: SlurmClient, cluster: str | None, what: str) -> Files:
    if client.files is None:
        raise ValueError(
            f"cluster {cluster!r}: {what} cannot be read or written: slurmrestd has no file"
            " access; set host (SSH/SFTP to a login node) or local_mount (remote_dir mounted"
            " here) in its settings"
        )
    return client.files


def _upload(files: Files, workspace: str, job_dir: str) -> int:
    made = {job_dir}
    count = 0
    for fs, src, rel in walk_workspace(workspace):
        dst = posixpath.join(job_dir, rel)
        parent = posixpath.dirname(dst)
        for d in _parents(parent, job_dir):
            if d not in made:
                files.mkdir(d, 0o700)
                made.add(d)
        with fs.open(src, "rb") as f:
            data = f.read()
        mode = 0o700 if os.access(src, os.X_OK) else 0o600
        files.write(dst, data, mode)
        count += 1
    return count


def _parents(path: str, stop: str) -> list[str]:
    out: list[str] = []
    while path != stop and path.startswith(stop + "/"):
        out.append(path)
        path = posixpath.dirname(path)
    return out[::-1]


def _replica_role(role: Role, replica_id: int, img_root: str) -> Role:
    values = macros.Values(
        img_root=img_root, app_id=macros.app_id, replica_id=str(replica_id), rank0_env=RANK0_ENV
    )
    replica_role = values.apply(role)
    replica_role.env.update(
        {
            "SHIPYARD_APP_ID": macros.app_id,
            "SHIPYARD_ROLE_NAME": role.name,
            "SHIPYARD_REPLICA_ID": str(replica_id),
            "SHIPYARD_NUM_REPLICAS": str(role.num_replicas),
        }
    )
    return replica_role


def _timeout_requeue_delay(grace: float) -> int:
    """Seconds from the checkpoint signal to the requeue that beats the time limit: what is
    left of ``grace`` less a margin (10 s, or half a shorter grace) for the steps to end."""
    return max(1, math.floor(grace - min(10.0, grace / 2)))


def _first_with_key(jobs: Mapping[str, JobInfo], token: str) -> str | None:
    """The first-submitted (lowest) job id among ``jobs`` that carry the key ``token`` (an
    array's tasks count as their array job)."""
    ids = {int(j.submit_id) for j in jobs.values() if comment_key(j.comment) == token}
    return str(min(ids)) if ids else None


def _split(app_id: str) -> tuple[str | None, str] | None:
    m = _APP_ID_RE.fullmatch(app_id) if isinstance(app_id, str) else None
    return (m.group("cluster"), m.group("job")) if m else None


def _join(cluster: str | None, job_id: str) -> str:
    return f"{cluster}:{job_id}" if cluster else job_id


def _cfg_cluster(cfg: Mapping[str, CfgVal]) -> str | None:
    value = cfg.get("cluster")
    return str(value) if value else None


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    """The ``slurm`` scheduler factory (entry point ``shipyard.schedulers``)."""
    return SlurmScheduler(session_name, **kwargs)
