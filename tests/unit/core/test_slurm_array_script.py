"""The batch script of a native Slurm array, run by bash with ``srun`` standing in as a function
that runs the task's command: each task gets its own values, whatever characters they hold,
and none reaches a command line before the replica's own (no Slurm needed: the script's
shell logic is what is checked; the real cluster runs it in tests/integration/slurm)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from core.arrays.spec import array_template, make_spec
from core.schedulers.slurm.scheduler import SlurmScheduler
from core.specs import AppDef, Role

HOSTILE = ["a b", "it's", '$HOME "q"', "semi;colon\nnewline", "*"]


def _script(app: AppDef, params: list[dict[str, str]], tmp_path: Path) -> str:
    spec = make_spec(app, params=params, max_parallel=2)
    indices = list(range(len(params)))
    template = array_template(app, spec, indices, "slurm://s/x@1")
    req = SlurmScheduler("s").submit_dryrun(template[0], {"job_dir": str(tmp_path / "j")}).request
    req.array, req.array_values = "0-4%2", template[1]
    return req.materialize()


def _run_task(script: str, task: int, tmp_path: Path) -> list[str]:
    stand_in = 'srun() { while [ "${1#--}" != "$1" ]; do shift; done; "$@"; }\n'
    body = script.replace("\nsrun \\", "\n" + stand_in + "srun \\", 1)
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "99", "SLURM_ARRAY_JOB_ID": "98",
           "SLURM_ARRAY_TASK_ID": str(task)}  # fmt: skip
    p = subprocess.run(["bash", "-c", body], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.split("\0")[:-1]


def test_each_task_gets_its_own_values(tmp_path: Path) -> None:
    app = AppDef(
        "sweep",
        [
            Role(
                "w",
                entrypoint="printf",
                args=["%s\\0", "${params.word}", "i=${array_index}", "${app_id}"],
                env={"WORD": "<${params.word}>"},
            )
        ],
    )
    params = [{"word": w} for w in HOSTILE]
    script = _script(app, params, tmp_path)
    assert "semi;colon" not in script.split("srun \\")[1]  # (values only in the case block)
    for i, word in enumerate(HOSTILE):
        assert _run_task(script, i, tmp_path) == [word, f"i={i}", f"98_{i}"]


def test_the_replica_sees_its_index_params_and_env(tmp_path: Path) -> None:
    app = AppDef(
        "sweep",
        [
            Role(
                "w",
                entrypoint="sh",
                args=[
                    "-c",
                    'printf "%s\\0" "$SHIPYARD_ARRAY_INDEX" "$SHIPYARD_ARRAY_PARAMS" "$WORD" "$SHIPYARD_APP_ID"',
                ],
                env={"WORD": "<${params.word}>"},
            )
        ],
    )
    params = [{"word": w} for w in HOSTILE]
    script = _script(app, params, tmp_path)
    for i in (1, 3):
        index, as_json, word, app_id = _run_task(script, i, tmp_path)
        assert (index, json.loads(as_json), word, app_id) == (
            str(i), params[i], f"<{HOSTILE[i]}>", f"98_{i}"
        )  # fmt: skip
    assert (tmp_path / "shipyard-results-98_3").is_dir()
