"""Shell completion of the `shipyard` command's values through argcomplete's own protocol, as
the shell asks for it (issue 29): scheduler names, run option keys, app handles and replicas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def test_values_complete(tmp_path: Path) -> None:
    session = f"comp{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "SHIPYARD_SESSION": session,
        "SHIPYARD_STATE_DIR": str(tmp_path / "state"),  # (local apps: this test's alone)
        "XDG_CONFIG_HOME": str(tmp_path / "x"),
    }
    out = tmp_path / "completions"

    def complete(line: str) -> list[str]:
        comp = {
            **env,
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        }
        subprocess.run([SHIPYARD], env=comp, cwd=tmp_path, timeout=60, check=True,
                       capture_output=True)  # fmt: skip
        return sorted(w.strip() for w in out.read_text().split("\x0b") if w.strip())

    assert complete("shipyard run -s local_d") == ["local_dir", "local_docker"]
    assert complete("shipyard runopts sl") == ["slurm"]
    assert complete("shipyard run --cfg prepend") == ["prepend_cwd="]
    assert complete("shipyard run --cfg log_dir=/x,prepend_cwd=t") == [
        "log_dir=/x,prepend_cwd=true"
    ]
    assert "partition=" in complete("shipyard run -s slurm --cfg ")
    r = subprocess.run([SHIPYARD, "run", "--json", "--replicas", "2", "--", "true"], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    handle = json.loads(r.stdout)["app_handle"]
    assert complete(f"shipyard status local_cwd://{session}/") == [handle]
    assert complete(f"shipyard cancel local_cwd://{session}/tr") == [handle]
    assert complete(f"shipyard log {handle}/true/") == [f"{handle}/true/0", f"{handle}/true/1"]
