"""The one duration syntax (core.durations) and the fields that use it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.durations import DurationError, parse_duration, parse_time, seconds_of


@pytest.mark.parametrize(
    "value, seconds",
    [(90, 90), (2.5, 2.5), ("90", 90), ("2.5", 2.5), ("90s", 90), ("10m", 600), ("2h", 7200),
     ("1d", 86400), ("1h30m", 5400), (" 10M ", 600), ("01:30", 90), ("01:30:00", 5400),
     ("1-00:00:00", 86400), ("2-3", 2 * 86400 + 3 * 3600)],
)  # fmt: skip
def test_every_form_reads_as_seconds(value: object, seconds: float) -> None:
    assert parse_duration(value, "f") == seconds


@pytest.mark.parametrize(
    "value", ["", "ten", "10x", "m10", "1.5.2s", "-5", -5, 0, "0", "0s", True, None, [1], "inf",
              float("inf"), float("nan")],
)  # fmt: skip
def test_anything_else_names_the_field_and_the_forms(value: object) -> None:
    with pytest.raises(DurationError) as err:
        parse_duration(value, "--timeout")
    assert str(err.value) == (
        "--timeout: expected a positive duration such as 90s, 10m, 2h, 1h30m, 01:30:00 or plain"
        f" seconds (90), got {value!r}"
    )
    assert isinstance(err.value, ValueError)  # (the CLI's usage errors: exit 2)


def test_zero_only_where_allowed() -> None:
    assert parse_duration("0", "grace", allow_zero=True) == 0.0
    with pytest.raises(DurationError, match=r"^grace: expected a duration >= 0 such as 90s"):
        parse_duration(-1, "grace", allow_zero=True)


def test_seconds_of_is_none_for_what_is_no_duration() -> None:
    assert seconds_of("1h1m1s") == 3661.0
    assert seconds_of(False) is None and seconds_of("1 h") is None and seconds_of(object()) is None


def test_a_time_is_iso_or_a_duration_ago() -> None:
    before = datetime.now(UTC)
    ago = parse_time("10m", "--since")
    assert (
        before - timedelta(minutes=10, seconds=5) < ago <= datetime.now(UTC) - timedelta(minutes=10)
    )
    assert parse_time("90", "--since") <= datetime.now(UTC) - timedelta(seconds=90)
    assert parse_time("2026-01-02T03:04:05+00:00", "--since") == datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=UTC
    )
    # ISO's basic form is a date, not seconds; a time without a zone is local time
    assert parse_time("20260102", "--until").date().isoformat() == "2026-01-02"
    assert parse_time("2026-01-02T03:04", "--until").tzinfo is not None
    with pytest.raises(DurationError, match=r"^--until: expected an ISO 8601 time or a duration"):
        parse_time("yesterday", "--until")
    with pytest.raises(DurationError, match=r"^--since: expected an ISO"):
        parse_time("99999999999d", "--since")  # out of datetime's range


def test_an_app_files_max_silence_is_checked_when_it_is_read(tmp_path: object) -> None:
    from pathlib import Path

    from core.appfile import AppFileError, load_app

    path = Path(str(tmp_path)) / "app.yaml"
    base = "name: a\nroles:\n  - name: r\n    entrypoint: x\nmetadata:\n  max_silence: "
    path.write_text(base + "10m\n")
    assert load_app(str(path)).metadata["max_silence"] == "10m"
    path.write_text(base + "10 minutes\n")
    with pytest.raises(AppFileError) as err:
        load_app(str(path))
    assert str(err.value) == (
        f"{path}:6:3: metadata.max_silence: expected a positive duration such as 90s, 10m, 2h,"
        " 1h30m, 01:30:00 or plain seconds (90), got '10 minutes'"
    )
