"""The flow the Prefect bench rows deploy (bench/prefect_bench.py): it does nothing, so a row
measures the worker, not the flow."""

from __future__ import annotations

from prefect import flow


@flow
def noop() -> None:
    """Returns at once."""
