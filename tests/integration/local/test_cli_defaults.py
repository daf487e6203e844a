"""The `shipyard` command's defaults files (issue 29): `.shipyardconfig` in the working
directory and `$XDG_CONFIG_HOME/shipyard/config.yaml`; flags over environment over files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def sh(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHIPYARD_CFG_")}
    clean.pop("SHIPYARD_SCHEDULER", None)
    clean.pop("SHIPYARD_CONFIG", None)
    clean["XDG_CONFIG_HOME"] = str(cwd / "xdg")
    return subprocess.run(
        [SHIPYARD, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env={**clean, **env},
    )  # fmt: skip


def log_dir(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    request = json.loads(r.stdout)["request"]
    (line,) = [x for x in request.splitlines() if x.startswith("log_dir: ")]
    return str(Path(line.removeprefix("log_dir: ")).parent)


def test_run_options_flags_over_environment_over_files(tmp_path: Path) -> None:
    user = tmp_path / "xdg" / "shipyard" / "config.yaml"
    user.parent.mkdir(parents=True)
    user.write_text(f"local_cwd:\n  log_dir: {tmp_path / 'user'}\n")
    dry = ("run", "--dryrun", "--json", "--", "true")
    assert log_dir(sh(*dry, cwd=tmp_path)) == str(tmp_path / "user")
    (tmp_path / ".shipyardconfig").write_text(f"local_cwd: {{log_dir: {tmp_path / 'project'}}}\n")
    assert log_dir(sh(*dry, cwd=tmp_path)) == str(tmp_path / "project")
    env = {"SHIPYARD_CFG_LOCAL_CWD": f"log_dir={tmp_path / 'env'}"}
    assert log_dir(sh(*dry, cwd=tmp_path, **env)) == str(tmp_path / "env")
    flag = ("run", "--dryrun", "--json", "--cfg", f"log_dir={tmp_path / 'flag'}", "--", "true")
    assert log_dir(sh(*flag, cwd=tmp_path, **env)) == str(tmp_path / "flag")


def test_the_default_scheduler(tmp_path: Path) -> None:
    (tmp_path / ".shipyardconfig").write_text("scheduler: local_dir\n")
    image = ("--image", str(tmp_path))
    r = sh("run", "--dryrun", "--json", *image, "--", "true", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["scheduler"] == "local_dir", r.stderr
    r = sh("run", "--dryrun", "--json", *image, "--", "true", cwd=tmp_path,
           SHIPYARD_SCHEDULER="local_cwd")  # fmt: skip
    assert json.loads(r.stdout)["scheduler"] == "local_cwd", r.stderr
    r = sh("run", "-s", "local_cwd", "--dryrun", "--json", "--", "true", cwd=tmp_path)
    assert json.loads(r.stdout)["scheduler"] == "local_cwd", r.stderr
    # list asks the default scheduler too
    handle = json.loads(sh("run", "--json", *image, "--", "true", cwd=tmp_path).stdout)
    listed = json.loads(sh("list", "--json", cwd=tmp_path).stdout)
    assert handle["app_handle"].startswith("local_dir://")
    assert handle["app_handle"] in {a["app_handle"] for a in listed}


def test_a_bad_file_is_one_line_and_nothing_runs(tmp_path: Path) -> None:
    config = tmp_path / ".shipyardconfig"
    for text, message in [
        ("local_cwd: {log_dri: /tmp}\n", "local_cwd.log_dri: unknown option; valid options"),
        ("local_cwd: {prepend_cwd: maybe}\n", "local_cwd.prepend_cwd: expected a bool"),
        ("schedular: slurm\n", "schedular: not a scheduler; expected scheduler or one of"),
        ("local_cwd: {log_dir: [x\n", "not valid YAML"),
    ]:
        config.write_text(text)
        r = sh("run", "--", "touch", "started", cwd=tmp_path)
        assert r.returncode == 2, (text, r.returncode, r.stderr)
        assert r.stderr.startswith(f"shipyard: error: {config}") and message in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1 and r.stdout == ""
        assert not (tmp_path / "started").exists()
