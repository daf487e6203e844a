"""The local scheduler (``local_cwd``, ``local_dir``): each replica a process on this host.

Where each concern lives:

- :mod:`.scheduler` — :class:`LocalScheduler`: dry run, submit, describe, list, cancel,
  log_iter; ties the modules below together.
- :mod:`.images` — what is started (:class:`PopenRequest`, :class:`ReplicaParam`) and the image
  providers (``local_cwd``: the current directory; ``local_dir``: the image directory).
- :mod:`.appdir` — owns the app directory and its layout (:class:`AppDir`: the record, exit
  codes, markers, the final state; idempotency-key claims); refuses directories that are not
  the user's alone.
- :mod:`.records` — the app record and the final state as dataclasses.
- :mod:`.spawn` — starts the replicas: ``wrapper.sh`` (a real shell file) under
  ``posix_spawn``, the start gate, the command-size check.
- :mod:`.processes` — which process a replica is (pid and start time), signals, termination of
  process trees and leftovers.
- :mod:`.supervise` — reads an app's state (:func:`observe`) and the one place that acts on it
  (:func:`settle`: gang termination, SIGKILL after the grace, the final state).
- :mod:`.collector` — the log collector (combined log and time index), also a process of its own.
- :mod:`.logs` — :class:`LogIterator`, reading the logs.
- :mod:`.background` — the one background thread per process (reaps wrappers, starts
  collectors, bounds finished apps).
- :mod:`.signals` — SIGTERM/SIGINT orphan clean-up (:class:`SignalException`).

Any process can address a local app: its state lives in ``$SHIPYARD_STATE_DIR`` (else
``$XDG_STATE_HOME/shipyard``, else ``~/.local/state/shipyard``), ``local/<app_id>/``.

This package imports nothing on import (the log collector process loads only what it needs);
:mod:`core.schedulers.local_scheduler` keeps the specification's names importable.
"""
