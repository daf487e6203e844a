"""Pre-flight checks of a local app (``LocalScheduler.preflight``): every role's entrypoint
resolvable and executable, its working directory there and writable, the log directory
writable, and as many GPUs on the host as the replicas ask for where
``auto_set_cuda_visible_devices`` is to give each its own. Nothing is started or written
(writability is asked of the kernel with ``access(2)``); every problem is reported, each
naming its field."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from core.reports import Problem
from core.schedulers.local.images import ImageProvider
from core.schedulers.local.options import LocalOpts, local_opts
from core.specs import AppDryRunInfo, Role

__all__ = ["gpu_demand", "host_gpu_count", "preflight"]


def preflight(
    info: AppDryRunInfo[Any],
    provider_class: Callable[[LocalOpts], ImageProvider],
    extra_paths: list[str],
    gpu_count: Callable[[], int],
) -> list[Problem]:
    """The problems a submit of ``info`` would hit (see the module docs)."""
    app, cfg = info.app, info.cfg or {}
    if app is None:
        return []
    try:
        opts = local_opts(cfg)
    except ValueError as e:
        return [Problem("cfg", str(e))]
    problems: list[Problem] = []
    provider = provider_class(opts)
    for i, role in enumerate(app.roles):
        problems += _role_problems(provider, role, f"roles[{i}]", opts, extra_paths)
    log_root = opts.get("log_dir")
    if log_root:
        problems += _dir_problems(
            os.path.abspath(os.path.expanduser(log_root)), "cfg.log_dir", True
        )
    if opts.get("auto_set_cuda_visible_devices"):
        problems += _gpu_problems(app.roles, gpu_count)
    return problems


def gpu_demand(roles: list[Role]) -> tuple[int, str]:
    """How many GPUs the replicas of ``roles`` ask for in all, and who asks (``t: 2 x 1``)."""
    asking = [r for r in roles if r.resource.gpu > 0]
    needed = sum(r.resource.gpu * r.num_replicas for r in asking)
    return needed, ", ".join(f"{r.name}: {r.num_replicas} x {r.resource.gpu}" for r in asking)


def _gpu_problems(roles: list[Role], gpu_count: Callable[[], int]) -> list[Problem]:
    """The replicas ask for more GPUs than the host has (``nvidia-smi -L``): a submit would
    leave ``CUDA_VISIBLE_DEVICES`` unset, so every replica would see every GPU, or none."""
    needed, asks = gpu_demand(roles)
    have = gpu_count() if needed else 0
    if have >= needed:
        return []
    return [
        Problem(
            "cfg.auto_set_cuda_visible_devices",
            f"the replicas ask for {needed} GPUs ({asks}) but this host has {have}",
        )
    ]


def _role_problems(
    provider: ImageProvider, role: Role, where: str, opts: LocalOpts, extra_paths: list[str]
) -> list[Problem]:
    try:
        img_root = provider.fetch_role(role)
    except ValueError as e:
        return [Problem(f"{where}.image", str(e).removeprefix("image: "))]
    cwd = provider.get_cwd(img_root) or os.getcwd()
    problems = _dir_problems(cwd, f"{where}.image", False, "working directory")
    entrypoint = provider.get_entrypoint(img_root, role)
    path = role.env.get("PATH", os.environ.get("PATH", os.defpath))
    prefix = [*([cwd] if opts.get("prepend_cwd") else []), *extra_paths]
    path = os.pathsep.join([*prefix, *([path] if path else [])])
    problem = _entrypoint_problem(entrypoint, cwd, path)
    if problem:
        problems.append(Problem(f"{where}.entrypoint", problem))
    return problems


def _entrypoint_problem(entrypoint: str, cwd: str, path: str) -> str | None:
    if os.sep in entrypoint:
        full = entrypoint if os.path.isabs(entrypoint) else os.path.join(cwd, entrypoint)
        if not os.path.isfile(full):
            return f"{entrypoint!r} does not exist"
        if not os.access(full, os.X_OK):
            return f"{entrypoint!r} is not executable"
        return None
    import shutil  # (lazily: start-up)

    if shutil.which(entrypoint, path=path) is None:
        return f"{entrypoint!r} was not found on PATH"
    return None


def _dir_problems(path: str, field: str, creatable: bool, what: str = "directory") -> list[Problem]:
    """``path`` is a writable directory (or, if ``creatable``, its nearest existing parent is)."""
    probe = path
    if creatable:
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return [Problem(field, f"{what} {path!r} does not exist or is not a directory")]
    if not os.access(probe, os.W_OK | os.X_OK):
        return [Problem(field, f"{what} {probe!r} is not writable")]
    return []


def host_gpu_count() -> int:
    """Number of GPUs on this host (``nvidia-smi -L``), 0 if none can be found."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    import subprocess

    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return (
        sum(1 for line in out.stdout.splitlines() if line.strip().startswith("GPU"))
        if out.returncode == 0
        else 0
    )
