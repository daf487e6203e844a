"""scripts/check_sizes.py: oversized functions and modules fail unless a reason is given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "check_sizes.py"


def _function(name: str, lines: int, reason: str = "") -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 1))
    return f"{reason}def {name}():\n{body}\n"


def _check(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True, text=True
    )


def test_small_code_passes(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(_function("f", 80))
    out = _check(tmp_path)
    assert out.returncode == 0, out.stdout
    assert out.stdout == ""


def test_long_function_fails_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import os\n\n" + _function("too_long", 81))
    out = _check(tmp_path)
    assert out.returncode == 1
    assert f"{tmp_path / 'pkg' / 'm.py'}:3: function too_long of 81 lines" in out.stdout


def test_reason_above_or_below_the_signature_passes(tmp_path: Path) -> None:
    above = _function("a", 90, reason="# size: one table of cases, clearer whole\n")
    below = _function("b", 90).replace("():\n", "():\n    # size: a generated dispatch\n", 1)
    (tmp_path / "m.py").write_text(above + below)
    out = _check(tmp_path / "m.py")
    assert out.returncode == 0, out.stdout
    assert out.stdout.count("(reason given)") == 2


def test_long_module_needs_a_reason_at_its_top(tmp_path: Path) -> None:
    body = "".join(f"x{i} = {i}\n" for i in range(801))
    (tmp_path / "long.py").write_text('"""Doc."""\n' + body)
    assert _check(tmp_path).returncode == 1
    (tmp_path / "long.py").write_text('"""Doc."""\n\n# size: the generated table\n' + body)
    out = _check(tmp_path)
    assert out.returncode == 0, out.stdout
    assert "module of 804 lines (> 800) (reason given)" in out.stdout
