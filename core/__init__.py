"""Shipyard core: launch multi-role, multi-replica apps on local processes, Docker and Slurm.

Start with :mod:`core.specs` (the app model) and :mod:`core.runner` (submit, wait, follow and
cancel apps by handle).
"""

__version__ = "0.1.0"
