"""slurmrestd as a :class:`SlurmClient`: JSON over HTTP(S) with a JWT.

The API version is the newest one both sides speak, found from the endpoint itself
(``/openapi/v3`` lists its paths), or the cluster's ``api_version``; the JSON mapping of each
version lives in one module (``rest_v0038``: Slurm 22.05; ``rest_v0042``: v0.0.42-v0.0.45, Slurm
24.11-26.05), listed in :data:`API_VERSIONS`. slurmrestd cannot read files: logs and job directories go through the
cluster's SSH settings or a shared mount (the ``files`` given to the client).
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any

import requests
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from core.clusters import ClusterConfig, ClusterError
from core.errors import ShipyardError
from core.schedulers.slurm import rest_v0038, rest_v0042
from core.schedulers.slurm.jobinfo import JobInfo, array_query_ids
from core.schedulers.slurm.script import SlurmBatchRequest
from core.schedulers.slurm.transport import (
    AccountingUnavailableError,
    Files,
    SlurmClient,
    SubmitRefusedError,
    TransportError,
)

log = logging.getLogger(__name__)

__all__ = ["API_VERSIONS", "RestClient"]

#: the API versions this client speaks, newest first, and the module of each
API_VERSIONS: dict[str, ModuleType] = {
    v: module for module in (rest_v0042, rest_v0038) for v in module.VERSIONS
}

#: the environment of a job's batch step (the replicas' own variables are in the script)
BATCH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
_TIMEOUT = 30.0
_GONE = ("Invalid job id", "already completing or completed")
#: Slurm's ESLURM_PROTOCOL_AUTHENTICATION_ERROR ("Protocol authentication error")
_ESLURM_AUTH = 1007


class _TransientError(ShipyardError):
    pass


class RestClient(SlurmClient):
    """A cluster's slurmrestd (``cluster.rest_url``), as ``cluster.user`` with its JWT."""

    def __init__(self, cluster: ClusterConfig, files: Files | None) -> None:
        self.cluster = cluster
        self.files = files
        self.default_workdir = cluster.remote_dir
        self._session = requests.Session()
        self._lock = threading.Lock()
        self._token: str | None = None
        self._api: ModuleType | None = None
        self._slurm = self._slurmdb = ""

    # -- plumbing -----------------------------------------------------------------------------

    def _err(self, field: str, problem: str) -> ClusterError:
        return ClusterError(f"cluster {self.cluster.name!r}: {field}: {problem}")

    def _headers(self, refresh: bool = False) -> dict[str, str]:
        with self._lock:
            if self._token is None or refresh:
                self._token = self.cluster.resolve_token()
            return {
                "X-SLURM-USER-NAME": self.cluster.user or "",
                "X-SLURM-USER-TOKEN": self._token,
            }

    def _http(self, method: str, path: str, refresh: bool, **kw: Any) -> requests.Response:
        url = self.cluster.rest_url.rstrip("/") + path  # type: ignore[union-attr]
        try:
            return self._session.request(
                method, url, headers=self._headers(refresh), timeout=_TIMEOUT, **kw
            )
        except (requests.ConnectionError, requests.Timeout) as e:
            raise _TransientError(f"cannot reach {self.cluster.rest_url}: {e}") from e

    def _call(self, method: str, path: str, retry: bool = True, **kw: Any) -> dict[str, Any]:
        """One API call; transient failures retried with backoff (``retry``). A refused token
        (HTTP 401, or the ``Unspecified error`` slurmrestd gives for a bad JWT) is fetched
        again once from its source."""
        retrying = Retrying(
            stop=stop_after_attempt(4 if retry else 1),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception_type(_TransientError),
        )
        try:
            for attempt in retrying:
                with attempt:
                    payload = self._answer(self._http(method, path, False, **kw))
                    if _auth_problem(payload):
                        payload = self._answer(self._http(method, path, True, **kw))
                    return payload
        except RetryError as e:
            cause = e.last_attempt.exception()
            raise TransportError(f"cluster {self.cluster.name!r}: {cause}") from cause
        raise AssertionError("unreachable")

    def _answer(self, r: requests.Response) -> dict[str, Any]:
        if r.status_code == 401:
            return {
                "errors": [{"error_number": 401, "description": r.text.strip()}],
                "_status": 401,
            }
        try:
            payload = r.json()
        except ValueError:
            if r.status_code == 404:
                return {"errors": [{"description": "not found"}], "_status": 404}
            raise _TransientError(
                f"slurmrestd answered HTTP {r.status_code}: {r.text[:200]!r}"
            ) from None
        payload["_status"] = r.status_code
        # (26.05 answers a refused token with 502 on some paths: not a passing outage)
        if r.status_code in (502, 503, 504) and not _auth_problem(payload):
            raise _TransientError(f"slurmrestd answered HTTP {r.status_code}")
        return payload  # type: ignore[no-any-return]

    @property
    def api(self) -> ModuleType:
        """The module of the API version spoken with the endpoint: ``cluster.api_version``, or
        else the newest version both sides speak (found on first use from the paths the
        endpoint lists; also checks that the token is accepted)."""
        if self._api is None:
            spec = self._call("GET", "/openapi/v3")
            offered = {p.split("/")[2] for p in spec.get("paths") or {} if p.startswith("/slurm/v")}
            version = self._choose(offered)
            ping = self._call("GET", f"/slurm/{version}/ping")
            if ping.get("errors") or _auth_problem(ping):
                raise self._err(
                    "token",
                    f"slurmrestd refused the token of user {self.cluster.user!r}"
                    f" (expired, or not this user's; from {self._token_source()}):"
                    f" {_describe(ping)}",
                )
            self._slurm, self._slurmdb = f"/slurm/{version}", f"/slurmdb/{version}"
            self._api = API_VERSIONS[version]
            log.debug("cluster %s: slurmrestd API %s", self.cluster.name, version)
        return self._api

    def _choose(self, offered: set[str]) -> str:
        pinned = self.cluster.api_version
        if pinned is not None and pinned not in API_VERSIONS:
            raise self._err(
                "api_version",
                f"shipyard does not speak {pinned}; it speaks {', '.join(API_VERSIONS)}",
            )
        wanted = [pinned] if pinned else list(API_VERSIONS)
        found = next((v for v in wanted if v in offered), None)
        if found is None:
            raise self._err(
                "api_version" if pinned else "rest_url",
                f"{self.cluster.rest_url} offers API versions"
                f" {', '.join(sorted(offered)) or 'none'}; shipyard"
                f" {'was asked for' if pinned else 'speaks'} {', '.join(wanted)}",
            )
        return found

    @property
    def _ctl(self) -> str:
        """``/slurm/<the API version>``."""
        _ = self.api
        return self._slurm

    @property
    def _db(self) -> str:
        """``/slurmdb/<the API version>``."""
        _ = self.api
        return self._slurmdb

    def _token_source(self) -> str:
        c = self.cluster
        if c.token is not None:
            return "the token setting"
        if c.token_command:
            return "token_command"
        if c.token_file:
            return f"token_file {c.token_file}"
        return f"${c.token_env}"

    # -- the client ---------------------------------------------------------------------------

    def submit(self, req: SlurmBatchRequest, workdir: str | None, hold: bool) -> str:
        api = self.api
        body = api.submission(req, workdir or self.default_workdir or "/", hold, BATCH_ENV)
        payload = self._call("POST", f"{self._slurm}/job/submit", retry=False, json=body)
        if not payload.get("job_id"):
            raise SubmitRefusedError(_describe(payload))
        if payload.get("errors"):  # a queued job's notes, e.g. "Job is in held state"
            log.debug("job %s: %s", payload["job_id"], _describe(payload))
        return str(payload["job_id"])

    def controller_jobs(self, job_ids: list[str]) -> tuple[dict[str, JobInfo], str | None]:
        try:
            payload = self._call("GET", f"{self._ctl}/jobs")
        except TransportError as e:
            return {}, str(e)
        if payload.get("errors"):
            return {}, _describe(payload)
        wanted = set(job_ids)
        # (the controller answers with every job: only those asked about are converted)
        only = {j.split("_", 1)[0] for j in wanted}
        jobs = self.api.parse_jobs(payload, only=only)
        return {k: v for k, v in jobs.items() if k in wanted}, None

    def accounting_jobs(self, job_ids: list[str]) -> dict[str, JobInfo] | None:
        found: dict[str, JobInfo] = {}
        for job_id in array_query_ids(job_ids):  # (an array job's answer has every task)
            try:
                payload = self._call("GET", f"{self._db}/job/{job_id}")
            except TransportError as e:
                raise AccountingUnavailableError(f"slurmrestd accounting: {e}") from e
            if payload.get("_status") == 404:
                return None  # no dbv plugin: accounting is not available
            down = _database_down(payload)
            if down is not None:
                raise AccountingUnavailableError(f"slurmrestd accounting: {down}")
            found.update(self.api.parse_accounting(payload))
        return found

    def user_jobs(self, marked: str | None = None) -> dict[str, JobInfo]:
        payload = self._call("GET", f"{self._ctl}/jobs")
        if marked is not None:
            jobs = [j for j in payload.get("jobs") or [] if marked in str(j.get("comment") or "")]
            payload = {**payload, "jobs": jobs}
        return self.api.parse_jobs(payload, self.cluster.user)

    def user_accounting(self, since: str) -> dict[str, JobInfo]:
        # (allocations only: on a busy cluster the steps are most of the answer)
        params = {
            "start_time": since,
            "skip_steps": "true",
            **self.api.user_filter(self.cluster.user),
        }
        payload = self._call("GET", f"{self._db}/jobs", params=params)
        return self.api.parse_accounting(payload, self.cluster.user)

    def release(self, job_id: str) -> None:
        payload = self._call("POST", f"{self._ctl}/job/{job_id}", json={"hold": False})
        if payload.get("errors"):
            log.debug("release %s: %s", job_id, _describe(payload))

    def cancel(self, job_id: str) -> None:
        payload = self._call("DELETE", f"{self._ctl}/job/{job_id}")
        if payload.get("errors"):
            text = _describe(payload)
            if any(g in text for g in _GONE):
                log.debug("cancel %s: %s", job_id, text)
                return
            raise RuntimeError(
                f"cluster {self.cluster.name!r}: cancelling job {job_id} failed: {text}"
            )

    def set_comment(self, job_id: str, comment: str) -> None:
        payload = self._call("POST", f"{self._ctl}/job/{job_id}", json={"comment": comment})
        if payload.get("errors"):
            log.debug("comment of %s: %s", job_id, _describe(payload))

    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        if not self.api.EXCLUDES_NODES:
            raise RuntimeError(
                f"cluster {self.cluster.name!r}: slurmrestd's {self._slurm.rpartition('/')[2]} API cannot"
                " exclude nodes"
            )
        payload = self._call("POST", f"{self._slurm}/job/{job_id}", json={"excluded_nodes": nodes})
        if payload.get("errors"):
            raise RuntimeError(
                f"cluster {self.cluster.name!r}: excluding {nodes} from job {job_id} failed:"
                f" {_describe(payload)}"
            )

    def version(self) -> str:
        payload = self._call("GET", f"{self._ctl}/ping")
        if payload.get("errors") or _auth_problem(payload):
            raise self._err("token", f"slurmrestd refused the token: {_describe(payload)}")
        meta = payload.get("meta") or {}
        slurm = meta.get("slurm") or meta.get("Slurm") or {}
        release = slurm.get("release") or "(release not given)"
        return f"slurm {release}, slurmrestd API {self._ctl.rpartition('/')[2]}"

    def partitions(self) -> tuple[dict[str, int], str | None]:
        parts = self._call("GET", f"{self._ctl}/partitions")
        nodes = self._call("GET", f"{self._ctl}/nodes")
        return self.api.parse_partitions(parts, nodes)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._session.close()


def _describe(payload: dict[str, Any]) -> str:
    errors = payload.get("errors") or []
    parts = [_error_text(e) for e in errors]
    parts += [str(p["status"]) for p in payload.get("pings") or [] if not p.get("responding", True)]
    return "; ".join(parts) or f"HTTP {payload.get('_status')}"


def _error_text(error: dict[str, Any]) -> str:
    """One error of an answer: slurmrestd's context (``Batch job submission failed``) and
    Slurm's own message (``Invalid partition name specified``)."""
    desc, text = str(error.get("description") or ""), str(error.get("error") or "")
    if desc and text and text not in desc and text != "Unspecified error":
        return f"{desc}: {text}"
    return desc or text or str(error)


def _auth_problem(payload: dict[str, Any]) -> bool:
    """True for the answers slurmrestd gives to a missing or refused JWT: HTTP 401, 22.05's
    ``Unspecified error``, and 26.05's ``Protocol authentication error`` (HTTP 511, 422 or 502
    by path; its ping answers 200 with the controller not ``responding``)."""
    if payload.get("_status") in (401, 511):
        return True
    errors = payload.get("errors") or []
    if any(
        (e.get("error_number") == -1 and e.get("error") == "Unspecified error")
        or e.get("error_number") == _ESLURM_AUTH
        for e in errors
    ):
        return True
    pings = payload.get("pings") or []
    return any("authentication" in str(p.get("status", "")).lower() for p in pings)


#: Slurm's error number for "Unable to connect to database" (ESLURM_DB_CONNECTION)
_DB_CONNECTION = 7000


def _database_down(payload: dict[str, Any]) -> str | None:
    """What slurmrestd says when it could not reach slurmdbd (it answers 200 with an error and
    no jobs), else None."""
    for e in payload.get("errors") or []:
        if isinstance(e, dict) and e.get("error_number") == _DB_CONNECTION:
            return str(e.get("description") or e.get("error") or "cannot reach slurmdbd")
    return None
