"""Slurm's commands on a login node over SSH, and the cluster's files over SFTP (asyncssh).

asyncssh was chosen because it is asynchronous at heart (the Airflow trigger and Prefect's async
tasks run in event loops), multiplexes any number of commands and an SFTP session over one
connection, and reads ``~/.ssh/config`` the way ``ssh`` does (aliases, ``ProxyJump``,
``IdentityFile``, ``UserKnownHostsFile``). Synchronous callers (the scheduler API) hand their
coroutines to one event-loop thread per process (:class:`_LoopThread`).

One connection per cluster per process (:func:`connection`), reused by every call; a dropped
connection is re-established and idempotent commands are retried with backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import asyncssh
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from core.clusters import ClusterConfig, ClusterError
from core.errors import ShipyardError
from core.schedulers.slurm.transport import (
    CommandResult,
    Files,
    Reader,
    Shell,
    TransportError,
    remote_command,
)

log = logging.getLogger(__name__)

# asyncssh logs every channel it opens at INFO: one line per Slurm command would flood task
# logs. Quiet unless the application set asyncssh's level itself.
if logging.getLogger("asyncssh").level == logging.NOTSET:
    logging.getLogger("asyncssh").setLevel(logging.WARNING)

__all__ = ["SFTPFiles", "SSHConnection", "SSHShell", "connection"]

T = TypeVar("T")

#: channels open at once on one connection (OpenSSH's MaxSessions defaults to 10)
MAX_CHANNELS = 8
_CONNECT_TIMEOUT = 20.0
_RETRIES = 4


class _LoopThread:
    """The event loop, in a daemon thread, that runs this process's SSH connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # (a forked child starts anew)
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="shipyard-ssh", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Starts ``coro`` on the loop; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Runs ``coro`` on the loop and waits for its result."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise


_LOOP = _LoopThread()


class _TransientError(ShipyardError):
    """A failure worth another try (the connection dropped, a channel could not open)."""


class SSHConnection:
    """The SSH connection to one cluster's login node (use :func:`connection`)."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._lock: asyncio.Lock | None = None
        self._channels: asyncio.Semaphore | None = None
        self._home: str | None = None

    # -- connecting -------------------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        c = self.cluster
        opts: dict[str, Any] = {"connect_timeout": _CONNECT_TIMEOUT, "keepalive_interval": 30}
        if c.port:
            opts["port"] = c.port
        if c.user:
            opts["username"] = c.user
        if c.private_key is not None:
            opts["client_keys"] = [asyncssh.import_private_key(c.private_key.get_secret_value())]
        elif c.identity_file:
            opts["client_keys"] = [c.identity_file]
        if c.known_hosts == "accept-new":
            opts["known_hosts"] = self._accept_new_known_hosts()
        elif c.known_hosts:
            opts["known_hosts"] = c.known_hosts
        return opts

    def _accept_new_known_hosts(self) -> str | None:
        """``known_hosts: accept-new``: ssh's own known_hosts if it knows the host (a changed
        key is then refused), else no check now and the key recorded after connecting."""
        path = os.path.expanduser("~/.ssh/known_hosts")
        try:
            known = asyncssh.read_known_hosts(path)
        except (OSError, ValueError):
            return None
        c = self.cluster
        matches = known.match(c.host or "", "", c.port or 22)
        return path if any(matches[:3]) else None

    def _record_host_key(self, conn: asyncssh.SSHClientConnection) -> None:
        key = conn.get_server_host_key()
        c = self.cluster
        if c.known_hosts != "accept-new" or key is None or self._accept_new_known_hosts():
            return
        host = c.host if (c.port or 22) == 22 else f"[{c.host}]:{c.port}"
        path = os.path.expanduser("~/.ssh/known_hosts")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        line = f"{host} {key.export_public_key('openssh').decode().strip()}\n"
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
        log.info("cluster %s: recorded the host key of %s in %s", c.name, host, path)

    async def _connect(self) -> asyncssh.SSHClientConnection:
        c = self.cluster
        where = f"{c.user + '@' if c.user else ''}{c.host}{':' + str(c.port) if c.port else ''}"
        try:
            conn = await asyncssh.connect(c.host or "", **self._options())
        except asyncssh.HostKeyNotVerifiable as e:
            raise ClusterError(
                f"cluster {c.name!r}: known_hosts: the host key of {where} is not trusted"
                f" ({e.reason}); add it to {c.known_hosts or '~/.ssh/known_hosts'} or set"
                " known_hosts: accept-new"
            ) from None
        except asyncssh.PermissionDenied:
            key = c.identity_file or ("private_key" if c.private_key else "ssh's default keys")
            raise ClusterError(
                f"cluster {c.name!r}: identity_file: {where} refused the key ({key})"
            ) from None
        except (TimeoutError, OSError, asyncssh.Error) as e:
            raise _TransientError(f"cannot reach {where}: {e or type(e).__name__}") from e
        self._record_host_key(conn)
        log.debug("cluster %s: connected to %s", c.name, where)
        return conn

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._lock is None:
            self._lock = asyncio.Lock()
            self._channels = asyncio.Semaphore(MAX_CHANNELS)
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                self._conn, self._sftp = await self._connect(), None
            return self._conn

    async def _drop(self, conn: asyncssh.SSHClientConnection) -> None:
        if self._conn is conn:
            self._conn, self._sftp = None, None
            conn.close()

    # -- calls --------------------------------------------------------------------------------

    async def _run(self, command: str, stdin: str | None, timeout: float) -> CommandResult:
        conn = await self._connection()
        assert self._channels is not None
        try:
            async with self._channels:
                p = await conn.run(command, input=stdin, check=False, timeout=timeout)
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as e:
            await self._drop(conn)
            raise _TransientError(f"connection lost: {e}") from e
        except asyncssh.ChannelOpenError as e:
            raise _TransientError(f"cannot open a channel: {e}") from e
        except asyncssh.TimeoutError as e:
            raise TransportError(f"{command.split()[0]} timed out after {timeout}s") from e
        out, err = p.stdout, p.stderr
        return CommandResult(
            p.exit_status if p.exit_status is not None else 255,
            out if isinstance(out, str) else (out or b"").decode(errors="replace"),
            err if isinstance(err, str) else (err or b"").decode(errors="replace"),
        )

    async def _sftp_client(self) -> asyncssh.SFTPClient:
        conn = await self._connection()
        if self._sftp is None:
            try:
                self._sftp = await conn.start_sftp_client()
            except (asyncssh.Error, OSError) as e:
                await self._drop(conn)
                raise _TransientError(f"cannot start SFTP: {e}") from e
        return self._sftp

    def call(self, make: Any, timeout: float | None = 120, retry: bool = True) -> Any:
        """Runs ``make()`` (a coroutine factory) on the SSH loop; transient failures are
        retried with backoff (``retry``), then raised as :class:`TransportError`."""
        attempts = _RETRIES if retry else 1
        retrying = Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception_type(_TransientError),
            reraise=False,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return _LOOP.run(make(), timeout)
        except RetryError as e:
            cause = e.last_attempt.exception()
            raise TransportError(f"cluster {self.cluster.name!r}: {cause}") from cause
        except TimeoutError as e:
            raise TransportError(f"cluster {self.cluster.name!r}: no answer in {timeout}s") from e
        raise AssertionError("unreachable")

    def run(self, command: str, stdin: str | None, timeout: float, retry: bool) -> CommandResult:
        """Runs a (quoted) command line on the login node."""
        return self.call(lambda: self._run(command, stdin, timeout), timeout + 30, retry)  # type: ignore[no-any-return]

    def home(self) -> str:
        """The login user's home directory (asked once)."""
        if self._home is None:

            async def realpath() -> str:
                sftp = await self._sftp_client()
                return str(await sftp.realpath("."))

            self._home = self.call(realpath)
        return self._home

    def sftp(self, op: Any) -> Any:
        """Runs ``op(sftp_client)`` (a coroutine function) with retries."""

        async def run() -> Any:
            sftp = await self._sftp_client()
            try:
                return await op(sftp)
            except asyncssh.SFTPError:
                raise
            except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as e:
                self._sftp = None
                raise _TransientError(f"SFTP failed: {e}") from e

        return self.call(run)


class _Registry:
    """This process's SSH connections, one per cluster configuration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[ClusterConfig, SSHConnection] = {}
        self._pid = os.getpid()

    def get(self, cluster: ClusterConfig) -> SSHConnection:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's connections are not its
                self._connections, self._pid = {}, os.getpid()
            conn = self._connections.get(cluster)
            if conn is None:
                conn = self._connections[cluster] = SSHConnection(cluster)
            return conn


_CONNECTIONS = _Registry()


def connection(cluster: ClusterConfig) -> SSHConnection:
    """The process's connection to ``cluster``'s login node (made on first use)."""
    return _CONNECTIONS.get(cluster)


class SFTPFiles(Files):
    """The cluster's files over SFTP."""

    def __init__(self, conn: SSHConnection) -> None:
        self._conn = conn

    def open_reader(self, path: str, offset: int = 0) -> Reader | None:
        async def op(sftp: asyncssh.SFTPClient) -> asyncssh.SFTPClientFile | None:
            try:
                return await sftp.open(path, "rb")
            except asyncssh.SFTPNoSuchFile:
                return None

        f = self._conn.sftp(op)
        return None if f is None else _SFTPReader(self._conn, f, offset)

    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        async def op(sftp: asyncssh.SFTPClient) -> None:
            attrs = asyncssh.SFTPAttrs(permissions=mode)
            async with sftp.open(path, "wb", attrs) as f:
                await f.write(data)
            await sftp.chmod(path, mode)

        self._conn.sftp(op)

    def put(self, local: str, path: str, mode: int = 0o600) -> None:
        async def op(sftp: asyncssh.SFTPClient) -> None:
            await sftp.put(local, path)
            await sftp.chmod(path, mode)

        self._conn.sftp(op)

    def mkdir(self, path: str, mode: int = 0o700, parents: bool = False) -> bool:
        async def op(sftp: asyncssh.SFTPClient) -> bool:
            if parents:
                parent = path.rsplit("/", 1)[0]
                if parent and not await sftp.exists(parent):
                    await sftp.makedirs(parent, asyncssh.SFTPAttrs(permissions=0o700))
            try:
                await sftp.mkdir(path, asyncssh.SFTPAttrs(permissions=mode))
                return True
            except asyncssh.SFTPFailure:
                if await sftp.exists(path):
                    return False
                raise

        return self._conn.sftp(op)  # type: ignore[no-any-return]

    def exists(self, path: str) -> bool:
        async def op(sftp: asyncssh.SFTPClient) -> bool:
            return bool(await sftp.exists(path))

        return self._conn.sftp(op)  # type: ignore[no-any-return]

    def remove(self, path: str) -> None:
        async def op(sftp: asyncssh.SFTPClient) -> None:
            try:
                if await sftp.isdir(path):
                    await sftp.rmdir(path)
                else:
                    await sftp.remove(path)
            except asyncssh.SFTPNoSuchFile:
                pass

        self._conn.sftp(op)


class _SFTPReader:
    """Reads an SFTP file from an offset on, one chunk per call (asyncssh asks for the chunk's
    blocks in parallel). No read-ahead: the next chunk's transfer and this one's line split
    contend for the GIL, and asking ahead made the remote bench rows' log_iter slower."""

    def __init__(self, conn: SSHConnection, f: asyncssh.SFTPClientFile, offset: int) -> None:
        self._conn = conn
        self._f = f
        self._offset = offset

    def read(self, size: int) -> bytes:
        async def read() -> bytes:
            data = await self._f.read(size, self._offset)
            return data if isinstance(data, bytes) else data.encode()

        try:
            data = _LOOP.run(read(), 120)
        except (asyncssh.Error, OSError, TimeoutError) as e:
            raise TransportError(f"cluster {self._conn.cluster.name!r}: reading failed: {e}") from e
        self._offset += len(data)
        return data

    def close(self) -> None:
        try:
            _LOOP.run(self._f.close(), 30)
        except (asyncssh.Error, OSError, TimeoutError) as e:
            log.debug("closing a remote file: %s", e)


class SSHShell(Shell):
    """Runs Slurm's commands on ``cluster``'s login node."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self._conn = connection(cluster)
        self.files = SFTPFiles(self._conn)
        self.slurm_bin = cluster.slurm_bin

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        cwd: str | None = None,
        timeout: float = 60,
        retry: bool = True,
    ) -> CommandResult:
        return self._conn.run(remote_command(self.slurm_argv(argv), cwd), stdin, timeout, retry)

    def home(self) -> str:
        return self._conn.home()
