"""The TorchX side of ``python -m bench --only torchx``, run by the python of TorchX's own venv
(bench/.torchx-venv: TorchX is no dependency of Shipyard). Standard library and TorchX only.

    <torchx-venv>/bin/python bench/_torchx_worker.py LOG_DIR

Reads one JSON request a line on stdin, times it in this process and answers one JSON line on
stdout (``{"dt": seconds, ...}`` or ``{"error": "..."}``), so that the section interleaves
TorchX's trials with Shipyard's and the raw mechanism's. TorchX's local scheduler keeps its
apps in memory: its apps are described, logged and cancelled from this process.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from torchx.runner import get_runner
from torchx.specs import AppDef, AppState, Role

DOCKER_LABEL = "torchx.pytorch.org/app-id"


def _app(name: str, entrypoint: str, args: list[str], n: int = 1, image: str = "") -> AppDef:
    return AppDef(name, roles=[Role("r", image=image, entrypoint=entrypoint, args=args,
                                    num_replicas=n)])  # fmt: skip


def _wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.001)
    return v


def _starts(path: str, n: int) -> list[int] | None:
    """The start times (ns) the ``n`` replicas appended to ``path``, once all are there."""
    try:
        with open(path) as f:
            stamps = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
    return stamps if len(stamps) >= n else None


class Worker:
    def __init__(self, log_dir: str) -> None:
        self.runner = get_runner()
        self.cfg = {"log_dir": log_dir}
        self.held: str | None = None  # the running app ``status`` describes
        self.log_app: str | None = None
        self.log_src = ""
        self.made_network = False

    def _end(self, handle: str) -> None:
        """Cancels ``handle`` (TorchX's cancel waits for the replicas and log threads)."""
        self.runner.cancel(handle)
        _wait(lambda: (s := self.runner.status(handle)) is None or s.is_terminal(), 30, handle)

    def submit(self, n: int) -> dict[str, Any]:
        app = _app("bsub", "sleep", ["30"], n)
        t0 = time.perf_counter()
        h = self.runner.run(app, "local_cwd", self.cfg)
        dt = time.perf_counter() - t0
        self._end(h)
        return {"dt": dt}

    def started(self, n: int, path: str) -> dict[str, Any]:
        app = _app("bstart", "sh", ["-c", f"date +%s%N >> {path}; exec sleep 30"], n)
        t0 = time.time_ns()
        h = self.runner.run(app, "local_cwd", self.cfg)
        stamps = _wait(lambda: _starts(path, n), 30, f"{n} starts")
        self._end(h)
        return {"dt": (max(stamps) - t0) / 1e9}

    def hold(self, n: int) -> dict[str, Any]:
        self.held = self.runner.run(_app("bdesc", "sleep", ["60"], n), "local_cwd", self.cfg)
        h = self.held
        _wait(lambda: (s := self.runner.status(h)) and s.state == AppState.RUNNING, 10, "RUNNING")
        return {}

    def status(self, inner: int) -> dict[str, Any]:
        assert self.held is not None
        t0 = time.perf_counter()
        for _ in range(inner):
            st = self.runner.status(self.held)
        dt = (time.perf_counter() - t0) / inner
        assert st is not None and st.state == AppState.RUNNING, st
        return {"dt": dt}

    def release(self) -> dict[str, Any]:
        if self.held:
            self._end(self.held)
        self.held = None
        return {}

    def prepare_log(self, path: str) -> dict[str, Any]:
        h = self.runner.run(_app("blog", "cat", [path]), "local_cwd", self.cfg)
        st = self.runner.wait(h, wait_interval=0.05)
        if st is None or st.state != AppState.SUCCEEDED:
            raise RuntimeError(f"log app {h} ended {st}")
        self.log_app, self.log_src = h, path
        return {}

    def log(self) -> dict[str, Any]:
        """Every line of the log app's replica, then (untimed) how they compare to its file."""
        assert self.log_app is not None
        t0 = time.perf_counter()
        got = list(self.runner.log_lines(self.log_app, "r", 0))
        dt = time.perf_counter() - t0
        with open(self.log_src, encoding="utf-8", newline="") as f:
            expected = f.read().splitlines(keepends=True)
        cut = sum(not x.endswith("\n") for x in got[:-1])
        return {"dt": dt, "lines": len(got), "whole": got == expected, "cut": cut}

    def docker_submit(self, image: str) -> dict[str, Any]:
        import docker

        client = docker.from_env()
        if not self.made_network and not client.networks.list(names=["torchx"]):
            self.made_network = True  # (TorchX creates it on its first docker submit)
        app = _app("bdsub", "sleep", ["600"], 1, image=image)
        t0 = time.perf_counter()
        h = self.runner.run(app, "local_docker")
        dt = time.perf_counter() - t0
        app_id = h.rsplit("/", 1)[1]
        running = client.containers.list(filters={"label": f"{DOCKER_LABEL}={app_id}"})
        for c in client.containers.list(all=True, filters={"label": f"{DOCKER_LABEL}={app_id}"}):
            c.remove(force=True)
        client.close()
        if len(running) != 1:
            raise AssertionError(f"{len(running)} of 1 containers running")
        return {"dt": dt}

    def close(self) -> None:
        self.release()
        self.runner.close()
        if self.made_network:
            import docker

            client = docker.from_env()
            for net in client.networks.list(names=["torchx"]):
                net.remove()
            client.close()


def main(argv: list[str]) -> int:
    # replies go to the real stdout only; anything printed while working goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    worker = Worker(argv[0])
    try:
        for line in sys.stdin:
            req = json.loads(line)
            op = req.pop("op")
            if op == "exit":
                break
            try:
                reply = getattr(worker, op)(**req)
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                reply = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
