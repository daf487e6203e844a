"""How the ``slurm`` scheduler talks to a cluster: the :class:`SlurmClient` interface, and its
implementation over Slurm's commands (:class:`CommandClient`), which run on this host
(:class:`LocalShell`) or on a login node over SSH (``ssh.SSHShell``). slurmrestd is the other
implementation (``rest.RestClient``).

A client also gives the scheduler the cluster's files (:class:`Files`): logs to read, job
directories to write. Everything here raises :class:`TransportError` when the cluster cannot be
reached, never a job state.
"""

from __future__ import annotations

import abc
import logging
import os
import posixpath
import shlex
from dataclasses import dataclass
from typing import Protocol

from core.errors import ShipyardError
from core.schedulers.slurm.jobinfo import (
    SACCT_FIELDS,
    SEP,
    SQUEUE_FORMAT,
    JobInfo,
    array_query_ids,
    parse_sacct,
    parse_squeue,
)
from core.schedulers.slurm.script import SlurmBatchRequest
from core.schedulers.slurm.usage import ACCOUNTING_FIELDS, parse_usage, split_accounting
from core.transient import BackendUnavailableError

log = logging.getLogger(__name__)

__all__ = [
    "CommandClient",
    "CommandResult",
    "Files",
    "LocalFiles",
    "LocalShell",
    "Reader",
    "Shell",
    "SlurmClient",
    "SubmitRefusedError",
    "TransportError",
    "submit_error",
]


class TransportError(BackendUnavailableError):
    """The cluster could not be reached (after retries): nothing is known about the job."""


class AccountingUnavailableError(TransportError):
    """The cluster's accounting (slurmdbd) did not answer; the controller may still have."""


class SubmitRefusedError(ShipyardError, RuntimeError):
    """Slurm refused the job (``str()`` is its message): nothing was queued."""


#: the Slurm commands Shipyard runs (from the cluster's ``slurm_bin`` where it has one)
SLURM_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun"})


@dataclass
class CommandResult:
    """What a command printed and how it ended."""

    returncode: int
    stdout: str
    stderr: str


class Reader(Protocol):
    """An open file being read from an offset on: ``read(size)`` gives the next bytes (empty
    at the file's current end; later calls see what was appended since)."""

    def read(self, size: int) -> bytes: ...

    def close(self) -> None: ...


class Files(abc.ABC):
    """The cluster's files, as the scheduler needs them."""

    @abc.abstractmethod
    def open_reader(self, path: str, offset: int = 0) -> Reader | None:
        """``path`` opened for reading from ``offset``; None if the file does not exist."""

    @abc.abstractmethod
    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Writes ``path`` (created with ``mode``, readable by the owner only by default)."""

    @abc.abstractmethod
    def put(self, local: str, path: str, mode: int = 0o600) -> None:
        """Copies this host's file ``local`` to ``path`` (streamed: it may be large)."""

    @abc.abstractmethod
    def mkdir(self, path: str, mode: int = 0o700, parents: bool = False) -> bool:
        """Creates directory ``path``; False if it already exists."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """True if ``path`` exists."""

    @abc.abstractmethod
    def remove(self, path: str) -> None:
        """Removes a file or an empty directory (nothing if it does not exist)."""


class LocalFiles(Files):
    """Files of this host (optionally a cluster's directory mounted here: ``prefix`` is the
    cluster's path of ``mount``)."""

    def __init__(self, prefix: str | None = None, mount: str | None = None) -> None:
        self._prefix = prefix.rstrip("/") if prefix else None
        self._mount = mount

    def _local(self, path: str) -> str:
        if self._prefix and self._mount and (path + "/").startswith(self._prefix + "/"):
            return self._mount + path[len(self._prefix) :]
        return path

    def open_reader(self, path: str, offset: int = 0) -> Reader | None:
        try:
            f = open(self._local(path), "rb")  # noqa: SIM115 (the caller closes it)
        except FileNotFoundError:
            return None
        f.seek(offset)
        return f

    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        fd = os.open(self._local(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def put(self, local: str, path: str, mode: int = 0o600) -> None:
        import shutil  # (here: it loads bz2 and lzma, a start-up cost for every command)

        fd = os.open(self._local(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as dst, open(local, "rb") as src:
            shutil.copyfileobj(src, dst, 1 << 20)

    def mkdir(self, path: str, mode: int = 0o700, parents: bool = False) -> bool:
        local = self._local(path)
        try:
            if parents:
                os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            os.mkdir(local, mode)
            return True
        except FileExistsError:
            return False

    def exists(self, path: str) -> bool:
        return os.path.exists(self._local(path))

    def remove(self, path: str) -> None:
        local = self._local(path)
        try:
            os.rmdir(local) if os.path.isdir(local) else os.remove(local)
        except FileNotFoundError:
            pass


class Shell(abc.ABC):
    """Runs commands on the cluster's submit host."""

    files: Files
    #: the directory of Slurm's commands (None: found on ``PATH``)
    slurm_bin: str | None = None

    def slurm_argv(self, argv: list[str]) -> list[str]:
        """``argv`` with a Slurm command (``sbatch``) taken from :attr:`slurm_bin`."""
        if self.slurm_bin and argv and argv[0] in SLURM_COMMANDS:
            return [posixpath.join(self.slurm_bin, argv[0]), *argv[1:]]
        return argv

    @abc.abstractmethod
    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        cwd: str | None = None,
        timeout: float = 60,
        retry: bool = True,
    ) -> CommandResult:
        """Runs ``argv`` (never through a local shell; remote shells get it quoted).

        ``retry``: the command may be run again if the connection drops (False for commands
        that must not run twice, such as ``sbatch``).

        Raises:
            TransportError: the command could not be run (not: it ran and failed).
        """

    def home(self) -> str:
        """The submit host's home directory of the user commands run as."""
        return os.path.expanduser("~")

    def close(self) -> None:  # noqa: B027 (nothing to free, unless a shell says otherwise)
        """Frees the shell's resources (shared connections stay open for other users)."""


class LocalShell(Shell):
    """This host's Slurm commands (today's default: no cluster configured)."""

    def __init__(self, slurm_bin: str | None = None) -> None:
        self.files = LocalFiles()
        self.slurm_bin = slurm_bin

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        cwd: str | None = None,
        timeout: float = 60,
        retry: bool = True,
    ) -> CommandResult:
        argv = self.slurm_argv(argv)
        import subprocess  # (lazily: start-up)

        try:
            p = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )
        except FileNotFoundError as e:
            raise TransportError(f"{argv[0]}: not found ({e.strerror}); is Slurm installed?") from e
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TransportError(f"{argv[0]} could not be run: {e}") from e
        return CommandResult(p.returncode, p.stdout, p.stderr)


def remote_command(argv: list[str], cwd: str | None = None) -> str:
    """``argv`` as one quoted command line for a remote shell (in ``cwd`` if given)."""
    line = shlex.join(argv)
    return f"cd {shlex.quote(cwd)} && exec {line}" if cwd else line


class SlurmClient(abc.ABC):
    """What the scheduler asks of a cluster. Job ids here are plain Slurm job ids."""

    #: the cluster's files (None: this client cannot read them, e.g. REST without SSH)
    files: Files | None
    #: where jobs without a ``job_dir`` run (None: the directory the submitter is in)
    default_workdir: str | None = None

    @abc.abstractmethod
    def submit(self, req: SlurmBatchRequest, workdir: str | None, hold: bool) -> str:
        """Queues the app's job (held if ``hold``) in ``workdir`` and returns the job id.

        Raises:
            SubmitRefusedError: Slurm refused the job: nothing was queued.
            TransportError: the cluster could not be reached.
        """

    @abc.abstractmethod
    def controller_jobs(self, job_ids: list[str]) -> tuple[dict[str, JobInfo], str | None]:
        """What the controller knows of ``job_ids``, and why asking failed (None if it did
        not: a job the controller forgot is simply left out)."""

    @abc.abstractmethod
    def accounting_jobs(self, job_ids: list[str]) -> dict[str, JobInfo] | None:
        """What accounting knows of ``job_ids`` (None if the cluster has no accounting); a
        client that reads usage in the same call sets each job's ``usage``.

        Raises:
            AccountingUnavailableError: accounting did not answer.
        """

    @abc.abstractmethod
    def user_jobs(self, marked: str | None = None) -> dict[str, JobInfo]:
        """Every job of the user that the controller knows (any state); with ``marked``, only
        those whose comment holds that text (an idempotency key's mark: a user may have tens of
        thousands of jobs, a key a few)."""

    @abc.abstractmethod
    def user_accounting(self, since: str) -> dict[str, JobInfo]:
        """The user's jobs in accounting since ``since`` (``now-30days``): allocations only."""

    @abc.abstractmethod
    def release(self, job_id: str) -> None:
        """Releases a held job (nothing if it is not held)."""

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancels a job; nothing if it ended or is unknown."""

    @abc.abstractmethod
    def set_comment(self, job_id: str, comment: str) -> None:
        """Replaces the job's comment."""

    @abc.abstractmethod
    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        """Keeps a pending job off ``nodes`` (a Slurm node list)."""

    @abc.abstractmethod
    def partitions(self) -> tuple[dict[str, int], str | None]:
        """Each partition's smallest node RealMemory (MB), and the default partition."""

    @abc.abstractmethod
    def version(self) -> str:
        """Reaches the cluster once and says what answered (``slurm 26.05.3``...).

        Raises:
            TransportError: the cluster could not be reached.
        """

    def home(self) -> str | None:
        """The home directory of the user jobs run as (None where the client cannot tell)."""
        return None

    def close(self) -> None:  # noqa: B027 (nothing to free, unless a client says otherwise)
        """Frees what the client holds."""


class CommandClient(SlurmClient):
    """Slurm's own commands (``sbatch``, ``squeue``, ``sacct``, ``scontrol``, ``scancel``,
    ``sinfo``), run by ``shell`` on this host or on a login node."""

    def __init__(self, shell: Shell, default_workdir: str | None = None) -> None:
        self.shell = shell
        self.files = shell.files
        self.default_workdir = default_workdir

    def version(self) -> str:
        p = self.shell.run(["sinfo", "--version"], timeout=30)
        if p.returncode != 0:
            raise TransportError(f"sinfo --version: {(p.stderr or p.stdout).strip()}")
        return p.stdout.strip()

    def submit(self, req: SlurmBatchRequest, workdir: str | None, hold: bool) -> str:
        argv = ["sbatch", "--parsable", *(["--hold"] if hold else [])]
        # the script goes on stdin: its environment values must stay off every command line
        p = self.shell.run(argv, stdin=req.materialize(), cwd=workdir, retry=False)
        if p.returncode != 0:
            raise SubmitRefusedError(p.stderr.strip() or p.stdout.strip())
        job_id = p.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise RuntimeError(f"sbatch: unexpected output {p.stdout!r}")
        return job_id

    def controller_jobs(self, job_ids: list[str]) -> tuple[dict[str, JobInfo], str | None]:
        # (-r: one row per array task, also of those still pending)
        query = ",".join(array_query_ids(job_ids))
        argv = ["squeue", "-h", "-r", "-t", "all", "-j", query, "-O", SQUEUE_FORMAT]
        try:
            p = self.shell.run(argv)
        except TransportError as e:
            return {}, str(e)
        if p.returncode != 0:
            if "Invalid job id" in p.stderr:
                return {}, None
            log.warning("squeue failed: %s", p.stderr.strip())
            return {}, p.stderr.strip() or f"exit code {p.returncode}"
        wanted = set(job_ids)
        return {k: v for k, v in parse_squeue(p.stdout).items() if k in wanted}, None

    def accounting_jobs(self, job_ids: list[str]) -> dict[str, JobInfo] | None:
        """The jobs' records with their usage (``JobInfo.usage``), from one ``sacct``."""
        fields = ",".join(ACCOUNTING_FIELDS)
        argv = [
            "sacct",
            "-n",
            "-P",
            "-D",
            f"--delimiter={SEP}",
            "-j",
            ",".join(array_query_ids(job_ids)),
            "-o",
            fields,
        ]
        try:
            p = self.shell.run(argv)
        except TransportError as e:
            raise AccountingUnavailableError(f"sacct: {e}") from e
        if p.returncode != 0:
            if "accounting storage is disabled" in p.stderr:
                return None  # a cluster without accounting
            # (its last line says why: "Problem talking to the database: Connection refused")
            raise AccountingUnavailableError(
                "sacct: " + "".join(p.stderr.strip().splitlines()[-1:])
            )
        records, usage_rows = split_accounting(p.stdout)
        jobs = parse_sacct(records)
        usage = parse_usage(usage_rows)
        for job_id, info in jobs.items():
            info.usage = usage.get(job_id, {})
        return jobs

    def user_jobs(self, marked: str | None = None) -> dict[str, JobInfo]:
        p = self.shell.run(["squeue", "-h", "-r", "-t", "all", "--me", "-O", SQUEUE_FORMAT])
        if p.returncode != 0:
            return {}
        out = p.stdout
        if marked is not None:  # (the comment is the row's last field)
            out = "\n".join(line for line in out.splitlines() if marked in line)
        return parse_squeue(out)

    def user_accounting(self, since: str) -> dict[str, JobInfo]:
        fields = ",".join(SACCT_FIELDS)
        argv = ["sacct", "-n", "-P", "-X", f"--delimiter={SEP}", "-S", since, "-o", fields]
        p = self.shell.run(argv)
        return parse_sacct(p.stdout) if p.returncode == 0 else {}

    def release(self, job_id: str) -> None:
        p = self.shell.run(["scontrol", "release", job_id])
        if p.returncode != 0:
            log.debug("scontrol release %s: %s", job_id, p.stderr.strip())

    def cancel(self, job_id: str) -> None:
        p = self.shell.run(["scancel", job_id])
        if p.returncode != 0:
            err = p.stderr.strip()
            if "already completing or completed" in err or "Invalid job id" in err:
                log.debug("scancel %s: %s", job_id, err)
                return
            raise RuntimeError(f"scancel {job_id} failed: {err}")

    def set_comment(self, job_id: str, comment: str) -> None:
        p = self.shell.run(["scontrol", "update", f"JobId={job_id}", f"Comment={comment}"])
        if p.returncode != 0:
            log.debug("scontrol update %s: %s", job_id, p.stderr.strip())

    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        p = self.shell.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}"])
        if p.returncode != 0:
            raise RuntimeError(f"scontrol update {job_id} ExcNodeList: {p.stderr.strip()}")

    def partitions(self) -> tuple[dict[str, int], str | None]:
        p = self.shell.run(["sinfo", "-h", "-o", f"%P{SEP}%m"], timeout=30)
        memory: dict[str, int] = {}
        default = None
        for line in p.stdout.splitlines():
            name, _, mem = line.partition(SEP)
            if name.endswith("*"):
                name = name[:-1]
                default = name
            try:
                value = int(mem.strip().rstrip("+"))
            except ValueError:
                continue
            # a partition whose nodes differ is listed once per kind of node: keep the least
            memory[name] = min(value, memory.get(name, value))
        return memory, default

    def home(self) -> str | None:
        return self.shell.home()

    def close(self) -> None:
        self.shell.close()


def submit_error(message: str, cfg: dict[str, object]) -> Exception:
    """The error to raise for a refused submission: a ``ValueError`` naming the option when
    the message says which one, a ``BackendUnavailableError`` (retryable) when the controller
    did not answer, else a ``RuntimeError``."""
    low = message.lower()
    for key, needle in (
        ("partition", "partition"),
        ("time", "time limit"),
        ("constraint", "feature"),
        ("mail-user", "mail"),
    ):
        if needle in low:
            return ValueError(f"cfg.{key}: sbatch rejected {cfg.get(key)!r}: {message}")
    if "memory" in low:
        return ValueError(f"resource.memMB: sbatch rejected the memory request: {message}")
    if any(n in low for n in ("unable to contact slurm controller", "temporarily unable")):
        return BackendUnavailableError(
            f"slurm: the controller did not take the job, nothing was queued: {message}"
        )
    if "timed out" in low:  # (it may have queued it before the answer was lost)
        return BackendUnavailableError(
            f"slurm: the submission may or may not have reached the cluster: {message}"
        )
    return RuntimeError(f"sbatch failed, nothing was queued: {message}")
