"""``python -m bench``: every hot path of Shipyard beside its physical limit, in one run.

    python -m bench                       # everything (skips backends whose service is missing)
    python -m bench --only local,startup  # some sections: local, arrays, docker, slurm, remote,
                                          # containers, airflow, prefect, startup, curves
    python -m bench --runs 9              # runs per row (medians; fast paths repeat more)
    python -m bench --json out.json       # default: bench/results/latest.json
    python -m bench --markdown            # also print the table as Markdown (for the README)
    python -m bench --peer                # also the optional `torchx` section: the workloads
                                          # through TorchX 0.7.0 (own venv) beside Shipyard's
                                          # (alone: --only torchx)

Prints a table (``shipyard``, ``raw``, ``ratio``, ``target``, ``result``) and exits 1 when a row
misses its target or fails to run; a backend whose service is not running is skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

SECTIONS = (
    "local",
    "arrays",
    "docker",
    "slurm",
    "remote",
    "containers",
    "airflow",
    "prefect",
    "startup",
    "curves",
    "torchx",
)
#: sections run only when asked for (``--only``, ``--peer``), not by default
OPTIONAL = ("torchx",)
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "latest.json")


def _load(name: str) -> Callable[..., list]:  # type: ignore[type-arg]
    if name == "local":
        from bench import local_bench as m
    elif name == "arrays":
        from bench import arrays_bench as m  # type: ignore[no-redef]
    elif name == "docker":
        from bench import docker_bench as m  # type: ignore[no-redef]
    elif name == "slurm":
        from bench import slurm_bench as m  # type: ignore[no-redef]
    elif name == "remote":
        from bench import remote_bench as m  # type: ignore[no-redef]
    elif name == "containers":
        from bench import containers_bench as m  # type: ignore[no-redef]
    elif name == "airflow":
        from bench import airflow_bench as m  # type: ignore[no-redef]
    elif name == "prefect":
        from bench import prefect_bench as m  # type: ignore[no-redef]
    elif name == "curves":
        from bench import curves_bench as m  # type: ignore[no-redef]
    elif name == "torchx":
        from bench import torchx_bench as m  # type: ignore[no-redef]
    else:
        from bench import startup_bench as m  # type: ignore[no-redef]
    return m.run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", help=f"comma-separated sections ({','.join(SECTIONS)})")
    p.add_argument("--runs", type=int, default=5, help="runs per row (>= 5; default 5)")
    p.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--peer", action="store_true", help="also run the torchx section")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    default = ",".join(s for s in SECTIONS if s not in OPTIONAL)
    sections = [s.strip() for s in (args.only or default).split(",") if s.strip()]
    if args.peer and "torchx" not in sections:
        sections.append("torchx")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        p.error(f"--only: unknown section(s) {unknown}; expected some of {list(SECTIONS)}")
    if args.runs < 5:
        p.error(f"--runs: expected at least 5 (medians of >= 5 runs), got {args.runs}")

    tmp = tempfile.mkdtemp(prefix="shipyard-bench-")
    # local apps of the benchmark keep their state apart from the user's
    os.environ["SHIPYARD_STATE_DIR"] = os.path.join(tmp, "state")
    os.environ.setdefault("SHIPYARD_SESSION", "bench")
    # Python processes started by the benchmark use bytecode caches, as an installed package
    # does (kept apart from the source tree)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
    # run from the repository root so `python -m bench._worker` works in subprocesses
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    )

    from bench.common import Ctx
    from bench.harness import machine_info, markdown, table, write_json

    info = machine_info()
    info["load_before"] = os.getloadavg()
    info["runs"] = args.runs
    info["sections"] = sections
    ctx = Ctx(tmp=tmp, runs=args.runs, verbose=not args.quiet)
    rows = []
    t0 = time.monotonic()
    try:
        for name in sections:
            if not args.quiet:
                print(f"== {name} (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
            rows += _load(name)(ctx)
    finally:
        info["load_after"] = os.getloadavg()
        info["seconds"] = round(time.monotonic() - t0, 1)
        shutil.rmtree(tmp, ignore_errors=True)
    write_json(args.json, info, rows)

    la, lb = info["load_before"], info["load_after"]
    print(
        f"Shipyard benchmarks — {info['cpus']} CPUs ({info['cpu_model']}), Python"
        f" {info['python']}, commit {info['commit']}; median of {args.runs}+ runs per row;"
        f" load average {la[0]:.2f} before, {lb[0]:.2f} after; {info['seconds']}s"
    )
    print(table(rows))
    if args.markdown:
        print()
        print(markdown(rows))
    missed = [r for r in rows if r.status in ("MISS", "ERROR")]
    skipped = [r for r in rows if r.status == "SKIP"]
    print(
        f"\n{sum(r.status == 'PASS' for r in rows)} passed, {len(missed)} missed or failed,"
        f" {len(skipped)} skipped; results in {args.json}"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
