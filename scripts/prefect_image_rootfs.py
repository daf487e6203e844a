"""Fills a directory with a root file system that runs Prefect flows (scripts/build_prefect_image.sh).

Copies this interpreter (at the same path), its standard library, the installed distributions
``prefect`` depends on (the closure of its requirements, from this environment's site-packages)
and every shared library they link (as ``ldd`` resolves them here). Run with the interpreter of
the environment to copy from: ``.venv/bin/python scripts/prefect_image_rootfs.py ROOT``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

#: parts of the standard library a flow run does not need
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages"}


def closure(top: str) -> list[object]:
    """The distributions ``top`` needs, itself included (no extras)."""
    seen: dict[str, object] = {}
    todo = [top]
    while todo:
        try:
            dist = distribution(todo.pop())
        except PackageNotFoundError:
            continue
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in seen:
            continue
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def copy(src: Path, root: Path) -> None:
    """Copies ``src`` (a file) to the same path under ``root``."""
    dst = root / src.relative_to("/")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst, follow_symlinks=True)


def linked_libraries(paths: list[Path]) -> set[Path]:
    """The shared libraries that the ELF files among ``paths`` load."""
    libs: set[Path] = set()
    for path in paths:
        if path.suffix != ".so" and ".so." not in path.name and os.access(path, os.X_OK) is False:
            continue
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        for match in re.finditer(r"(/\S+) \(0x", out.stdout):
            libs.add(Path(match.group(1)))
    return libs


def main(root_dir: str) -> None:
    root = Path(root_dir)
    prefix = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"])
    python = Path(os.path.realpath(sys.executable))
    files = [python]
    files += sorted(prefix.glob("lib/libpython3*.so*"))
    for path in stdlib.rglob("*"):
        rel = path.relative_to(stdlib).parts
        if path.is_file() and rel and rel[0] not in STDLIB_SKIP:
            files.append(path)
    site = Path(sysconfig.get_paths()["purelib"])
    target_site = stdlib / "site-packages"
    for dist in closure("prefect"):
        for f in dist.files or []:  # type: ignore[attr-defined]
            src = Path(f.locate()).resolve()
            if src.is_file() and src.is_relative_to(site):
                dst = root / target_site.relative_to("/") / src.relative_to(site)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    for path in files:
        copy(path, root)
    copied = [p for p in root.rglob("*.so*") if p.is_file()] + [root / python.relative_to("/")]
    for lib in linked_libraries(copied) | {Path("/lib64/ld-linux-x86-64.so.2")}:
        if lib.exists() and not (root / lib.relative_to("/")).exists():
            copy(lib, root)
    bindir = root / "usr/local/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        (bindir / name).symlink_to(python)


if __name__ == "__main__":
    main(sys.argv[1])
