"""The roles' images on the engine: the ``pull`` policy (``missing``, ``always``, ``never``, as
``docker run --pull``), applied before anything of an app is created, and the pre-flight view
of it. Pulls use the client's registry login (see :mod:`~core.schedulers.docker.engine`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from core.reports import Problem
from core.schedulers.docker.model import DockerJob
from core.schedulers.docker.request import check_pull_policy, is_image_id, match_image_ref
from core.schedulers.docker.submit import parallel
from core.specs import AppDef

log = logging.getLogger(__name__)

_DEFAULT_REGISTRY = "Docker's default registry"


def registry_of(image: str) -> str:
    """The registry an image reference is pulled from (``host:port``), as Docker reads it."""
    m = match_image_ref(image)
    registry = (m.group("registry") if m else None) or ""
    if "." in registry or ":" in registry or registry == "localhost":
        return registry
    return _DEFAULT_REGISTRY


def image_field(image: str, app: AppDef | None) -> str:
    """The app field of the first role running ``image`` (``roles[1].image``)."""
    for i, role in enumerate(app.roles if app is not None else []):
        if role.image == image:
            return f"roles[{i}].image"
    return "image"


def ensure(api: Any, pool: ThreadPoolExecutor, job: DockerJob, app: AppDef | None) -> None:
    """Pulls the job's images as its ``pull`` policy says (in parallel, each image once) and
    checks that each is on the engine.

    Raises:
        ValueError: naming the role, the image and the engine's or registry's answer, when an
            image is missing and may not be pulled, or its pull failed.
    """
    policy = check_pull_policy(job.pull)
    images = dict.fromkeys(c.image for c in job.containers)
    parallel(pool, lambda image: ensure_image(api, image, policy, image_field(image, app)), images)


def ensure_image(api: Any, image: str, policy: str, field: str = "image") -> None:
    """Pulls ``image`` as ``policy`` says (``always``; ``missing``: when the engine lacks it;
    ``never``), like ``docker run --pull``.

    Raises:
        ValueError: naming ``field``: the image is absent and may not be pulled, or the pull
            failed.
    """
    if policy == "always" and not is_image_id(image):
        pull(api, image, field)
        return
    if _present(api, image, field):
        return
    if policy == "never" or is_image_id(image):
        raise ValueError(f"{field}: {_absent(image, policy)}")
    pull(api, image, field)


def _present(api: Any, image: str, field: str) -> bool:
    from docker.errors import APIError, ImageNotFound

    try:
        api.inspect_image(image)
    except ImageNotFound:
        return False
    except APIError as e:
        raise ValueError(
            f"{field}: the Docker engine rejects image {image!r}: {e.explanation or e}"
        ) from None
    return True


def _absent(image: str, policy: str) -> str:
    if is_image_id(image):
        return f"image {image!r} is not present on the Docker engine (an image id cannot be pulled)"
    return (
        f"image {image!r} is not present on the Docker engine; build, load or pull it first"
        f" (cfg pull={policy}: local_docker does not pull it)"
    )


def pull(api: Any, image: str, field: str = "image") -> None:
    """Pulls ``image`` with the client's credentials for its registry.

    Raises:
        ValueError: naming ``field``, the image, its registry and the registry's answer.
    """
    from docker.errors import APIError

    registry = registry_of(image)
    log.info("pulling %s from %s", image, registry)
    try:
        for msg in api.pull(image, stream=True, decode=True):
            error = msg.get("error") if isinstance(msg, dict) else None
            if error:
                raise ValueError(
                    f"{field}: pulling {image!r} from {registry} failed: {_explain(str(error))}"
                )
    except APIError as e:
        raise ValueError(
            f"{field}: pulling {image!r} from {registry} failed: {_explain(e)}"
        ) from None


def _explain(answer: object) -> str:
    """The engine's or registry's answer, with a hint when it is about credentials."""
    from docker.errors import APIError

    text = str(answer.explanation or answer) if isinstance(answer, APIError) else str(answer)
    if any(w in text.lower() for w in ("unauthorized", "no basic auth", "denied")):
        text += " (log in to the registry: docker login, or the credentials of the Airflow"
        text += " connection or Prefect block)"
    return text


def preflight(api: Any, image: str, policy: str, field: str) -> Problem | None:
    """What a submit would find about ``image``, without pulling it: absent and not to be
    pulled, or not to be had from its registry (asked with the client's credentials); an
    image that will be pulled is an ``info``."""
    from docker.errors import APIError

    try:
        present = _present(api, image, field)
    except ValueError as e:
        return Problem(field, str(e).partition(": ")[2])
    if present and policy != "always":
        return None
    if policy == "never" or is_image_id(image):
        return None if present else Problem(field, _absent(image, policy))
    registry = registry_of(image)
    try:
        api.inspect_distribution(image)
    except APIError as e:
        return Problem(field, f"image {image!r} cannot be pulled from {registry}: {_explain(e)}")
    if present:
        return None
    return Problem(field, f"image {image!r} will be pulled from {registry}", severity="info")
