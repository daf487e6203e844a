"""Size limits: no function over 80 lines and no module over 800 lines without a reason.

    python scripts/check_sizes.py core airflow_provider prefect_tasks

Checks every ``*.py`` file under the given paths (files or directories). A function (or method)
is measured from its ``def`` line to its last line, docstring included; a module by its line
count. An oversized one passes if it gives a one-line reason at its top:

- a module: a ``# size: <reason>`` comment before its first statement (beside its docstring);
- a function: a ``# size: <reason>`` comment on the line just above its ``def`` (or its first
  decorator), or on the line just below its signature.

Prints each offender as ``path:line: what`` and exits 1 if any lacks a reason (0 otherwise).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterator

MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 800
REASON = "# size:"


def python_files(paths: list[str]) -> Iterator[str]:
    """Every ``*.py`` file under ``paths``, sorted, skipping hidden and cache directories."""
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))


def _has_reason(lines: list[str], lineno: int) -> bool:
    """True if 1-based line ``lineno`` exists and is a ``# size:`` comment."""
    return 1 <= lineno <= len(lines) and lines[lineno - 1].strip().startswith(REASON)


def _module_reason(tree: ast.Module, lines: list[str]) -> bool:
    """True if a ``# size:`` comment comes before the module's first statement (after its
    docstring, if it has one)."""
    body = tree.body
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        first = body[1] if len(body) > 1 else None
    end = first.lineno - 1 if first is not None else len(lines)
    return any(line.strip().startswith(REASON) for line in lines[:end])


def _function_reason(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> bool:
    """True if a ``# size:`` comment is just above the function (or its decorators) or just
    below its signature."""
    top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return _has_reason(lines, top - 1) or _has_reason(lines, node.body[0].lineno - 1)


def check_file(path: str) -> list[tuple[str, bool]]:
    """The oversized module and functions of ``path``: ``(message, has_reason)`` each."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    tree = ast.parse(source, filename=path)
    found: list[tuple[str, bool]] = []
    if len(lines) > MAX_MODULE_LINES:
        found.append(
            (
                f"{path}:1: module of {len(lines)} lines (> {MAX_MODULE_LINES})",
                _module_reason(tree, lines),
            )
        )
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > MAX_FUNCTION_LINES:
                found.append(
                    (
                        f"{path}:{node.lineno}: function {node.name} of {size} lines"
                        f" (> {MAX_FUNCTION_LINES})",
                        _function_reason(node, lines),
                    )
                )
    return found


def main(argv: list[str] | None = None) -> int:
    """Checks the paths of ``argv``; returns 1 if an oversized module or function gives no
    reason."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="files or directories to check")
    args = parser.parse_args(argv)
    failed = 0
    for path in python_files(args.paths):
        for message, has_reason in check_file(path):
            print(f"{message}{' (reason given)' if has_reason else ''}")
            failed += not has_reason
    if failed:
        print(
            f"{failed} oversized without a reason: split them, or put a one-line"
            f" '{REASON} <reason>' at their top"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
