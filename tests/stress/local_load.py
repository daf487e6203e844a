"""The apps of the local load test, and the worker that submits a share of them from another
process (``python -m tests.stress.local_load GO_FILE OUT_FILE I,J,K...``).

App ``i`` has 1-4 replicas; replica ``k`` prints ``out_lines(i, k)`` numbered lines to stdout and
``err_lines(i, k)`` to stderr, then exits with ``exit_code(i)``. Apps that fail have one replica
(with several, the first failure terminates the others, so their exit codes are not fixed).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable

from core.specs import AppDef, Role

SCRIPT = 'n=$(( $0 + 7 * $3 )); seq 1 "$n"; seq 1 $(( n / 3 )) >&2; exit "$1"'


def exit_code(i: int) -> int:
    return 0 if i % 10 != 7 else 1 + (i // 10) % 5


def num_replicas(i: int) -> int:
    return 1 if exit_code(i) else 1 + i % 4


def out_lines(i: int, k: int) -> int:
    return 20 + (i * 37) % 150 + 7 * k


def err_lines(i: int, k: int) -> int:
    return out_lines(i, k) // 3


def app(i: int) -> AppDef:
    base = out_lines(i, 0)
    role = Role(
        "r",
        entrypoint="sh",
        args=["-c", SCRIPT, str(base), str(exit_code(i)), "unused", "${replica_id}"],
        num_replicas=num_replicas(i),
    )
    return AppDef(f"load{i}", [role])


def submit_all(
    indices: list[int], threads: int, on_submit: Callable[[int, str], None] | None = None
) -> dict[int, str]:
    """Submits apps ``indices`` from ``threads`` threads sharing one runner; ``{i: handle}``.

    ``on_submit(i, handle)`` is called as soon as each app was submitted.
    """
    from core.runner import get_runner

    handles: dict[int, str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    todo = list(indices)
    with get_runner() as runner:

        def work() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                try:
                    h = runner.run(app(i), "local_cwd")
                except BaseException as e:  # reported by the caller
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    handles[i] = h
                if on_submit is not None:
                    on_submit(i, h)

        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    if errors:
        raise errors[0]
    return handles


def _main(argv: list[str]) -> int:
    go, out, indices = argv[0], argv[1], [int(x) for x in argv[2].split(",") if x]
    deadline = time.monotonic() + 120
    while not os.path.exists(go):  # start together with the other submitters
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.01)
    handles = submit_all(indices, threads=2)
    with open(out, "w") as f:
        json.dump(handles, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
