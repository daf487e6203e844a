"""Scheduler discovery (core.schedulers): a built-in scheduler is found without reading the
installed packages' entry points; any other name, and the whole list, come from them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.runner import Runner
from core.schedulers import available_schedulers, get_scheduler_factories
from tests.helpers import ROOT


def test_a_command_on_a_built_in_scheduler_reads_no_entry_points() -> None:
    code = (
        "import sys; from core.runner import get_runner\n"
        "with get_runner('disco') as r:\n"
        "    r.scheduler('local_cwd'); assert 'local_cwd' in r.scheduler_backends()\n"
        "print('importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, "False"), out.stderr


def test_the_lazy_mapping_agrees_with_the_entry_points() -> None:
    lazy, listed = available_schedulers(), get_scheduler_factories()
    assert list(lazy) == list(listed) and list(lazy)[0] == "local_cwd"
    assert {"local_cwd", "local_dir", "local_docker", "slurm"} <= set(lazy)
    assert lazy.get("no-such-scheduler") is None


def test_an_unknown_scheduler_names_the_known_ones() -> None:
    with Runner("disco") as runner, pytest.raises(ValueError, match="expected one of local_cwd"):
        runner.scheduler("no-such-scheduler")
