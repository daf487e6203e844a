"""One ``sacct`` for an ended job's records and its usage: the rows split into the two parsers'
inputs, with the usage of a requeued job's last attempt only."""

from __future__ import annotations

from core.schedulers.slurm.jobinfo import SEP, parse_sacct
from core.schedulers.slurm.usage import ACCOUNTING_FIELDS, parse_usage, split_accounting


def _row(**values: str) -> str:
    return SEP.join(values.get(f, "") for f in ACCOUNTING_FIELDS)


def _alloc(job: str, state: str, elapsed: str, comment: str = "") -> str:
    return _row(JobID=job, JobName="w-0", State=state, ExitCode="0:0", NodeList="node1",
                WorkDir="/jobs", ElapsedRaw=elapsed, ReqMem="100M", Comment=comment)  # fmt: skip


def _step(job: str, state: str, elapsed: str, code: str) -> str:
    return _row(JobID=job, JobName="sh", State=state, ExitCode=code, ElapsedRaw=elapsed,
                TotalCPU="00:01.500", MaxRSS="2048K")  # fmt: skip


def test_a_requeued_job_keeps_both_attempts_and_the_last_ones_usage() -> None:
    out = "\n".join(
        [
            _alloc("41", "NODE_FAIL", "30", comment=f"shipyard{SEP}tag"),
            _step("41.0", "CANCELLED", "29", "0:9"),
            _alloc("41", "COMPLETED", "12", comment=f"shipyard{SEP}tag"),
            _step("41.batch", "COMPLETED", "12", "0:0"),
            _step("41.0", "COMPLETED", "11", "0:0"),
        ]
    )
    records, usage_rows = split_accounting(out)
    info = parse_sacct(records)["41"]
    assert info.state == "COMPLETED" and info.restarts == 1
    assert info.comment == f"shipyard{SEP}tag"  # (free text, last: a separator in it stays)
    assert [a.state for a in info.attempts] == ["NODE_FAIL"]
    assert info.components[0].exit_code == 0
    usage, state = parse_usage(usage_rows)["41"]["w-0"]
    assert (usage.wall_time, usage.cpu_time, state) == (11.0, 1.5, "COMPLETED")
    assert usage.peak_memory == 2 << 20 and usage.requested_memory == 100 << 20


def test_rows_with_fewer_fields_are_left_out() -> None:
    records, usage_rows = split_accounting(SEP.join(["42", "w-0", "COMPLETED"]) + "\n")
    assert records == "" and usage_rows == ""
