"""The ``local_docker`` scheduler: each replica of an app is a container on a Docker engine.

Replicas of an app with more than one container share a per-app bridge network (named after the
app id) on which each replica is reachable by the hostname ``{role}-{replica_id}``; an app of one
container runs on the engine's default bridge. ``max_retries`` becomes the containers'
``on-failure`` restart policy (Docker restarts a failed replica alone; no gang restart). Once
a replica has failed for good, the others are stopped and the app ends FAILED when they have
(:mod:`~core.schedulers.docker.gang`).

Everything the scheduler knows lives in the engine (container labels and record volumes), so
``describe``, ``list``, ``log_iter`` and ``cancel`` work from any process; the client keeps no
state. Where each concern lives:

- :mod:`~core.schedulers.docker.model`: label names, object names, the request types
  (``DockerJob``, ``DockerContainer``), container state → replica state.
- :mod:`~core.schedulers.docker.request`: run options (``DockerOpts``), validation, and the
  dry run that builds one container request per replica.
- :mod:`~core.schedulers.docker.engine`: the engine to reach (the environment's, as Docker's
  tools, or a :class:`DockerEngine`: URL, TLS, registry login) and its client.
- :mod:`~core.schedulers.docker.images`: the ``pull`` policy (missing, always, never) applied
  before anything is created, and its pre-flight view.
- :mod:`~core.schedulers.docker.submit`: the idempotency-key claim (a volume named after the
  key: the engine makes it once), creating and starting the containers all or nothing,
  stopping and removing them.
- :mod:`~core.schedulers.docker.state`: containers and record volumes read back as
  ``DescribeAppResponse``/``ListAppResponse``; a half-submitted app reads as FAILED after its
  submission's deadline. Only reads.
- :mod:`~core.schedulers.docker.retire`: tombstones (an app's final state), log archives, and
  the sweep that removes ended apps' networks at once and their containers after ``retention``.
- :mod:`~core.schedulers.docker.gang`: stopping the other replicas once one failed for good.
- :mod:`~core.schedulers.docker.logs`: log lines, read or followed (long lines whole).
- :mod:`~core.schedulers.docker.scheduler`: :class:`DockerScheduler`, wiring the above.

The docker SDK is imported lazily (on first use): importing the package stays cheap.
"""

from core.schedulers.docker.engine import DockerEngine
from core.schedulers.docker.model import DockerContainer, DockerJob
from core.schedulers.docker.request import DockerOpts
from core.schedulers.docker.scheduler import DockerScheduler, create_scheduler, has_docker

__all__ = [
    "DockerContainer",
    "DockerEngine",
    "DockerJob",
    "DockerOpts",
    "DockerScheduler",
    "create_scheduler",
    "has_docker",
]
