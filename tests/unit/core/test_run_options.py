"""Each scheduler's options as a TypedDict: the same names as its runopts, accepted by the
runner, and checked by mypy for callers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.runner import get_runner
from core.schedulers.local_scheduler import LocalOpts, create_cwd_scheduler
from core.schedulers.slurm_scheduler import SlurmOpts, SlurmScheduler
from core.specs import AppDef, Role


def test_local_opts_has_the_local_run_options() -> None:
    with create_cwd_scheduler("t") as sched:
        names = {name for name, _ in sched.run_opts()}
    assert set(LocalOpts.__annotations__) == names
    assert not LocalOpts.__required_keys__


def test_slurm_opts_has_the_slurm_run_options() -> None:
    names = {name for name, _ in SlurmScheduler("t").run_opts()}
    assert set(SlurmOpts.__annotations__) == names  # (mail-user, mail-type as the cfg spells them)
    assert not SlurmOpts.__required_keys__


def test_a_typed_cfg_reaches_the_scheduler(tmp_path: Path) -> None:
    cfg: LocalOpts = {"log_dir": str(tmp_path), "prepend_cwd": True}
    app = AppDef("typed", [Role("r", entrypoint="true")])
    with get_runner("t") as runner:
        info = runner.dryrun(app, "local_cwd", cfg)
    limits = {"time_limit": None, "checkpoint_signal": None, "checkpoint_grace": None,
              "max_requeues": 0, "requeue_on_timeout": False}  # fmt: skip
    assert info.cfg == {
        **cfg, "auto_set_cuda_visible_devices": False, "result_replicas": "first", **limits
    }  # fmt: skip
    assert info.request.log_dir == str(tmp_path / info.request.app_id)


def test_mypy_checks_typed_cfgs_for_callers(tmp_path: Path) -> None:
    pytest.importorskip("mypy.api")
    caller = tmp_path / "caller.py"
    caller.write_text(
        textwrap.dedent(
            """
            from core.runner import get_runner
            from core.schedulers.local_scheduler import LocalOpts
            from core.schedulers.slurm_scheduler import SlurmOpts
            from core.specs import AppDef

            def submit(app: AppDef) -> None:
                local: LocalOpts = {"log_dir": "/tmp/logs", "prepend_cwd": True}
                slurm: SlurmOpts = {"partition": "debug", "mail-user": "me@example.com"}
                with get_runner() as runner:
                    runner.run(app, "local_cwd", local)
                    runner.run(app, "slurm", slurm)
                    runner.dryrun(app, "slurm", {"time": "10"})
                bad: LocalOpts = {"prepend_cwd": "yes"}
                typo: SlurmOpts = {"mail_user": "me@example.com"}
            """
        )
    )
    # as a user's project would: its own directory, no configuration, Shipyard installed
    # (found through its py.typed markers, not the source tree)
    p = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
         "caller.py"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    out, err, status = p.stdout, p.stderr, p.returncode
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out + err
    assert len(errors) == 2, out
    assert "caller.py:14:" in errors[0] and '"prepend_cwd" has type "bool"' in errors[0]
    assert "caller.py:15:" in errors[1] and '"mail_user"' in errors[1]


def test_each_resolve_gets_its_own_copy_of_a_list_or_dict_default() -> None:
    from core.options import runopts

    opts = runopts()
    opts.add("mounts", type_=list[str], default=["a"], help="h")
    opts.add("labels", type_=dict[str, str], default={"k": "v"}, help="h")
    opts.add("name", type_=str, default="x", help="h")
    first = opts.resolve({})
    first["mounts"].append("b")  # type: ignore[union-attr]
    first["labels"]["k2"] = "v2"  # type: ignore[index]
    second = opts.resolve(None)
    assert second == {"mounts": ["a"], "labels": {"k": "v"}, "name": "x"}


def test_a_scheduler_resolves_cfgs_against_its_options_each_time() -> None:
    sched = create_cwd_scheduler("t")
    try:
        assert sched.resolve_cfg({"prepend_cwd": "true"})["prepend_cwd"] is True
        assert sched.resolve_cfg(None)["prepend_cwd"] is False
        with pytest.raises(ValueError, match="cfg: unknown option.*nope"):
            sched.resolve_cfg({"nope": 1})
    finally:
        sched.close()
