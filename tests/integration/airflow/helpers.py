"""Small helpers for calling the operator directly (outside ``dag.test()``)."""

from __future__ import annotations

import uuid
from typing import Any


class TaskInstanceStub:
    """The few task-instance attributes the operator reads, with XComs kept in a dict.

    Stands in for Airflow's runtime task instance when a test calls ``execute`` itself; the
    backend behind the operator is always the real one.
    """

    def __init__(
        self,
        dag_id: str = "direct",
        run_id: str | None = None,
        task_id: str = "job",
        map_index: int = -1,
        try_number: int = 1,
    ) -> None:
        self.dag_id = dag_id
        self.run_id = run_id or f"manual__{uuid.uuid4().hex}"
        self.task_id = task_id
        self.map_index = map_index
        self.try_number = try_number
        self.xcoms: dict[str, Any] = {}
        self.stats_tags: dict[str, str] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value

    def retry(self) -> TaskInstanceStub:
        """The same task instance, one try later (XComs of a try are not kept)."""
        return TaskInstanceStub(
            self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number + 1
        )


class StateStoreStub(dict[str, Any]):
    """``task_state_store``: get/set like Airflow's accessor, shared between tries."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


def context(ti: TaskInstanceStub, store: StateStoreStub | None = None) -> dict[str, Any]:
    ctx: dict[str, Any] = {"ti": ti, "task_instance": ti, "run_id": ti.run_id}
    if store is not None:
        ctx["task_state_store"] = store
    return ctx
