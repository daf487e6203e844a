"""The demo's Python-API part: build an app in Python, run it, follow it, then address it by handle
from another process (the CLI), as an Airflow sensor or a Prefect task would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from core.runner import get_runner
from core.specs import AppDef, AppState, Role, macros

SHIPYARD = str(Path(sys.executable).with_name("shipyard"))


def main() -> int:
    app = AppDef(
        name="api-demo",
        roles=[
            Role(
                name="worker",
                entrypoint="sh",
                args=[
                    "-c",
                    f"echo worker {macros.replica_id} says hi; echo done {macros.replica_id}",
                ],
                num_replicas=3,
            ),
            Role(name="reporter", entrypoint="echo", args=["report for", macros.app_id]),
        ],
    )
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd")
        print(f"submitted {handle}")
        for line in runner.stream_logs(handle):
            print(f"  {line}")
        status = runner.wait(handle)
        assert status is not None
        print(status.format())
    # another process only needs the handle
    for cmd in (["status", handle], ["log", f"{handle}/worker/2"]):
        print(f"$ shipyard {' '.join(cmd)}")
        subprocess.run([SHIPYARD, *cmd], check=True)
    return 0 if status.state == AppState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
