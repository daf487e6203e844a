"""Hooks of the Shipyard provider."""

from airflow_provider.hooks.shipyard import ShipyardHook

__all__ = ["ShipyardHook"]
