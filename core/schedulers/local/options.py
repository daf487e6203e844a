"""The run options of ``local_cwd`` and ``local_dir``: :func:`run_opts` (what ``shipyard
runopts local_cwd`` prints and ``runopts.resolve`` checks) and :class:`LocalOpts`, the same
options as a ``TypedDict`` for type checkers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from core.limits import (
    CHECKPOINT_GRACE_OPT,
    CHECKPOINT_SIGNAL_OPT,
    MAX_REQUEUES_OPT,
    REQUEUE_ON_TIMEOUT_OPT,
    TIME_LIMIT_OPT,
    add_limit_opts,
    add_requeue_opts,
    limits_from_cfg,
    requeue_from_cfg,
)
from core.reports import RESULT_REPLICAS_HELP, RESULT_REPLICAS_OPT, result_replicas
from core.specs import CfgVal, runopts

__all__ = ["LocalOpts", "local_opts", "requeues", "run_opts"]


class LocalOpts(TypedDict, total=False):
    """The run options of ``local_cwd`` and ``local_dir``, typed (see :func:`run_opts`).

    >>> cfg: LocalOpts = {"log_dir": "/tmp/logs", "prepend_cwd": True}
    """

    log_dir: str | None
    prepend_cwd: bool
    auto_set_cuda_visible_devices: bool
    result_replicas: str
    time_limit: str | None
    checkpoint_signal: str | None
    checkpoint_grace: float | None
    max_requeues: int
    requeue_on_timeout: bool


def run_opts() -> runopts:
    """The run options the local schedulers take."""
    opts = runopts()
    opts.add("log_dir", type_=str, help="dir to write stdout/stderr log files of replicas")
    opts.add(
        "prepend_cwd",
        type_=bool,
        default=False,
        help="if set, prepends CWD to replica's PATH env var making any binaries in CWD"
        " take precedence over those in PATH",
    )
    opts.add(
        "auto_set_cuda_visible_devices",
        type_=bool,
        default=False,
        help="sets `CUDA_VISIBLE_DEVICES` for roles that request GPU resources: each replica"
        " gets as many GPUs of its own as its role asks for (one for gpu=1). Does nothing"
        " (with a warning) if the host has fewer GPUs than the replicas ask for in all.",
    )
    opts.add(RESULT_REPLICAS_OPT, type_=str, default="first", help=RESULT_REPLICAS_HELP)
    add_limit_opts(opts)
    add_requeue_opts(opts)
    return opts


def local_opts(cfg: Mapping[str, CfgVal]) -> LocalOpts:
    """A resolved cfg (``run_opts().resolve(...)``) as :class:`LocalOpts`.

    Raises:
        ValueError: ``log_dir`` is not a directory path, or ``result_replicas`` is not
            ``first`` or ``all``.
    """
    log_dir = cfg.get("log_dir")
    if log_dir is not None and (not isinstance(log_dir, str) or not log_dir.strip()):
        raise ValueError(f"cfg.log_dir: expected a directory path, got {log_dir!r}")
    return LocalOpts(
        log_dir=log_dir,
        prepend_cwd=bool(cfg.get("prepend_cwd")),
        auto_set_cuda_visible_devices=bool(cfg.get("auto_set_cuda_visible_devices")),
        result_replicas=result_replicas(cfg.get(RESULT_REPLICAS_OPT)),
        **_limit_opts(cfg),
    )


def requeues(cfg: Mapping[str, CfgVal]) -> int | None:
    """How often each replica's limit script starts it again at its time limit
    (``requeue_on_timeout``; see :func:`core.limits.limit_command`); None: the app's watcher
    keeps the limit, and nothing starts again."""
    requeue = requeue_from_cfg(cfg, limits_from_cfg(cfg))
    return requeue.max_requeues if requeue.on_timeout else None


def _limit_opts(cfg: Mapping[str, CfgVal]) -> LocalOpts:
    requeues(cfg)  # (checked together: raises naming the option)
    out: LocalOpts = {}
    keys = (TIME_LIMIT_OPT, CHECKPOINT_SIGNAL_OPT, CHECKPOINT_GRACE_OPT, MAX_REQUEUES_OPT,
            REQUEUE_ON_TIMEOUT_OPT)  # fmt: skip
    for key in keys:
        if cfg.get(key) is not None:
            out[key] = cfg[key]  # type: ignore[literal-required]
    return out
