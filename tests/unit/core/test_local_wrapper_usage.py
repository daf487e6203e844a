"""What a local replica's wrapper records as it ends (its shell's ``times``), read back: the
formats of dash and bash, and what is not (yet) a whole record."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from core.schedulers.local.appdir import AppDir


def _app(tmp_path: Path, text: str | None) -> AppDir:
    app = AppDir(str(tmp_path), "a-1")
    os.mkdir(app.path)
    if text is not None:
        Path(app.file("times.0")).write_text(text)
    return app


@pytest.mark.parametrize(
    ("text", "cpu"),
    [
        ("0m0.000000s 0m0.000000s\n0m1.250000s 0m0.030000s\n", 1.28),  # dash
        ("0m0.001s 0m0.002s\n2m0.275s 0m0.036s\n", 120.311),  # bash
    ],
)
def test_the_cpu_time_of_the_children_and_the_end_from_the_file_time(
    tmp_path: Path, text: str, cpu: float
) -> None:
    app = _app(tmp_path, text)
    os.utime(app.file("times.0"), (1000.5, 1000.5))
    assert app.wrapper_times(0) == (cpu, 1000.5)


@pytest.mark.parametrize(
    "text", [None, "", "0m0.000000s 0m0.000000s\n", "0m0s 0m0s\n0m1.2s", "a b\nc d\n", "0m0s\n1m\n"]
)
def test_a_missing_or_partial_record_gives_no_line(tmp_path: Path, text: str | None) -> None:
    assert _app(tmp_path, text).wrapper_times(0) is None


@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_what_the_installed_shells_print_is_read(tmp_path: Path, shell: str) -> None:
    """A child that burns CPU, then the shell's ``times``, as the wrapper does."""
    app = _app(tmp_path, None)
    child = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
    script = f"sh -c '{child}'; times >\"$1/times.0\""
    subprocess.run([shell, "-c", script, shell, app.path], check=True, timeout=60)
    times = app.wrapper_times(0)
    assert times is not None and times[0] >= 0.05


def test_the_peak_rss_is_this_process_vmhwm() -> None:
    from core.schedulers.local.outcome import peak_rss_kib

    grown = bytearray(64 << 20)  # 64 MiB, touched: resident now
    for i in range(0, len(grown), 4096):
        grown[i] = 1
    peak = peak_rss_kib()
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    hwm = int(fields["VmHWM"].split()[0])
    # (reading the file after it may have grown the peak a little)
    assert hwm - 1024 <= peak <= hwm and peak >= 64 << 10
