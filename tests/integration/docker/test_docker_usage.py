"""The figures of one engine stats sample, on cgroup v1 (this host) and v2 (whose samples
this host's engine cannot give: recorded shapes of the engine's answer)."""

from __future__ import annotations

from core.schedulers.docker.usage import cpu_seconds, memory_peak

V1 = {
    "cpu_stats": {"cpu_usage": {"total_usage": 2_500_000_000}},
    "memory_stats": {"usage": 90 << 20, "max_usage": 210 << 20, "stats": {"cache": 5 << 20}},
}
V2 = {
    "cpu_stats": {"cpu_usage": {"total_usage": 1_000_000_000}},
    "memory_stats": {"usage": 120 << 20, "stats": {"inactive_file": 20 << 20, "anon": 95 << 20}},
}


def test_cgroup_v1_sample_gives_the_high_water_mark() -> None:
    assert cpu_seconds(V1) == 2.5
    assert memory_peak(V1) == 210 << 20


def test_cgroup_v2_sample_gives_the_use_without_inactive_file_cache() -> None:
    assert cpu_seconds(V2) == 1.0
    assert memory_peak(V2) == 100 << 20


def test_a_stopped_containers_zeroed_sample_gives_nothing() -> None:
    zeros = {"cpu_stats": {"cpu_usage": {"total_usage": 0}}, "memory_stats": {}}
    assert cpu_seconds(zeros) is None and memory_peak(zeros) is None
