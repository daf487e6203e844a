"""Start-up rows: import times over a bare interpreter, the CLI's wall time, memory."""

from __future__ import annotations

import json
import os
import subprocess
import time

from bench.common import Ctx
from bench.harness import Row, Section, at_most_mib, at_most_ms, fill, interleave, over_ms

MEM_APPS = 1000


def _timed(cmd: list[str], cwd: str | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} exited {p.returncode}: {p.stderr.decode()[-300:]}")
    return dt


def run(ctx: Ctx) -> list[Row]:
    sec = Section("startup", ctx.runs, ctx.verbose)
    py = ctx.python
    runs = max(ctx.runs * 3, 15)

    for module, limit in (("core", 50), ("core.schedulers.docker_scheduler", 120)):

        def import_row(row: Row, module: str = module) -> None:
            fill(
                row,
                interleave(
                    {
                        "shipyard": lambda: _timed([py, "-c", f"import {module}"]),
                        "raw": lambda: _timed([py, "-c", "pass"]),
                    },
                    runs,
                    warmup=2,
                ),
            )

        sec.measure(
            sec.row(f'python -c "import {module}"', over_ms(limit), raw_name="python -c pass"),
            import_row,
        )

    def cli_row(row: Row, argv: list[str]) -> None:
        shipyard = os.path.join(os.path.dirname(py), "shipyard")
        if not os.path.exists(shipyard):
            shipyard_cmd = [py, "-m", "core.cli"]
        else:
            shipyard_cmd = [shipyard]
        cwd = os.path.join(ctx.tmp, "cli")
        os.makedirs(cwd, exist_ok=True)
        fill(
            row,
            interleave(
                {
                    "shipyard": lambda: _timed([*shipyard_cmd, *argv], cwd),
                    "raw": lambda: _timed(
                        [py, "-c", "import subprocess; subprocess.run(['true'])"], cwd
                    ),
                },
                runs,
                warmup=2,
            ),
        )

    for argv in (["--version"], ["run", "--wait", "--", "true"]):

        def measure(row: Row, argv: list[str] = argv) -> None:
            cli_row(row, argv)

        sec.measure(
            sec.row(
                f"`shipyard {' '.join(argv)}` wall",
                at_most_ms(100),  # (issue 31: both within 100 ms on this machine)
                raw_name="python -c subprocess.run(['true'])",
            ),
            measure,
        )

    def mem_row(row: Row) -> None:
        def worker(kind: str) -> dict[str, int]:
            p = subprocess.run(
                [py, "-m", "bench._worker", f"mem-{kind}", str(MEM_APPS)],
                capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if p.returncode != 0:
                raise RuntimeError(f"mem-{kind} worker failed: {p.stderr.strip()[-300:]}")
            return json.loads(p.stdout)  # type: ignore[no-any-return]

        raw = worker("raw")
        ship = worker("shipyard")
        row.samples = {"shipyard": [ship["VmHWM"]], "raw": [raw["VmHWM"]]}
        row.shipyard = float(ship["VmHWM"])
        row.raw = float(raw["VmHWM"])
        row.note = (
            f"peak RSS; current {ship['VmRSS'] / (1 << 20):.1f} MiB; one run"
            " (raw: same imports + Popen/wait of 1,000 `true`)"
        )

    sec.measure(
        sec.row(f"memory: one process tracking {MEM_APPS:,} finished local apps",
                at_most_mib(50), unit="MiB", raw_name="python + Popen x1000"),
        mem_row,
    )  # fmt: skip
    return sec.rows
