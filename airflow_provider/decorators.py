"""``@task.shipyard``: a TaskFlow function run as a Shipyard job, its return value the task's
XCom (as ``@task.docker`` does for a container).

>>> from airflow.sdk import dag, task
>>> @task.shipyard(scheduler="slurm", cfg={"partition": "gpu"})
... def train(lr: float) -> dict:
...     return {"loss": 1 / lr}

The function and its (rendered) arguments travel by value to the job
(:meth:`core.runner.Runner.run_function`); the task is a :class:`ShipyardOperator` for the
rest: one job per try (a retried try re-attaches), the job's lines in the task log, deferrable,
``skip_on_exit_code``, the job link. The function's exception fails the task with the job's
traceback as its cause. Context values (``ti``, ``ds``...) are not passed to the function: pass
what it needs as arguments (templates render).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory

from airflow_provider.operators import ShipyardJobFailedError, ShipyardOperator
from core.functions import function_job, function_value, outcome
from core.runner import Runner
from core.specs import AppDef, Resource
from core.watch import WatchEnd

__all__ = ["shipyard_task"]


class _ShipyardDecoratedOperator(DecoratedOperator, ShipyardOperator):
    """Runs the decorated function as a Shipyard job and returns its value."""

    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *ShipyardOperator.template_fields,
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        **DecoratedOperator.template_fields_renderers,
        **ShipyardOperator.template_fields_renderers,
    }
    custom_operator_name = "@task.shipyard"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        image: str = "",
        resource: Resource | None = None,
        **kwargs: Any,
    ) -> None:
        # (the app is made from the rendered call at execute time)
        placeholder = AppDef(name=python_callable.__name__[:63] or "function", roles=[])
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"app": placeholder},
            **kwargs,
        )
        self.image = image
        self.resource = resource
        self.return_result = True  # (the value is the return value; no "result" XCom beside it)
        self._job: tuple[str, dict[str, Any], AppDef] | None = None

    def _function_job(self) -> tuple[str, dict[str, Any], AppDef]:
        if self._job is None:
            self._connection()  # (its Docker engine, where an image is checked)
            self._job = function_job(
                self.python_callable, tuple(self.op_args), dict(self.op_kwargs),
                scheduler=super()._scheduler_name, cfg=super()._cfg(),
                image=self.image, resource=self.resource, docker_engine=self._engine,
            )  # fmt: skip
        return self._job

    def _app_def(self) -> AppDef:
        return self._function_job()[2]

    def _cfg(self) -> dict[str, Any]:
        return self._function_job()[1]

    def _finish(self, runner: Runner, context: Any, end: WatchEnd) -> Any:
        result = end.result if end.result is not None else runner.result(end.handle)
        try:
            super()._finish(runner, context, end)
        except ShipyardJobFailedError:
            if outcome(result) is not None:
                function_value(result)  # raises the function's exception, or why no value
            raise
        return function_value(result)


def shipyard_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """``@task.shipyard(scheduler=..., cfg=..., image=..., resource=..., shipyard_conn_id=...)``:
    the function runs as a Shipyard job; every :class:`ShipyardOperator` argument but ``app``
    applies (``cfg["python"]``: the job's interpreter, see
    :meth:`core.runner.Runner.run_function`)."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_ShipyardDecoratedOperator,
        **kwargs,
    )
