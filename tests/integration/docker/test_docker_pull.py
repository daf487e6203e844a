"""local_docker pulls and pushes against a real registry that wants a login (127.0.0.1:5001,
started by ``scripts/start_docker.sh``): the ``pull`` policies, credentials from a login or from
``$DOCKER_CONFIG/config.json``, and clear errors that leave nothing behind and show no secret.

The test image is pushed into that registry by the test itself (built locally, never pulled from
outside); every image, container and registry entry a test makes is removed afterwards.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.reports import Problem
from core.runner import get_runner
from core.schedulers.docker_scheduler import LABEL_SESSION, DockerEngine, DockerScheduler
from core.specs import AppDef, AppState, Role
from tests.integration import functions
from tests.integration.docker.test_docker_scheduler import IMAGE, wait_terminal
from tests.services import REGISTRY_PASSWORD_FILE, docker_secure_problem, require

pytestmark = pytest.mark.docker

REGISTRY = "127.0.0.1:5001"
USER = "shipyard"


@pytest.fixture(scope="module")
def password(docker_client: Any) -> str:
    """The registry's password (fails in CI, skips elsewhere, without the registry)."""
    require("docker", docker_secure_problem())
    return Path(REGISTRY_PASSWORD_FILE).read_text().strip()


def _engine(password: str) -> DockerEngine:
    return DockerEngine(registry=REGISTRY, registry_username=USER, registry_password=password)


def _basic(password: str) -> dict[str, str]:
    token = base64.b64encode(f"{USER}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _delete_from_registry(ref: str, password: str) -> None:
    """Deletes ``ref``'s manifest from the registry (it allows deletes)."""
    path, tag = ref.split("/", 1)[1].rsplit(":", 1)
    url = f"http://{REGISTRY}/v2/{path}/manifests/{tag}"
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}
    head = urllib.request.Request(url, method="HEAD", headers={**accept, **_basic(password)})
    try:
        with urllib.request.urlopen(head, timeout=10) as r:
            digest = r.headers["Docker-Content-Digest"]
    except urllib.error.HTTPError:
        return
    url = f"http://{REGISTRY}/v2/{path}/manifests/{digest}"
    delete = urllib.request.Request(url, method="DELETE", headers=_basic(password))
    urllib.request.urlopen(delete, timeout=10).close()


def _remove_local(docker_client: Any, ref: str) -> None:
    try:
        docker_client.api.remove_image(ref)
    except Exception as e:  # not there
        if getattr(e, "status_code", None) != 404:
            raise


@pytest.fixture(scope="module")
def remote_image(docker_client: Any, password: str) -> Iterator[str]:
    """The busybox test image pushed to the registry under a name of its own (and not left on
    the engine under that name)."""
    ref = f"{REGISTRY}/shipyard-test/pull-{uuid.uuid4().hex[:8]}:1"
    repo, tag = ref.rsplit(":", 1)
    docker_client.api.tag(IMAGE, repo, tag)
    auth = {"username": USER, "password": password}
    for msg in docker_client.api.push(repo, tag=tag, stream=True, decode=True, auth_config=auth):
        assert "error" not in msg, msg
    _remove_local(docker_client, ref)
    yield ref
    _remove_local(docker_client, ref)
    _delete_from_registry(ref, password)


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Docker config directory (``$DOCKER_CONFIG``): no ``docker login`` applies."""
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    return config


def _scheduler(engine: DockerEngine | None = None) -> DockerScheduler:
    return DockerScheduler(f"pytest-pull-{uuid.uuid4().hex[:8]}", docker_engine=engine)


def _assert_nothing_left(docker_client: Any, sched: DockerScheduler) -> None:
    flt = {"label": f"{LABEL_SESSION}={sched.session_name}"}
    assert docker_client.api.containers(all=True, filters=flt) == []
    assert docker_client.api.networks(filters=flt) == []
    assert (docker_client.api.volumes(filters=flt).get("Volumes") or []) == []
    assert sched.list() == []


def _echo(image: str, replicas: int = 1) -> AppDef:
    return AppDef("pulled", [Role("r", image=image, entrypoint="echo", args=["pulled"],
                                  num_replicas=replicas)])  # fmt: skip


def _run(sched: DockerScheduler, app: AppDef, cfg: dict[str, Any]) -> str:
    app_id = sched.submit(app, cfg)
    try:
        desc = wait_terminal(sched, app_id)
        assert desc.state == AppState.SUCCEEDED, desc
        assert list(sched.log_iter(app_id, "r")) == ["pulled\n"]
    finally:
        sched.purge(app_id)
    return app_id


def _pulls(caplog: pytest.LogCaptureFixture, image: str) -> int:
    return sum(f"pulling {image} from {REGISTRY}" in r.getMessage() for r in caplog.records)


# -- pulls ------------------------------------------------------------------------------------


def test_pull_always_uses_the_login_and_pulls_at_every_submit(
    remote_image: str,
    password: str,
    docker_client: Any,
    no_credentials: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="core.schedulers.docker")
    sched = _scheduler(_engine(password))
    try:
        _run(sched, _echo(remote_image, replicas=2), {"pull": "always"})
        assert docker_client.api.inspect_image(remote_image)["Id"]  # pulled onto the engine
        assert _pulls(caplog, remote_image) == 1  # once for both replicas
        _run(sched, _echo(remote_image), {"pull": "always"})
        assert _pulls(caplog, remote_image) == 2  # present, pulled again
        _run(sched, _echo(remote_image), {})  # missing (the default): present, not pulled
        assert _pulls(caplog, remote_image) == 2
        _remove_local(docker_client, remote_image)
        _run(sched, _echo(remote_image), {"pull": "missing"})  # absent: pulled
        assert _pulls(caplog, remote_image) == 3
        _assert_nothing_left(docker_client, sched)
    finally:
        sched.close()
        _remove_local(docker_client, remote_image)
    assert password not in caplog.text


def test_credentials_from_docker_config_json(
    remote_image: str, password: str, docker_client: Any, no_credentials: Path
) -> None:
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (no_credentials / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": auth}}}))
    sched = _scheduler()  # the environment's engine, and `docker login`'s credentials
    try:
        _run(sched, _echo(remote_image), {"pull": "always"})
    finally:
        sched.close()
        _remove_local(docker_client, remote_image)


def test_a_function_jobs_image_is_pulled_with_the_runners_login(
    remote_image: str,
    password: str,
    docker_client: Any,
    no_credentials: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="core.schedulers.docker")
    session = f"pytest-pullfn-{uuid.uuid4().hex[:8]}"
    try:
        with get_runner(session, docker_engine=_engine(password)) as runner:
            with pytest.raises(ValueError, match=r"^image: .*not present.*pull=never"):
                runner.run_function(functions.square, 2, scheduler="local_docker",
                                    cfg={"pull": "never"}, image=remote_image)  # fmt: skip
            assert _pulls(caplog, remote_image) == 0
            # pulled with the runner's login (the environment has none), then checked: the
            # busybox image has no python3
            with pytest.raises(ValueError, match=r"^cfg.python: cannot run python3 in .*pull-"):
                runner.run_function(functions.square, 2, scheduler="local_docker",
                                    image=remote_image)  # fmt: skip
            assert _pulls(caplog, remote_image) == 1
            assert runner.scheduler("local_docker").list() == []
    finally:
        _remove_local(docker_client, remote_image)
    assert password not in caplog.text


@pytest.mark.parametrize("credentials", ["wrong", "none"])
def test_a_refused_pull_fails_clearly_before_anything_starts(
    credentials: str, remote_image: str, docker_client: Any, no_credentials: Path
) -> None:
    secret = f"not-the-password-{uuid.uuid4().hex}"
    if credentials == "wrong":
        auth = base64.b64encode(f"{USER}:{secret}".encode()).decode()
        config = {"auths": {REGISTRY: {"auth": auth}}}
        (no_credentials / "config.json").write_text(json.dumps(config))
    sched = _scheduler()
    # (the first role by image id: pull=always pulls every image that has a registry, and this
    # one's would be Docker's default registry, out of reach here)
    local = docker_client.api.inspect_image(IMAGE)["Id"]
    app = AppDef(
        "refused",
        [
            Role("ok", image=local, entrypoint="sleep", args=["30"], num_replicas=2),
            Role("r", image=remote_image, entrypoint="true"),
        ],
    )
    key = f"pull-{uuid.uuid4().hex}"  # (its claim comes after pulls)
    try:
        with pytest.raises(ValueError) as info:
            sched.submit(app, {"pull": "always"}, idempotency_key=key)
        msg = str(info.value)
        assert msg.startswith(f"roles[1].image: pulling '{remote_image}' from {REGISTRY} failed: ")
        assert ("no basic auth credentials" if credentials == "none" else "unauthorized") in msg
        assert "log in to the registry" in msg
        assert secret not in msg
        _assert_nothing_left(docker_client, sched)
    finally:
        sched.close()


def test_a_refused_login_fails_clearly(password: str, docker_client: Any) -> None:
    secret = f"not-the-password-{uuid.uuid4().hex}"
    sched = _scheduler(_engine(secret))
    try:
        with pytest.raises(ValueError) as info:
            sched.submit(_echo(IMAGE), {})
        msg = str(info.value)
        assert msg.startswith(f"docker engine: registry {REGISTRY}: the login of 'shipyard' was")
        assert "401" in msg and secret not in msg
    finally:
        sched.close()
    assert secret not in repr(_engine(secret))


def test_pull_never_and_unknown_images_fail_clearly(
    remote_image: str, password: str, docker_client: Any
) -> None:
    sched = _scheduler(_engine(password))
    try:
        with pytest.raises(ValueError, match=r"^roles\[0\]\.image: image '.*' is not present on"
                           r" the Docker engine; .*\(cfg pull=never"):  # fmt: skip
            sched.submit(_echo(remote_image), {"pull": "never"})
        unknown = f"{REGISTRY}/shipyard-test/no-such-{uuid.uuid4().hex[:8]}:1"
        with pytest.raises(ValueError) as info:
            sched.submit(_echo(unknown), {})
        assert str(info.value).startswith(f"roles[0].image: pulling '{unknown}' from {REGISTRY}")
        assert "manifest unknown" in str(info.value)
        _assert_nothing_left(docker_client, sched)
    finally:
        sched.close()


def test_preflight_asks_the_registry_and_pulls_nothing(
    remote_image: str, password: str, docker_client: Any, no_credentials: Path
) -> None:
    app = _echo(remote_image)
    logged_in = _scheduler(_engine(password))
    anonymous = _scheduler()
    try:
        with get_runner(scheduler_factories={"local_docker": lambda s, **kw: logged_in}) as r:
            assert r.preflight(app, "local_docker") == [
                Problem(
                    "roles[0].image",
                    f"image '{remote_image}' will be pulled from {REGISTRY}",
                    severity="info",
                )
            ]
            assert r.preflight(app, "local_docker", {"pull": "never"})[0].is_error
        with get_runner(scheduler_factories={"local_docker": lambda s, **kw: anonymous}) as r:
            (problem,) = r.preflight(app, "local_docker", {"pull": "always"})
        assert problem.is_error and problem.field == "roles[0].image"
        assert f"cannot be pulled from {REGISTRY}: " in problem.message
        assert "no basic auth credentials" in problem.message
        with pytest.raises(Exception, match="No such image"):
            docker_client.api.inspect_image(remote_image)  # nothing was pulled
    finally:
        logged_in.close()
        anonymous.close()


# -- pushes (image_repo) ----------------------------------------------------------------------


def test_image_repo_pushes_use_the_login(
    password: str, docker_client: Any, no_credentials: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("pushed\n")
    repo = f"{REGISTRY}/shipyard-test/ws-{uuid.uuid4().hex[:8]}"
    app = AppDef("push", [Role("r", image=IMAGE, entrypoint="cat", args=["hello.txt"])])
    cfg = {"image_repo": repo, "quiet": True}
    anonymous = _scheduler()
    sched = _scheduler(_engine(password))
    pushed = ""
    try:
        with pytest.raises(RuntimeError, match=rf"^cfg\.image_repo: pushing {repo}:\w+ failed"):
            anonymous.submit(app, cfg, workspace=str(workspace))
        _assert_nothing_left(docker_client, anonymous)
        app_id = sched.submit(app, cfg, workspace=str(workspace))
        desc = wait_terminal(sched, app_id)
        assert desc.state == AppState.SUCCEEDED
        pushed = desc.roles[0].image
        assert pushed.startswith(f"{repo}:")
        assert list(sched.log_iter(app_id, "r")) == ["pushed\n"]
        path = repo.split("/", 1)[1]
        tags = urllib.request.Request(
            f"http://{REGISTRY}/v2/{path}/tags/list", headers=_basic(password)
        )
        with urllib.request.urlopen(tags, timeout=10) as r:
            assert json.load(r)["tags"] == [pushed.rsplit(":", 1)[1]]
        sched.purge(app_id)
    finally:
        anonymous.close()
        sched.close()
        for image in docker_client.api.images(name=repo):
            docker_client.api.remove_image(image["Id"], force=True)
        if pushed:
            _delete_from_registry(pushed, password)
