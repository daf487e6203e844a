"""A peer in the bench (issue 31): the same workloads through Shipyard, TorchX 0.7.0 and the raw
mechanism, in one run (``python -m bench --only torchx``, or ``--peer`` beside the default run).

TorchX is no dependency of Shipyard: it is installed into its own venv (``bench/.torchx-venv``,
made on the first run with ``python -m venv`` + ``pip install torchx==0.7.0 docker``) and run
there by ``bench/_torchx_worker.py``, which times each TorchX trial in its own process when
asked; the three sides of a row are interleaved as in every section. Rows set no target (INFO);
the ``torchx`` column is TorchX's median and ``vs torchx`` is shipyard / torchx.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

from bench.common import Ctx, check_lines, kill_groups, raw_popen, raw_read_split
from bench.harness import (
    MS,
    Row,
    Section,
    Target,
    fill,
    interleave,
    median,
    repeat_timed,
    vs_peer,
    wait_for,
)

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".torchx-venv")
WORKER = os.path.join(HERE, "_torchx_worker.py")
TORCHX = "0.7.0"
PEER = "torchx"
IMAGE = "shipyard-test/busybox:latest"  # (built locally by scripts/build_test_images.sh)
RAW_LABEL = "shipyard.bench.raw"
MODULES = ("local", "docker", "slurm")
SUBMITS = (1, 8, 32)
ROWS = [
    *(f"import the {m} scheduler module (fresh interpreter)" for m in MODULES),
    *(f"local submit {n} replica(s) of sleep 30" for n in SUBMITS),
    "local status of 8 running replicas, submitting process",
    "local 32 replicas: all started (latest start - t0)",
    "local log_lines 200k lines, whole",
    "docker submit 1 replica (started)",
]
#: the issue's targets against TorchX in the same run (issue 31): importing a backend module at
#: most half TorchX's time, a describe from the submitting process no more than TorchX's own
TARGETS: dict[str, Target] = {
    **{name: vs_peer(0.5, PEER) for name in ROWS[:3]},
    ROWS[6]: vs_peer(1.0, PEER),
}


# --------------------------------------------------------------------------------------------
# TorchX's venv and worker
# --------------------------------------------------------------------------------------------


def _torchx_version(py: str) -> str | None:
    try:
        out = subprocess.run([py, "-c", "import docker, torchx; print(torchx.__version__)"],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def venv_python(path: str = VENV, verbose: bool = True) -> str:
    """The python of a venv holding torchx==0.7.0 and the docker SDK, made when missing (the
    SDK at the main venv's version, so the Docker row compares the same client); RuntimeError
    saying why when it cannot be made."""
    py = os.path.join(path, "bin", "python")
    if _torchx_version(py) == TORCHX:
        return py
    try:
        docker_req = f"docker=={metadata.version('docker')}"
    except metadata.PackageNotFoundError:
        docker_req = "docker"
    if verbose:
        print(f"  making {path}: torchx=={TORCHX} {docker_req}", file=sys.stderr, flush=True)
    for cmd in (
        [sys.executable, "-m", "venv", "--clear", path],
        [py, "-m", "pip", "install", "-q", f"torchx=={TORCHX}", docker_req],
    ):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"python {shlex.join(cmd[1:4])}: {e}") from e
        if p.returncode != 0:
            tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or [""]
            raise RuntimeError(
                f"python {shlex.join(cmd[1:4])} exited {p.returncode}: {tail[0][:200]}"
            )
    if (found := _torchx_version(py)) != TORCHX:
        raise RuntimeError(f"{path}: torchx {found} after installing {TORCHX}")
    return py


class Peer:
    """The worker process running TorchX (see bench/_torchx_worker.py)."""

    def __init__(self, py: str, tmp: str) -> None:
        self.log = os.path.join(tmp, "torchx-worker.log")
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [py, WORKER, os.path.join(tmp, "torchx-logs")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp,
            )  # fmt: skip

    def call(self, op: str, timeout: float = 120, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            with open(self.log) as f:
                tail = f.read().strip().splitlines()[-1:] or ["no answer"]
            raise RuntimeError(f"torchx worker, {op}: {tail[0][:200]}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"torchx: {reply['error']}")
        return reply

    def dt(self, op: str, **kwargs: Any) -> float:
        return float(self.call(op, **kwargs)["dt"])

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"op": "exit"}\n')
            self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _row(sec: Section, name: str, raw_name: str) -> Row:
    row = sec.row(name, TARGETS.get(name), raw_name=raw_name)
    row.peer_name = PEER
    return row


def _fill(row: Row, samples: dict[str, list[float]]) -> None:
    fill(row, samples)
    row.peer = median(samples[PEER])


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} exited {p.returncode}: {p.stderr.decode()[-300:]}")
    return dt


def _app(name: str, entrypoint: str, args: list[str], n: int = 1, image: str = "") -> Any:
    from core.specs import AppDef, Role

    return AppDef(name, [Role("r", image=image, entrypoint=entrypoint, args=args,
                              num_replicas=n)])  # fmt: skip


def _end(runner: Any, handle: str) -> None:
    """Cancels a local app and waits until it is terminal and its logs are collected, so that
    its background work does not run in the next trial."""
    from core.schedulers.local_scheduler import state_dir

    runner.cancel(handle)
    wait_for(lambda: (s := runner.status(handle)) is not None and s.is_terminal(), 30, handle)
    done = os.path.join(state_dir(), handle.rsplit("/", 1)[1], "logs_done")
    wait_for(lambda: os.path.exists(done), 30, f"{handle} logs")


def _starts(path: str, n: int) -> list[int] | None:
    """The start times (ns) the ``n`` replicas appended to ``path``, once all are there."""
    try:
        with open(path) as f:
            stamps = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
    return stamps if len(stamps) >= n else None


# --------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------


#: what a backend module cannot do without (the app model's dataclasses and enums, typing,
#: logging, JSON records): the floor of an import row
FLOOR = "typing, dataclasses, enum, logging, json, re"


def _import_rows(sec: Section, ctx: Ctx, tx_py: str) -> None:
    runs = max(ctx.runs * 3, 15)
    for kind, name in zip(MODULES, ROWS, strict=False):

        def measure(row: Row, kind: str = kind) -> None:
            ship, tx = f"core.schedulers.{kind}_scheduler", f"torchx.schedulers.{kind}_scheduler"
            samples = interleave(
                {
                    "shipyard": lambda: _wall([ctx.python, "-c", f"import {ship}"]),
                    PEER: lambda: _wall([tx_py, "-c", f"import {tx}"]),
                    "raw": lambda: _wall([ctx.python, "-c", "pass"]),
                    "raw_torchx": lambda: _wall([tx_py, "-c", "pass"]),
                    "floor": lambda: _wall([ctx.python, "-c", f"import {FLOOR}"]),
                },
                runs,
                warmup=2,
            )
            _fill(row, samples)
            tx_pass = median(samples["raw_torchx"])
            s, r, p = (median(samples[k]) for k in ("shipyard", "raw", PEER))
            row.note = (
                f"import {ship} vs {tx}; over its own venv's `python -c pass`: shipyard"
                f" +{(s - r) * MS:.0f} ms, torchx +{(p - tx_pass) * MS:.0f}"
                f" ms (TorchX venv's pass: {tx_pass * MS:.0f} ms); the standard modules any"
                f" backend needs ({FLOOR}): {median(samples['floor']) / p:.2f}x torchx"
            )  # fmt: skip

        sec.measure(_row(sec, name, "python -c pass"), measure)


def _submit_rows(sec: Section, ctx: Ctx, runner: Any, tx: Peer) -> None:
    counter = [0]
    for n, name in zip(SUBMITS, ROWS[3:], strict=False):

        def measure(row: Row, n: int = n) -> None:
            app = _app("bsub", "sleep", ["30"], n)
            sleep = shutil.which("sleep") or "/bin/sleep"

            def shipyard() -> float:
                t0 = time.perf_counter()
                h = runner.run(app, "local_cwd")
                dt = time.perf_counter() - t0
                _end(runner, h)
                return dt

            def raw() -> float:
                counter[0] += 1
                d = os.path.join(ctx.tmp, "torchx-raw", str(counter[0]))
                t0 = time.perf_counter()
                procs = raw_popen([sleep, "30"], n, d)
                dt = time.perf_counter() - t0
                kill_groups(procs)
                return dt

            sides = {"shipyard": shipyard, PEER: lambda: tx.dt("submit", n=n), "raw": raw}
            _fill(row, interleave(sides, ctx.runs * {1: 4, 8: 2}.get(n, 1), warmup=2))

        sec.measure(_row(sec, name, "Popen + log files"), measure)


def _status_row(sec: Section, ctx: Ctx, runner: Any, tx: Peer) -> None:
    from core.specs import AppState

    def measure(row: Row) -> None:
        h = runner.run(_app("bdesc", "sleep", ["60"], 8), "local_cwd")
        procs = [subprocess.Popen(["sleep", "60"]) for _ in range(8)]
        try:
            tx.call("hold", n=8)
            wait_for(lambda: (s := runner.status(h)) and s.state == AppState.RUNNING, 10, h)
            sides = {
                "shipyard": lambda: repeat_timed(lambda: runner.status(h), 200),
                PEER: lambda: tx.dt("status", inner=200),
                "raw": lambda: repeat_timed(lambda: [p.poll() for p in procs], 200),
            }
            _fill(row, interleave(sides, ctx.runs, warmup=2))
            row.note = "runner.status(handle) on both (mean of 200 calls a sample)"
        finally:
            for p in procs:
                p.kill()
                p.wait()
            tx.call("release")
            _end(runner, h)

    sec.measure(_row(sec, ROWS[6], "Popen.poll() x8"), measure)


def _started_row(sec: Section, ctx: Ctx, runner: Any, tx: Peer) -> None:
    n, base = 32, os.path.join(ctx.tmp, "torchx-starts")
    os.makedirs(base, exist_ok=True)
    counter = [0]

    def fresh() -> tuple[str, list[str]]:
        counter[0] += 1
        path = os.path.join(base, str(counter[0]))
        return path, ["-c", f"date +%s%N >> {shlex.quote(path)}; exec sleep 30"]

    def shipyard() -> float:
        path, args = fresh()
        t0 = time.time_ns()
        h = runner.run(_app("bstart", "sh", args, n), "local_cwd")
        stamps = wait_for(lambda: _starts(path, n), 30, f"{n} starts", interval=0.001)
        _end(runner, h)
        return (max(stamps) - t0) / 1e9

    def raw() -> float:
        path, args = fresh()
        t0 = time.time_ns()
        procs = raw_popen(["sh", *args], n, path + ".logs")
        stamps = wait_for(lambda: _starts(path, n), 30, f"{n} starts", interval=0.001)
        kill_groups(procs)
        return (max(stamps) - t0) / 1e9

    def measure(row: Row) -> None:
        sides = {"shipyard": shipyard, PEER: lambda: tx.dt("started", n=n, path=fresh()[0]),
                 "raw": raw}  # fmt: skip
        _fill(row, interleave(sides, ctx.runs, warmup=1))
        row.note = "each replica: sh -c 'date +%s%N >> file; exec sleep 30'"

    sec.measure(_row(sec, ROWS[7], "Popen x32 + log files"), measure)


def _log_row(sec: Section, ctx: Ctx, runner: Any, tx: Peer) -> None:
    from core.specs import AppState

    def measure(row: Row) -> None:
        expected, src = ctx.log_lines(), ctx.log_file()
        h = runner.run(_app("blog", "cat", [src]), "local_cwd")
        st = runner.wait(h, wait_interval=0.05, timeout=120)
        if st is None or st.state != AppState.SUCCEEDED:
            raise RuntimeError(f"log app {h} ended {st}")
        _end(runner, h)  # (already ended: waits for its logs to be collected)
        tx.call("prepare_log", timeout=300, path=src)
        got: dict[str, Any] = {}

        def shipyard() -> float:
            t0 = time.perf_counter()
            got["shipyard"] = list(runner.log_lines(h, "r", 0))
            return time.perf_counter() - t0

        def torchx() -> float:
            got[PEER] = tx.call("log", timeout=300)
            return float(got[PEER]["dt"])

        sides = {
            "shipyard": shipyard,
            PEER: torchx,
            "raw": lambda: _timed_call(raw_read_split, src),
        }
        _fill(row, interleave(sides, ctx.runs, warmup=1))
        t = got[PEER]
        peer = "whole" if t["whole"] else f"{t['lines']:,} lines, {t['cut']} cut in two"
        row.note = f"{len(expected):,} lines; torchx's lines: {peer}"
        try:
            check_lines(got["shipyard"], expected, row.name)
        except AssertionError as e:
            row.status, row.note = "MISS", f"shipyard's lines not whole: {e}; {row.note}"

    sec.measure(_row(sec, ROWS[8], "read + splitlines"), measure)


def _timed_call(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# docker
# --------------------------------------------------------------------------------------------


def _docker() -> tuple[Any, str] | str:
    """(client, the image's id) or why the Docker row is skipped."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:
        return f"no Docker engine ({type(e).__name__}); start it with scripts/start_docker.sh"
    try:
        return client, client.images.get(IMAGE).id
    except Exception:
        client.close()
        return f"image {IMAGE} is missing (scripts/build_test_images.sh)"


def _remove(api: Any, label: str) -> None:
    """Removes the containers and networks labelled ``label`` at once (untimed clean-up)."""
    for c in api.containers(all=True, filters={"label": label}):
        api.remove_container(c["Id"], force=True)
    for net in api.networks(filters={"label": label}):
        api.remove_network(net["Id"])


def _docker_row(sec: Section, ctx: Ctx, runner: Any, tx: Peer) -> None:
    found = _docker()
    if isinstance(found, str):
        sec.skip_all(found, [(ROWS[9], None, "ms")])
        sec.rows[-1].peer_name = PEER
        return
    client, image_id = found
    api = client.api

    def shipyard() -> float:
        t0 = time.perf_counter()
        h = runner.run(_app("bdsub", "sleep", ["600"], image=IMAGE), "local_docker")
        dt = time.perf_counter() - t0
        label = f"shipyard.app_id={h.rsplit('/', 1)[1]}"
        running = len(api.containers(filters={"label": label}))
        _remove(api, label)
        assert running == 1, f"{running} of 1 containers running"
        return dt

    def raw() -> float:
        t0 = time.perf_counter()
        api.start(api.create_container(IMAGE, ["sleep", "600"], labels={RAW_LABEL: "1"})["Id"])
        dt = time.perf_counter() - t0
        _remove(api, RAW_LABEL)
        return dt

    def measure(row: Row) -> None:
        sides = {"shipyard": shipyard, PEER: lambda: tx.dt("docker_submit", image=image_id),
                 "raw": raw}  # fmt: skip
        _fill(row, interleave(sides, ctx.runs, warmup=1))
        row.note = "torchx given the image's id (it tries to pull an image named by tag)"

    try:
        sec.measure(_row(sec, ROWS[9], "SDK create + start"), measure)
    finally:
        client.close()


def run(ctx: Ctx) -> list[Row]:
    sec = Section("torchx", ctx.runs, ctx.verbose)
    try:
        tx_py = venv_python(verbose=ctx.verbose)
    except RuntimeError as e:
        sec.skip_all(f"no TorchX venv ({e})", [(name, TARGETS.get(name), "ms") for name in ROWS])
        for row in sec.rows:
            row.peer_name = PEER
        return sec.rows
    _import_rows(sec, ctx, tx_py)

    from core.runner import get_runner

    runner = get_runner("benchtorchx")
    tx = Peer(tx_py, ctx.tmp)
    try:
        for rows in (_submit_rows, _status_row, _started_row, _log_row, _docker_row):
            rows(sec, ctx, runner, tx)
    finally:
        tx.close()
        runner.close()
        shutil.rmtree(os.path.join(ctx.tmp, "torchx-raw"), ignore_errors=True)
    return sec.rows


if __name__ == "__main__":
    sys.exit("run `python -m bench --only torchx`")
